"""The in-process executor: the thread that walks one run's graph.

The RunActor hands an ``Execute`` to ``start``, which runs the whole graph on a thread of
the control plane's executor pool (nodes that can run side by side go to the node pool;
a graph of a few quick nodes is walked at once, on the loop)
and hands every event to the RunActor, in order, through a ``_Courier``: events that pile
up while the loop is busy travel together, so a burst of events costs one wake-up of the
loop rather than one each. The cancel token is a ``threading.Event`` the RunActor sets;
node code polls it.

Why a pool and not a thread (or a thread actor) per run: starting a thread blocks the
event loop until the thread runs, and a trivial run paid more for its thread than for
its nodes. A pool thread is reused by the next run; an executor owns no state beyond
its one graph walk, so it needs no mailbox of its own.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from troupe.actors.base import ActorRef
from troupe.subprocess_runner.artifacts import Destination, Shipper
from troupe.subprocess_runner.console import Console
from troupe.subprocess_runner.context import ExecutionContext, NodeLimits, Sinks
from troupe.subprocess_runner.devices import parse_device
from troupe.subprocess_runner.engine import CpuGate, ExecutableGraph, Outcome, execute_graph
from troupe.subprocess_runner.memory import is_out_of_memory, peak_mib
from troupe.subprocess_runner.node_cache import SessionCache

log = logging.getLogger("troupe.executor")


@dataclass(frozen=True)
class Execute:
    graph: ExecutableGraph
    run_id: str
    device: str
    seed: int | None
    deterministic: bool
    max_parallel: int
    cancel: threading.Event
    # The control plane's node pool, shared by its in-process runs so that a run does
    # not pay for threads of its own; the engine caps each run at max_parallel.
    pool: Executor | None = None
    run_dir: Path | None = None
    cpu_gate: CpuGate | None = None
    # The editor session's node cache: interactive runs of an editor only.
    cache: SessionCache | None = None
    provenance: str | None = None  # ``identity`` or ``content``: files read are recorded
    # A resumed run: node id -> {"weights", "state"} paths of the checkpoint it continues from.
    resume: Mapping[str, Mapping[str, str]] | None = None
    console_cap_bytes: int = 0  # the run's console output kept; 0 or less: no cap
    limits: NodeLimits = field(default_factory=NodeLimits)  # what a node that starts processes honours


# NodeEvents and GraphEnded are received by the RunActor but live here, beside their
# only sender: run.py imports this module to start executors, so the other way round
# would be an import cycle.


@dataclass(frozen=True)
class NodeEvent:
    """An event produced by node code, not yet numbered."""

    type: str
    node_id: str | None
    payload: dict[str, Any]


@dataclass(frozen=True)
class NodeEvents:
    """Node events in the order they happened (sent to the RunActor). ``settled``: to
    be called with their count once the store has them, which lets their producer on
    (see ``_Courier``)."""

    events: tuple[NodeEvent, ...]
    settled: Callable[[int], None] | None = None


@dataclass(frozen=True)
class GraphEnded:
    """The graph stopped executing (sent to the RunActor after its last NodeEvent)."""

    outcome: Outcome


# The most events of one run emitted and not yet stored. A node that produces faster
# than the store writes (a Ticker at interval 0 made 4 million points) then waits in
# ``emit``: the server's memory stays bounded, nothing is dropped, the loop keeps up.
MAX_UNSETTLED_EVENTS = 20_000


class _Courier:
    """Carries messages from the executor's threads to the run's mailbox, in order, and
    holds a producing thread back while ``MAX_UNSETTLED_EVENTS`` of its run's events are
    on their way to the store."""

    def __init__(self, loop: asyncio.AbstractEventLoop, run: ActorRef, cancel: threading.Event) -> None:
        self._loop = loop
        self._run = run
        self._cancel = cancel
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._events: list[NodeEvent] = []
        self._unsettled = 0

    def emit(self, kind: str, node_id: str | None, payload: dict[str, Any]) -> None:
        with self._lock:
            # Never on the loop's own thread (a graph walked at once is a few quick nodes:
            # the loop is what settles them), nor for a run whose actor is gone (nothing
            # settles its events any more), nor once the run is cancelled (a run held by a
            # full disk, whose events settle only once there is room, still stops).
            while self._unsettled >= MAX_UNSETTLED_EVENTS and self._run.is_alive and not self._cancel.is_set() \
                    and not self._on_loop():
                self._room.wait(0.5)
            self._events.append(NodeEvent(kind, node_id, payload))
            self._unsettled += 1
            first = len(self._events) == 1
        if first:
            self._loop.call_soon_threadsafe(self._deliver)

    def settled(self, count: int) -> None:
        """``count`` events reached the store (or will not: a run's end lets all go)."""
        with self._lock:
            self._unsettled -= count
            self._room.notify_all()

    def _on_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def _deliver(self) -> None:
        with self._lock:
            events, self._events = self._events, []
        if events:
            self._run.tell(NodeEvents(tuple(events), self.settled))

    def finish(self, outcome: Outcome) -> None:
        # After the last events: _deliver runs first, as call_soon_threadsafe keeps order.
        self._loop.call_soon_threadsafe(self._deliver)
        self._loop.call_soon_threadsafe(self._run.tell, GraphEnded(outcome))


# A graph of at most this many quick nodes (``NodeType.quick``: done in microseconds,
# never waiting) that declare no cpus is walked at once, on the loop, while its run
# handles its start: handing it to a pool thread and its events back to the loop costs
# two thread wake-ups, about 100 us of CPU each on a VM, far more than the walk. A hello
# run drained 645 -> 766 runs/s. Its events and its end are handed back to the run in
# that same turn (``Walked``), not through its mailbox: the run's start, its events and
# its end are then one write to the store, one commit, and one batch for the hub.
QUICK_GRAPH_MAX_NODES = 32


@dataclass(frozen=True)
class Walked:
    """A graph walked at once: its events in the order they happened, and its end."""

    events: tuple[NodeEvent, ...]
    outcome: Outcome


class _Carrier(Protocol):
    def emit(self, kind: str, node_id: str | None, payload: dict[str, Any]) -> None: ...

    def finish(self, outcome: Outcome) -> None: ...


class _Gathered:
    """What a walk on the loop produced, kept for the run that started it."""

    def __init__(self) -> None:
        self.events: list[NodeEvent] = []
        self.outcome = Outcome("failed", "the engine did not end the run")

    def emit(self, kind: str, node_id: str | None, payload: dict[str, Any]) -> None:
        self.events.append(NodeEvent(kind, node_id, payload))

    def finish(self, outcome: Outcome) -> None:
        self.outcome = outcome


def start(pool: Executor, message: Execute, loop: asyncio.AbstractEventLoop, run: ActorRef) -> Walked | None:
    """Executes ``message`` on a thread of ``pool``, whose events and end reach ``run``
    after the message it is handling; or, a graph of a few quick nodes, at once: what it
    produced is returned."""
    if _walks_at_once(message.graph):
        gathered = _Gathered()
        _execute(message, gathered)
        return Walked(tuple(gathered.events), gathered.outcome)
    pool.submit(_execute, message, _Courier(loop, run, message.cancel))
    return None


def _walks_at_once(graph: ExecutableGraph) -> bool:
    nodes = graph.nodes.values()
    return len(nodes) <= QUICK_GRAPH_MAX_NODES and all(node.node_type.quick and node.cpus is None for node in nodes)


def _execute(message: Execute, courier: _Carrier) -> None:
    shipper = Shipper(message.run_id, message.run_dir, Destination("local"), courier.emit) \
        if message.run_dir is not None else None
    console = Console(courier.emit, message.console_cap_bytes)
    ctx = ExecutionContext(
        message.run_id, None, message.device, message.seed, Sinks(courier.emit, shipper, console), message.cancel,
        deterministic=message.deterministic, run_dir=message.run_dir, provenance=message.provenance,
        resume=message.resume, limits=message.limits,
    )
    try:
        outcome = execute_graph(
            message.graph, ctx, max_parallel=message.max_parallel, deterministic=message.deterministic,
            pool=message.pool, cpu_gate=message.cpu_gate, cache=message.cache,
        )
    except BaseException as exc:  # node trouble (even sys.exit) fails its run, never the pool's thread
        log.exception("run %s: the engine failed", message.run_id)
        outcome = Outcome("failed", f"internal error in the engine: {type(exc).__name__}: {exc}")
    console.close()  # what the run printed last goes before its end
    if shipper is not None:
        shipper.close()  # every artifact hashed and announced before the run ends
    # The server's runs share its process: their peak is the process's, not exact.
    ordinal = parse_device(message.device)
    outcome.peak_memory_mib = peak_mib((ordinal[1] or 0,) if ordinal and ordinal[0] == "cuda" else ())
    outcome.out_of_memory = is_out_of_memory(outcome.error)
    courier.finish(outcome)
