"""The JSON files a command is given (a graph, a sweep's or a study's body): whatever a
file holds, a command says what is wrong with it in one line, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cli.errors import CliError


def read_json_object(path: str, what: str) -> dict[str, Any]:
    """The object the file holds; ``what`` names it in the error ("a graph object")."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise CliError(f"{path} is not UTF-8 text (byte {exc.start}): is it the JSON file you meant?") from None
    try:
        found = json.loads(text)
    except ValueError as exc:
        raise CliError(f"{path} is not JSON: {exc}") from None
    except RecursionError:
        raise CliError(f"{path} is JSON nested too deep to read") from None
    if not isinstance(found, dict):
        raise CliError(f"{path} must hold {what}")
    return found
