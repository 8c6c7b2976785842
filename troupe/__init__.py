"""troupe's public package: what a user's own code imports. ``metric``, ``progress`` and
``result`` print the lines a ``script.Command`` run reads (docs/scripts.md), for a
script that prefers a call to a ``print(json.dumps(...))``; outside troupe they print
the same lines and do nothing else."""

from __future__ import annotations

import json
import sys
from typing import Any

__all__ = ["metric", "progress", "result"]


def _say(line: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()  # a line goes up as it happens, not when a buffer fills


def metric(name: str, value: float, step: int | None = None) -> None:
    """One point of series ``name`` (``step``: the next one when left out)."""
    line: dict[str, Any] = {"metric": name, "value": float(value)}
    if step is not None:
        line["step"] = int(step)
    _say(line)


def progress(done: int, total: int) -> None:
    """How far the script is: the run's progress and time left."""
    _say({"progress": int(done), "total": int(total)})


def result(value: Any) -> None:
    """The node's ``result`` output (the last call wins): a later node takes it."""
    _say({"result": value})
