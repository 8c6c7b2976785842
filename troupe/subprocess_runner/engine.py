"""Executes a validated graph: topological order, up to N independent nodes at once,
cooperative cancellation, and the node-level events of DESIGN section 4.

``topological_sort``, ``prepare_executable_graph`` and ``invoke_node`` are imported by
exported scripts (DESIGN invariant 2); their signatures only grow.
"""

from __future__ import annotations

import functools
import logging
import math
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Protocol

from troupe.protocol import events as ev
from troupe.protocol.graph import Graph
from troupe.subprocess_runner.catalog import Catalog
from troupe.subprocess_runner.console import routed
from troupe.subprocess_runner.context import ExecutionContext, derive_seed
from troupe.subprocess_runner.errors import RunCancelled
from troupe.subprocess_runner.executable import ExecutableGraph, ExecutableNode
from troupe.subprocess_runner.node_cache import SessionCache, graph_keys, private_copy
from troupe.subprocess_runner.node_scope import running_node
from troupe.subprocess_runner.seeding import node_threads, seed_everything
from troupe.subprocess_runner.validation import validate_graph

log = logging.getLogger("troupe.engine")


class CpuGate(Protocol):
    """Lends cpus to declared nodes (the control plane's CPU ledger). ``claim`` does not
    block: its future resolves once the cpus are the node's (after ``on_wait(reason)``
    if it has to wait), or raises when they can never be. ``release`` gives back the
    cpus, or the place in line of a claim still waiting."""

    def claim(self, ctx: ExecutionContext, cpus: int, on_wait: Callable[[str], None]) -> Future[bool]: ...

    def release(self, ctx: ExecutionContext) -> None: ...


@dataclass
class Outcome:
    """How a graph ended: ``succeeded``, ``failed`` or ``cancelled``."""

    status: str
    error: str | None = None
    node_id: str | None = None
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The most memory the run used (see ``memory.peak_mib``) and whether it ran out.
    peak_memory_mib: int | None = None
    out_of_memory: bool = False


_POLL_S = 0.05  # how often an executor with claims waiting looks at its run's cancel token


class _Ran(Future[dict[str, Any]]):
    """The outcome of a node run in the walking thread: done when made, so it needs none
    of a ``Future``'s condition and lock (made, locked and read three times for each
    node of a quick graph walked on the loop). Never handed to ``wait``: the walk looks
    at ``done`` first."""

    def __init__(self, result: dict[str, Any] | None, error: BaseException | None) -> None:
        self._result, self._exception = result, error

    def done(self) -> bool:
        return True

    def result(self, timeout: float | None = None) -> dict[str, Any]:
        if self._exception is not None:
            raise self._exception
        assert self._result is not None
        return self._result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._exception

    def __repr__(self) -> str:  # Future's own reads the state this one never set
        return f"<_Ran {'raised ' + type(self._exception).__name__ if self._exception else 'finished'}>"


def _queued(emit: Any, node_id: str, cpus: int, reason: str) -> None:
    emit(ev.NODE_QUEUED, node_id, {"cpus": cpus, "reason": reason})


def topological_sort(graph: Graph | dict[str, Any]) -> list[str]:
    """Node ids in an order where every edge points forward; ties keep document order.
    Raises ``ValueError`` on a cycle (validation reports cycles with a pointer first)."""
    if not isinstance(graph, Graph):
        graph = Graph.model_validate(graph)
    position = {node.id: i for i, node in enumerate(graph.nodes)}
    indegree = dict.fromkeys(position, 0)
    children: dict[str, list[str]] = {n: [] for n in position}
    for edge in graph.edges:
        indegree[edge.target] += 1
        children[edge.source].append(edge.target)
    ready = sorted((n for n, d in indegree.items() if d == 0), key=position.__getitem__)
    order: list[str] = []
    while ready:
        current = ready.pop(0)
        order.append(current)
        for child in children[current]:
            indegree[child] -= 1
            if indegree[child] == 0:
                ready.append(child)
                ready.sort(key=position.__getitem__)
    if len(order) != len(position):
        raise ValueError("the graph has a cycle")
    return order


