"""troupe's public package: what a user's own code imports. ``node`` makes a typed
function a node type of the pack its file is (docs/packs.md). ``metric``, ``progress`` and
``result`` print the lines a ``script.Command`` run reads (docs/scripts.md), for a
script that prefers a call to a ``print(json.dumps(...))``; outside troupe they print
the same lines and do nothing else. ``cap_memory`` holds torch's allocator to the run's
memory budget on a shared card."""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from troupe.client import (
        ApiError,
        Client,
        NotFound,
        QuotaExceeded,
        Refused,
        Run,
        Study,
        Sweep,
        Timeout,
        TroupeError,
        Unavailable,
        Unreachable,
    )
    from troupe.nodes import node

__all__ = ["ApiError", "Client", "NotFound", "QuotaExceeded", "Refused", "Run", "Study", "Sweep", "Timeout",
           "TroupeError", "Unavailable", "Unreachable", "cap_memory", "metric", "node", "progress", "result"]
_CLIENT = frozenset(__all__[:12])


def __getattr__(name: str) -> Any:
    """What is heavier than the run helpers loads on first use: every part of troupe (the
    control plane, an agent's run child) imports this package first, and must not pay
    for the client's HTTP library or the node decorator's catalog types."""
    if name == "node":
        from troupe.nodes import node

        return node
    if name in _CLIENT:
        import troupe.client

        return getattr(troupe.client, name)
    raise AttributeError(f"module 'troupe' has no attribute {name!r}")


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


def cap_memory() -> int | None:
    """Caps torch's CUDA allocator on each visible card at the run's memory budget
    (``TROUPE_MEMORY_BUDGET_MIB``, set on a shared card), so that going past it is torch's
    own out-of-memory error rather than the group being stopped from outside. Returns the
    budget in MiB, or None where there is none or no CUDA."""
    budget = os.environ.get("TROUPE_MEMORY_BUDGET_MIB")
    if not budget:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    for ordinal in range(torch.cuda.device_count()):
        total = torch.cuda.get_device_properties(ordinal).total_memory / 2**20
        torch.cuda.set_per_process_memory_fraction(min(1.0, int(budget) / total), ordinal)
    return int(budget)
