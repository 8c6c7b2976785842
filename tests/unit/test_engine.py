"""The graph engine: order, parallelism, cancellation, failures, seeds."""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.helpers import edge, graph, hello, node
from troupe.protocol.graph import Graph
from troupe.subprocess_runner.catalog import NodeType, Pack, build_catalog, load_catalog
from troupe.subprocess_runner.context import ExecutionContext, Sinks, derive_seed
from troupe.subprocess_runner.engine import execute_graph, prepare_executable_graph, topological_sort
from troupe.subprocess_runner.packs import core

CATALOG = load_catalog()


def run(doc, catalog=CATALOG, seed=None, cancel=None, max_parallel=4):
    events = []
    lock = threading.Lock()

    def emit(kind, node_id, payload):
        with lock:
            events.append((kind, node_id, payload))

    ctx = ExecutionContext("r" * 32, None, "cpu", seed, Sinks(emit), cancel)
    outcome = execute_graph(prepare_executable_graph(Graph.model_validate(doc), catalog), ctx,
                            max_parallel=max_parallel)
    return outcome, events


def test_topological_sort_keeps_document_order_among_ready_nodes():
    g = Graph.model_validate(graph(node("m", "core.Multiply"), node("b", "core.Constant", value=1),
                                   node("a", "core.Constant", value=2),
                                   edges=(edge("a", "value", "m", "a"), edge("b", "value", "m", "b"))))
    assert topological_sort(g) == ["b", "a", "m"]


def test_hello_computes_and_logs_its_metric():
    outcome, events = run(hello())
    assert outcome.status == "succeeded" and outcome.outputs["s"] == {"sum": 5.0}
    assert ("metric", "m", {"name": "val_loss", "step": 1, "value": 5.0}) in events


def test_metric_steps_accumulate_across_calls():
    doc = graph(node("a", "core.Constant", value=1), node("m1", "core.LogMetric", name="loss"),
                node("m2", "core.LogMetric", name="loss"),
                edges=(edge("a", "value", "m1", "value"), edge("m1", "value", "m2", "value")))
    _, events = run(doc)
    assert [p["step"] for k, _, p in events if k == "metric"] == [1, 2]


def _concurrency_catalog(counter):
    def busy(ctx, inputs, params):
        with counter["lock"]:
            counter["now"] += 1
            counter["max"] = max(counter["max"], counter["now"])
        time.sleep(0.05)
        with counter["lock"]:
            counter["now"] -= 1
        return {}

    pack = Pack("t", (NodeType("t.Busy", busy),))
    return build_catalog([core.PACK, pack])


@pytest.mark.parametrize("limit, seed, expected", [(4, None, 4), (2, None, 2), (4, 9, 1)])
def test_independent_nodes_run_in_parallel_up_to_the_limit(limit, seed, expected):
    counter = {"now": 0, "max": 0, "lock": threading.Lock()}
    doc = graph(*(node(f"n{i}", "t.Busy") for i in range(6)))
    outcome, _ = run(doc, _concurrency_catalog(counter), seed=seed, max_parallel=limit)
    assert outcome.status == "succeeded" and counter["max"] == expected


def test_cancel_stops_a_sleeping_node_and_starts_no_more():
    cancel = threading.Event()
    doc = graph(node("z", "core.Sleep", seconds=60), node("after", "core.Sleep", seconds=0),
                edges=(edge("z", "x", "after", "x"),))
    threading.Timer(0.1, cancel.set).start()
    started = time.monotonic()
    outcome, events = run(doc, cancel=cancel)
    assert outcome.status == "cancelled"
    assert time.monotonic() - started < 30  # it woke up, rather than sleeping its minute
    assert ("node_started", "after") not in [(k, n) for k, n, _ in events]


def test_a_failing_node_fails_the_run_and_stops_the_rest():
    doc = graph(node("z", "core.Sleep", seconds=60), node("f", "core.Fail", message="broken"),
                node("later", "core.Sleep", seconds=0), edges=(edge("z", "x", "later", "x"),))
    outcome, events = run(doc)
    assert outcome.status == "failed" and outcome.node_id == "f" and "broken" in outcome.error
    # The sleeping sibling was asked to stop; the dependent never started.
    assert ("node_failed", "z") in [(k, n) for k, n, _ in events]
    assert "later" not in {n for _, n, _ in events}


def test_sys_exit_in_node_code_fails_only_the_run():
    def leave(ctx, inputs, params):
        sys.exit(3)

    catalog = build_catalog([core.PACK, Pack("t", (NodeType("t.Exit", leave),))])
    outcome, events = run(graph(node("x", "t.Exit")), catalog)
    assert outcome.status == "failed" and "SystemExit" in outcome.error
    assert any(k == "node_failed" and n == "x" for k, n, _ in events)


def test_seeded_nodes_get_their_own_stable_seeds():
    import random

    draws = {}

    def draw(ctx, inputs, params):
        draws[ctx.node_id] = (random.random(), ctx.node_seed)
        return {}

    catalog = build_catalog([core.PACK, Pack("t", (NodeType("t.Draw", draw),))])
    doc = graph(node("a", "t.Draw"), node("b", "t.Draw"))
    run(doc, catalog, seed=42)
    first = dict(draws)
    run(doc, catalog, seed=42)
    assert draws == first and first["a"][0] != first["b"][0]
    assert first["a"][1] == derive_seed(42, "a") == derive_seed(42, "a")
    assert 0 <= derive_seed(2**32 - 1, "node") < 2**32


def test_busy_burns_cpu_until_cancelled():
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    started = time.monotonic()
    outcome, _ = run(graph(node("b", "core.Busy", seconds=60)), cancel=cancel)
    assert outcome.status == "cancelled" and time.monotonic() - started < 30


class _CountingPool(ThreadPoolExecutor):
    """A real pool that counts what it was handed."""

    def __init__(self) -> None:
        super().__init__(max_workers=4)
        self.handed = 0

    def submit(self, *args, **kwargs):
        self.handed += 1
        return super().submit(*args, **kwargs)


def test_quick_nodes_run_in_the_walking_thread_and_slow_ones_in_the_pool():
    def walk(doc):
        pool = _CountingPool()
        ctx = ExecutionContext("r" * 32, None, "cpu", None, Sinks(lambda *event: None), None)
        try:
            outcome = execute_graph(prepare_executable_graph(Graph.model_validate(doc), CATALOG), ctx,
                                    max_parallel=4, pool=pool)
        finally:
            pool.shutdown()
        assert outcome.status == "succeeded", outcome.error
        return pool.handed

    assert walk(hello()) == 0  # two constants side by side, an add, a metric: all quick
    two_sleeps = graph(node("x", "core.Sleep", seconds=0.01), node("y", "core.Sleep", seconds=0.01),
                       node("a", "core.Constant", value=1))
    assert walk(two_sleeps) >= 1  # side by side, a sleep waits in the pool, not in the walker
