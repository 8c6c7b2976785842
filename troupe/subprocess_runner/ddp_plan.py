"""The plan of a worker run's DDP ranks: what every rank needs to meet the others.

It lives apart from ``ddp`` (which spawns the ranks and runs a rank's part of the graph
through the engine) because every ``ExecutionContext`` carries one: the context must not
import the code that executes graphs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DdpPlan:
    """What every rank needs to meet the others and rebuild the loop's inputs."""

    world: int
    cuda: bool
    graph: dict[str, Any]  # the run's graph, its file references already translated
    run_id: str
    run_dir: str
    seed: int | None
    deterministic: bool
    shuffle_seed: int  # the same for every rank: their shards do not overlap
    rank: int = 0
    store: str | None = None  # the FileStore's file, set by rank 0 for the others