def prepare_executable_graph(
    graph: Graph | dict[str, Any], catalog: Catalog | None = None, prefix: str = "/graph"
) -> ExecutableGraph:
    """Validates ``graph`` (a document or its parsed model) against ``catalog`` (default:
    every installed pack) and binds each node to its type."""
    if not isinstance(graph, Graph):
        graph = Graph.model_validate(graph)
    if catalog is None:
        from troupe.subprocess_runner.catalog import load_catalog

        catalog = load_catalog()
    params = validate_graph(graph, catalog, prefix)
    sources: dict[str, dict[str, tuple[str, str]]] = {n.id: {} for n in graph.nodes}
    children: dict[str, list[str]] = {n.id: [] for n in graph.nodes}
    for edge in graph.edges:
        sources[edge.target][edge.target_port] = (edge.source, edge.source_port)
        if edge.target not in children[edge.source]:
            children[edge.source].append(edge.target)
    nodes = {}
    for node in graph.nodes:
        node_type = catalog.get(node.type)
        assert node_type is not None  # validated above
        cpus = node.resources.cpus if node.resources is not None else None
        nodes[node.id] = ExecutableNode(node.id, node_type, params[node.id], sources[node.id], cpus)
    return ExecutableGraph(
        nodes=nodes,
        order=tuple(topological_sort(graph)),
        children={k: tuple(v) for k, v in children.items()},
    )


def invoke_node(
    node: ExecutableNode, ctx: ExecutionContext, inputs: dict[str, Any], deterministic: bool = False
) -> dict[str, Any]:
    """Runs one node's ``execute`` with ``ctx`` bound to it; seeds first when the run is
    seeded, so the same seed gives the same node results whatever ran before."""
    token = running_node.set(node.id)
    try:
        if ctx.seed is not None:
            seed_everything(derive_seed(ctx.seed, node.id), deterministic)
        # A copy: one executable graph may serve several runs (the submission cache).
        result = node.node_type.execute(ctx, inputs, dict(node.params))
        return dict(result or {})
    finally:
        running_node.reset(token)


_SUMMARY_DEPTH = 32  # lists and dicts nested deeper are shown by a short repr


