"""What a node sees while it executes: its run, its device, its seed, where its events
go and whether the run was asked to stop.

``ExecutionContext``, ``derive_seed`` and ``current_node_id`` are imported by exported
scripts (DESIGN invariant 2): their signatures only grow.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from troupe.subprocess_runner.digest import file_sha256
from troupe.subprocess_runner.errors import RunCancelled
from troupe.subprocess_runner.node_scope import current_node_id

# current_node_id lives in node_scope; exported scripts import it from here, as they always did.
__all__ = ["ExecutionContext", "Sinks", "current_node_id", "derive_seed"]

if TYPE_CHECKING:
    from troupe.subprocess_runner.artifacts import Shipper
    from troupe.subprocess_runner.console import Console
    from troupe.subprocess_runner.ddp_plan import DdpPlan

# emit(type, node_id, payload): where a node's events go; the control plane turns them
# into persisted events, ``troupe exec`` prints them.
Emit = Callable[[str, str | None, dict[str, Any]], None]

SEED_MODULUS = 2**32


def derive_seed(seed: int, node_id: str) -> int:
    """A node's own seed, stable across processes and Python versions (no ``hash()``)."""
    digest = hashlib.sha256(f"{seed}:{node_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % SEED_MODULUS


def _print_event(kind: str, node_id: str | None, payload: dict[str, Any]) -> None:
    """The sink of a context made without one (an exported script): JSON lines."""
    print(json.dumps({"type": kind, "node_id": node_id, "payload": payload}, default=str), flush=True)


class Sinks:
    """Run-scoped event sinks, shared by every node of one run: ``emit`` plus the step
    counters of each metric series (steps accumulate across calls and nodes)."""

    def __init__(self, emit: Emit, artifacts: Shipper | None = None, console: Console | None = None) -> None:
        self.emit = emit
        # Where the run's nodes' stdout and stderr go (troupe.subprocess_runner.console); None:
        # they write where the process writes.
        self.console = console
        # Stores the run's artifacts where they belong before announcing them; None: an
        # artifact is announced where it was written (an exported script).
        self.artifacts = artifacts
        self._steps: dict[str, int] = {}
        self._lock = threading.Lock()
        # Told each metric point a node logs (node id, series, step, value): a node that
        # keeps its best checkpoint by a series hears it (checkpoint_bounds).
        self.metric_listeners: list[Callable[[str | None, str, int, float], None]] = []

    def next_step(self, series: str) -> int:
        with self._lock:
            self._steps[series] = self._steps.get(series, 0) + 1
            return self._steps[series]


@dataclass(frozen=True)
class NodeLimits:
    """What the machine that runs a graph imposes on the processes a node starts (a
    command node's program): they are not this process, so a cap set here does not reach
    them, and the node applies these itself."""

    kill_grace_s: float = 5.0  # from SIGTERM to SIGKILL of a stopped node's process group
    memory_budget_mib: int | None = None  # the run's budget on each of its shared cards
    # The folders a node may read a file from (``mounts.confine``'s roots), checked again
    # as the file is opened; None: any (``troupe exec``, its owner's own command).
    readable: tuple[str, ...] | None = None


class ExecutionContext:
    """Passed to every ``execute(ctx, inputs, params)``."""

    def __init__(
        self,
        run_id: str,
        node_id: str | None,
        device: str,
        seed: int | None,
        sinks: Sinks | None = None,
        cancel: threading.Event | None = None,
        *,
        deterministic: bool = False,
        run_dir: Path | None = None,
        threads: int | None = None,
        provenance: str | None = None,
        ddp: DdpPlan | None = None,
        resume: Mapping[str, Mapping[str, str]] | None = None,
        limits: NodeLimits | None = None,
    ) -> None:
        self.run_id = run_id
        self.node_id = node_id
        self.device = device
        self.seed = seed
        self.sinks = sinks if sinks is not None else Sinks(_print_event)
        self.cancel = cancel or threading.Event()
        self.deterministic = deterministic
        # Where a node writes files of its own (checkpoints); None: a temp dir on demand.
        self.run_dir = run_dir
        # The node's thread cap (its declared cpus, else its share of the process cap);
        # numeric libraries size their pools to it. None: the process cap.
        self.threads = threads
        # ``identity`` or ``content``: what a node that reads a dataset or weights records.
        self.provenance = provenance
        # A worker run's DDP plan (two or more cards): a loop with strategy ddp trains
        # as this rank of the run's group. None everywhere else.
        self.ddp = ddp
        # A resumed run: node id -> {"weights", "state"}, the files of the checkpoint each
        # TrainingLoop continues from. None for a run that starts from the beginning.
        self.resume = resume
        self.limits = limits if limits is not None else NodeLimits()

    @property
    def node_seed(self) -> int | None:
        if self.seed is None or self.node_id is None:
            return None
        return derive_seed(self.seed, self.node_id)

    def for_node(self, node_id: str, threads: int | None = None) -> ExecutionContext:
        return ExecutionContext(
            self.run_id, node_id, self.device, self.seed, self.sinks, self.cancel,
            deterministic=self.deterministic, run_dir=self.run_dir, threads=threads, provenance=self.provenance,
            ddp=self.ddp, resume=self.resume, limits=self.limits,
        )

    def resume_point(self) -> Mapping[str, str] | None:
        """The checkpoint this node continues from (``weights``, ``state`` paths), if any."""
        return (self.resume or {}).get(self.node_id or "")

    def reading(self, kind: str, path: Path) -> Path:
        """A node reads ``path`` (``dataset``, ``checkpoint``); answers the path to open.
        It was checked at submission, but a link in it may have been swapped since (a run
        waits in its queue): where the run's folders are bounded, the path is resolved
        now and the file it leads to must still lie inside them, and that file, not the
        link, is what the node opens. With provenance on, what it read is recorded now,
        by identity (size, mtime) or by content (sha256)."""
        if self.limits.readable is not None:
            real = path.resolve()
            if not any(real.is_relative_to(Path(root).resolve()) for root in self.limits.readable):
                raise PermissionError(f"{path} now leads outside the folders runs may read (a link in it changed "
                                      "after the run was submitted)")
            path = real
        if self.provenance is None:
            return path
        stat = path.stat()
        record: dict[str, Any] = {"kind": kind, "ref": str(path), "size": stat.st_size, "mode": self.provenance}
        if self.provenance == "content":
            record["sha256"] = file_sha256(path)
        else:
            record["mtime"] = stat.st_mtime
        self.sinks.emit("provenance", self.node_id, record)
        return path

    def files(self, kind: str) -> Path:
        """A folder of this run for files of ``kind`` (``checkpoints``), created."""
        if self.run_dir is None:
            self.run_dir = Path(tempfile.mkdtemp(prefix=f"troupe-{self.run_id[:8]}-"))
        folder = self.run_dir / kind
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def artifact(self, kind: str, path: Path | str) -> None:
        """Announces a file the run wrote, so the control plane lists it on the run once
        it is stored (hashed, and sent on from a worker), off this node's thread."""
        if self.sinks.artifacts is not None:
            self.sinks.artifacts.submit(self.node_id, kind, Path(path))
        else:
            self.sinks.emit("artifact", self.node_id, {"kind": kind, "path": str(path)})

    def remove_artifact(self, kind: str, path: Path | str) -> None:
        """Lets go of a file announced before (a checkpoint past its node's bounds): it
        leaves the run's folder and wherever it was stored, after its store finished."""
        if self.sinks.artifacts is not None:
            self.sinks.artifacts.submit(self.node_id, kind, Path(path), remove=True)
        else:
            Path(path).unlink(missing_ok=True)
            self.sinks.emit("artifact_removed", self.node_id, {"kind": kind, "path": str(path)})

    @property
    def cancelled(self) -> bool:
        return self.cancel.is_set()

    def check_cancelled(self) -> None:
        """Long-running node code calls this between steps."""
        if self.cancel.is_set():
            raise RunCancelled("the run was cancelled")

    def sleep(self, seconds: float) -> None:
        """Waits, waking as soon as the run is cancelled."""
        if self.cancel.wait(timeout=max(0.0, float(seconds))):
            raise RunCancelled("the run was cancelled")

    def log(self, message: str) -> None:
        self.sinks.emit("log", self.node_id, {"message": str(message)})

    def warning(self, message: str, code: str | None = None) -> None:
        payload: dict[str, Any] = {"message": str(message)}
        if code is not None:
            payload["code"] = code
        self.sinks.emit("warning", self.node_id, payload)

    def metric(self, name: str, value: float, step: int | None = None, **extra: Any) -> None:
        if step is None:
            step = self.sinks.next_step(name)
        self.sinks.emit("metric", self.node_id, {"name": name, "step": step, "value": float(value), **extra})
        for listener in self.sinks.metric_listeners:
            listener(self.node_id, name, step, float(value))
