"""The JSON files a command is given (a graph, a sweep's or a study's body): whatever a
file holds, a command says what is wrong with it in one line, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from troupe.cli.errors import CliError
from troupe.protocol.jsonsafe import MAX_DEPTH


def read_json_object(path: str, what: str) -> dict[str, Any]:
    """The object the file holds; ``what`` names it in the error ("a graph object")."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise CliError(f"{path} is not UTF-8 text (byte {exc.start}): is it the JSON file you meant?") from None
    try:
        found = json.loads(text, parse_constant=_not_json)
    except ValueError as exc:
        raise CliError(f"{path} is not JSON: {exc}") from None
    except RecursionError:
        raise CliError(f"{path} is JSON nested too deep to read") from None
    if not isinstance(found, dict):
        raise CliError(f"{path} must hold {what}")
    if _depth(found) > MAX_DEPTH:
        raise CliError(f"{path} is nested deeper than {MAX_DEPTH} levels, which no graph needs (the server refuses "
                       "it too)")
    return found


def _not_json(token: str) -> Any:
    # Python's json reads NaN and Infinity; JSON has none, and the server refuses them.
    raise ValueError(f"{token} is not a JSON number")


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return deepest
