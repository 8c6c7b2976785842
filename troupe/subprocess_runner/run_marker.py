"""The mark a run's processes carry, and how what carries it is stopped.

A command node's processes get ``TROUPE_RUN_ID`` in their environment. A process that
leaves the run's group (``setsid``, a daemon's double fork) still carries it, and so
does every process of a run whose server was killed before it could stop them: both are
found by the mark (Linux's /proc; elsewhere only the group is stopped) and stopped as
the group is, SIGTERM then SIGKILL after the grace."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

RUN_ID_VAR = "TROUPE_RUN_ID"
_POLL_S = 0.1


def stop_carrying(run_ids: Iterable[str], grace_s: float) -> list[int]:
    """Stops the processes (this one never) that carry the mark of any of ``run_ids``,
    found in one pass over /proc; returns their pids."""
    markers = {f"{RUN_ID_VAR}={run_id}".encode() for run_id in run_ids}
    found = [pid for pid in _carrying(markers) if pid != os.getpid()] if markers else []
    escaped = found
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in escaped:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while escaped and time.monotonic() < deadline:
            escaped = [pid for pid in escaped if _alive(pid)]
            if escaped:
                time.sleep(_POLL_S)
        if not escaped:
            break
    return found


def _carrying(markers: set[bytes]) -> list[int]:
    found = []
    for entry in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError, ValueError):
            if not markers.isdisjoint(entry.read_bytes().split(b"\0")):
                found.append(int(entry.parent.name))
    return found


def _alive(pid: int) -> bool:
    """Running, not a zombie left for its parent to reap."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] != b"Z"
    except (OSError, IndexError):
        return False
