"""Where a worker run's files live: a folder of its own under the temporary folder, named
for the run (or, for a forked child waiting for its run, for that child). The child
removes its folder when its run ends; one that died leaves it, and the agent, which knows
the names, removes it then: nothing grows without bound on a worker."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

POOL_PREFIX = "troupe-run-pool-"


def run_dir_prefix(run_id: str) -> str:
    """A run's folder's name starts with its whole id: never another run's."""
    return f"troupe-run-{run_id}-"


def pool_dir_prefix(pid: int) -> str:
    """A forked child's folder while it waits names the child."""
    return f"{POOL_PREFIX}{pid}-"


def remove_left(prefix: str) -> None:
    """Removes the folders under the temporary folder whose names start with ``prefix``."""
    for folder in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        shutil.rmtree(folder, ignore_errors=True)