def summarize(value: Any, _depth: int = 0) -> Any:
    """A JSON-safe view of an output for events and recorded outputs: plain values as
    they are; objects that describe themselves (``summary()``), torch tensors and
    models by their description; anything else by type and a short repr. Containers
    past ``_SUMMARY_DEPTH`` levels too: an output nested a thousand deep (a script's
    ``result``) must not fail its node in the recursion that describes it."""
    if value is None or isinstance(value, bool | int | str):
        return value
    describe = getattr(value, "summary", None)
    if callable(describe) and not isinstance(value, type):
        try:
            return describe()
        except Exception as exc:  # a broken summary must not fail the node
            return {"type": type(value).__name__, "summary_error": str(exc)}
    if type(value).__module__.startswith("torch") and "torch" in sys.modules:
        from troupe.subprocess_runner.packs._torch_runtime import describe_model, describe_tensor

        torch = sys.modules["torch"]
        if isinstance(value, torch.Tensor):
            return describe_tensor(value)
        if isinstance(value, torch.nn.Module):
            return describe_model(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if _depth < _SUMMARY_DEPTH:
        if isinstance(value, list | tuple) and len(value) <= 64:
            return [summarize(v, _depth + 1) for v in value]
        if isinstance(value, dict) and len(value) <= 64 and all(isinstance(k, str) for k in value):
            return {k: summarize(v, _depth + 1) for k, v in value.items()}
    try:
        shown = repr(value)[:200]
    except Exception as exc:  # nested too deep for repr, or a repr of its own that fails
        shown = f"a {type(value).__name__} that cannot be shown ({type(exc).__name__})"
    return {"type": type(value).__name__, "repr": shown}


def execute_graph(
    graph: ExecutableGraph,
    ctx: ExecutionContext,
    *,
    max_parallel: int = 4,
    deterministic: bool = False,
    pool: Executor | None = None,
    cpu_gate: CpuGate | None = None,
    cache: SessionCache | None = None,
) -> Outcome:
    """Executes every node, emitting node events through ``ctx.sinks``. A seeded run
    executes one node at a time, so its random streams do not interleave.

    Nodes run on ``pool`` when one is given (the engine still runs at most
    ``max_parallel`` of them at once), else on a pool of this run's own. A node that
    declares cpus holds them from ``cpu_gate`` while it executes; without a gate the
    declaration is not accounted.

    With ``cache`` (an editor session's), a node whose key is cached is not executed:
    it gets ``node_started`` and ``node_finished`` with ``cached: true`` and the cached
    outputs; every node that succeeds stores its outputs."""
    walk = _Walk(graph, ctx, 1 if ctx.seed is not None else max_parallel, deterministic, pool, cpu_gate, cache)
    try:
        walk.run()
    finally:
        if walk.claiming or walk.granted:
            walk.give_up_claims()
        if walk.own_pool is not None:
            walk.own_pool.shutdown(wait=True)
    if walk.failure is not None:
        walk.failure.outputs = walk.outputs
        return walk.failure
    if ctx.cancelled:
        return Outcome("cancelled", "cancelled", outputs=walk.outputs)
    return Outcome("succeeded", outputs=walk.outputs)


class _Walk:
    """One execution of a graph: the nodes ready, running, claiming cpus and holding
    them, and the first failure. Driven by one thread (the run's); nodes run in the pool."""

    def __init__(self, graph: ExecutableGraph, ctx: ExecutionContext, max_parallel: int, deterministic: bool,
                 pool: Executor | None, cpu_gate: CpuGate | None, cache: SessionCache | None) -> None:
        self.graph, self.ctx, self.max_parallel, self.deterministic = graph, ctx, max_parallel, deterministic
        self.pool, self.cpu_gate, self.cache = pool, cpu_gate, cache
        self.emit = ctx.sinks.emit
        self.console = getattr(ctx.sinks, "console", None)
        self.keys: dict[str, str] = {}
        if cache is not None:
            self.keys = graph_keys(graph, device=ctx.device, seed=ctx.seed, deterministic=deterministic)
        # Looked up once, at the start: what is found stays referenced for the whole run.
        self.hits = {n: found for n in graph.order
                     if cache is not None and (found := cache.get(self.keys[n])) is not None}
        self.outputs: dict[str, dict[str, Any]] = {}
        self.waiting = {n: len({src for src, _ in graph.nodes[n].sources.values()}) for n in graph.order}
        self.ready = deque(n for n in graph.order if self.waiting[n] == 0)
        self.running: dict[Future[dict[str, Any]], tuple[str, float]] = {}
        # Nodes that declare cpus: waiting for them (no slot yet), and holding them.
        self.claiming: dict[Future[bool], tuple[str, float]] = {}
        self.granted: deque[tuple[str, float]] = deque()
        self.failure: Outcome | None = None
        self.finished_early: set[str] = set()
        self.own_pool: ThreadPoolExecutor | None = None

    # The loop --------------------------------------------------------------------
    def run(self) -> None:
        while self.ready or self.running or self.claiming or self.granted:
            stopping = self.failure is not None or self.ctx.cancelled
            if stopping and (self.claiming or self.granted):
                self.give_up_claims()
            # Resources are claimed strictly before a slot: a node that declares cpus
            # waits for them without a slot; one that holds them takes the next slot
            # before any other; a slot holder never waits, so the waits cannot deadlock.
            while self.granted and len(self.running) < self.max_parallel and not stopping:
                node_id, _ = self.granted.popleft()
                self.announce(node_id)
                self.running[self.start(node_id)] = (node_id, time.monotonic())
            if not stopping:
                self._take_ready()
            if not self.running and not self.claiming:
                if self.granted and not stopping:
                    continue
                break
            # While claims wait, look at the cancel token now and then (nodes in slots
            # look at it themselves).
            pending: list[Future[Any]] = [*self.running, *self.claiming]
            # Nodes run in this thread are done already: ``wait`` would lock every future to see so.
            done = [future for future in pending if future.done()] or wait(
                pending, timeout=_POLL_S if self.claiming else None, return_when=FIRST_COMPLETED)[0]
            for future in done:
                if future in self.claiming:
                    self._claimed(future)
                else:
                    self._ended(future)

    def _take_ready(self) -> None:
        kept: deque[str] = deque()
        while self.ready:
            node_id = self.ready.popleft()
            if node_id in self.hits:  # not executed: announced and finished at once
                self.announce(node_id, cached=True)
                self.outputs[node_id] = self.reuse(node_id)
                self.finish(node_id, self.outputs[node_id], 0.0, cached=True)
                self.release_children(node_id)
            elif self.graph.nodes[node_id].cpus is not None and self.cpu_gate is not None:
                # At most max_parallel claims at once: cpus granted to nodes that could
                # not run for want of a slot would sit idle, kept from other runs.
                if len(self.claiming) + len(self.granted) < self.max_parallel:
                    self.claim(node_id)
                else:
                    kept.append(node_id)
            elif len(self.running) < self.max_parallel and not self.granted:
                self.announce(node_id)
                self.running[self.start(node_id)] = (node_id, time.monotonic())
            else:
                kept.append(node_id)
        self.ready.extendleft(reversed(kept))

    def _claimed(self, future: Future[bool]) -> None:
        node_id, since = self.claiming.pop(future)
        exc = future.exception()
        if exc is None:
            self.granted.append((node_id, since))
            return
        message = f"{type(exc).__name__}: {exc}"
        self.emit(ev.NODE_FAILED, node_id, {"error": message, "duration_s": 0.0})
        self._fail(node_id, message)

    def _ended(self, future: Future[dict[str, Any]]) -> None:
        node_id, started = self.running.pop(future)
        elapsed = round(time.monotonic() - started, 6)
        exc = future.exception()
        if exc is None:
            self.outputs[node_id] = future.result()
            if node_id not in self.finished_early:
                self.finish(node_id, self.outputs[node_id], elapsed)
            self.release_children(node_id)
        elif isinstance(exc, RunCancelled) or (self.ctx.cancelled and self.failure is None):
            self.emit(ev.NODE_FAILED, node_id, {"error": "cancelled", "cancelled": True, "duration_s": elapsed})
        else:
            message = f"{type(exc).__name__}: {exc}"
            payload = {"error": message, "duration_s": elapsed,
                       "traceback": "".join(traceback.format_exception(exc))[-4000:]}
            echoed = getattr(exc, "console_tail_lines", None)  # the error ends with lines its console holds too
            if isinstance(echoed, int) and echoed > 0:
                payload["console_tail_lines"] = echoed
            self.emit(ev.NODE_FAILED, node_id, payload)
            self._fail(node_id, message)

    def _fail(self, node_id: str, message: str) -> None:
        if self.failure is None:
            self.failure = Outcome("failed", f"node {node_id}: {message}", node_id)
            self.ctx.cancel.set()  # ask the nodes still running to stop; the run has failed anyway

    # One node --------------------------------------------------------------------
    def announce(self, node_id: str, **extra: Any) -> None:
        node = self.graph.nodes[node_id]
        if not extra.get("cached"):  # a cached node runs nothing: no threads to cap
            extra["threads"] = node_threads(node.cpus, self.max_parallel)
        self.emit(ev.NODE_STARTED, node_id, {"type": node.node_type.type, **extra})

    def finish(self, node_id: str, result: dict[str, Any], elapsed: float, **extra: Any) -> None:
        summary = {k: summarize(v) for k, v in result.items()}
        self.emit(ev.NODE_FINISHED, node_id, {"duration_s": elapsed, "outputs": summary, **extra})

    def remember(self, node_id: str, result: dict[str, Any]) -> None:
        # In the node's thread, before any consumer can start and change its outputs.
        # Not once the run is cancelled: a node may have returned early, with less.
        if self.cache is not None and not self.ctx.cancelled:
            try:
                self.cache.put(self.keys[node_id], result)
            except Exception:  # the cache must never fail a node that succeeded
                log.exception("caching the outputs of node %s failed", node_id)

    def reuse(self, node_id: str) -> dict[str, Any]:
        """The cached outputs of a node, copied when a node that executes will read
        them (it could change them: a training loop trains its model in place)."""
        found = self.hits[node_id]
        if self.cache is None or all(child in self.hits for child in self.graph.children[node_id]):
            return found
        try:
            return private_copy(found)
        except Exception:  # not copyable after all: the run takes the cache's objects
            self.cache.discard(self.keys[node_id])
            return found

    def run_one(self, node_id: str) -> dict[str, Any]:
        node = self.graph.nodes[node_id]
        node_ctx = self.ctx.for_node(node_id, threads=node_threads(node.cpus, self.max_parallel))
        inputs = {port: self.outputs[src][src_port] for port, (src, src_port) in node.sources.items()}
        try:
            if node.cpus is not None and self.cpu_gate is not None:
                try:  # the cpus were claimed before this node took its slot
                    began = time.monotonic()
                    with routed(self.console):
                        result = invoke_node(node, node_ctx, inputs, self.deterministic)
                    self.remember(node_id, result)
                    # Finished before its cpus go back, so the log never shows the next
                    # holder starting while this one still runs.
                    self.finished_early.add(node_id)
                    self.finish(node_id, result, round(time.monotonic() - began, 6))
                    return result
                finally:
                    self.cpu_gate.release(node_ctx)
            with routed(self.console):  # what the node prints is its run's console output
                result = invoke_node(node, node_ctx, inputs, self.deterministic)
            self.remember(node_id, result)
            return result
        except (Exception, RunCancelled):
            raise
        except BaseException as exc:  # sys.exit in node code fails this run only
            raise RuntimeError(f"node code raised {type(exc).__name__}({exc})") from exc

    def start(self, node_id: str) -> Future[dict[str, Any]]:
        if self.graph.nodes[node_id].node_type.quick or (
                len(self.ready) == 0 and not self.running and not self.claiming and not self.granted):
            # A quick node, or the only node that can run now (a chain), runs in this
            # thread: no pool hand-off.
            try:
                return _Ran(self.run_one(node_id), None)
            except BaseException as exc:
                return _Ran(None, exc)
        if self.pool is not None:
            return self.pool.submit(self.run_one, node_id)
        if self.own_pool is None:
            self.own_pool = ThreadPoolExecutor(max_workers=max(1, self.max_parallel),
                                               thread_name_prefix=f"run-{self.ctx.run_id[:8]}")
        return self.own_pool.submit(self.run_one, node_id)

    def release_children(self, node_id: str) -> None:
        for child in self.graph.children[node_id]:
            self.waiting[child] -= 1
            if self.waiting[child] == 0:
                self.ready.append(child)

    # Declared cpus ---------------------------------------------------------------
    def claim(self, node_id: str) -> None:
        node = self.graph.nodes[node_id]
        assert self.cpu_gate is not None and node.cpus is not None
        waits = functools.partial(_queued, self.emit, node_id, node.cpus)
        self.claiming[self.cpu_gate.claim(self.ctx.for_node(node_id), node.cpus, waits)] = (node_id, time.monotonic())

    def give_up_claims(self) -> None:
        """Cancelled or failed: claims still waiting, and cpus granted to nodes that never
        took a slot, go back; each such node ends cancelled, as a started one would."""
        for node_id, since in [*self.claiming.values(), *self.granted]:
            assert self.cpu_gate is not None
            self.cpu_gate.release(self.ctx.for_node(node_id))
            self.emit(ev.NODE_FAILED, node_id, {"error": "cancelled", "cancelled": True,
                                                "duration_s": round(time.monotonic() - since, 6)})
        self.claiming.clear()
        self.granted.clear()
