"""Where an in-process run's graph is walked: a graph of a few quick nodes at once, on the
loop, its events and its end handed back to the run that started it; any other on a
thread of the executor pool, its events and its end sent to the run, in order."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from tests.helpers import graph, hello, node
from tests.unit.stand_ins import Inbox
from troupe.actors import executor
from troupe.actors.executor import QUICK_GRAPH_MAX_NODES, Execute, GraphEnded, NodeEvents
from troupe.protocol.graph import Graph
from troupe.subprocess_runner.catalog import load_catalog
from troupe.subprocess_runner.engine import prepare_executable_graph


class CountingPool(ThreadPoolExecutor):
    """A real pool that counts what it was handed."""

    def __init__(self) -> None:
        super().__init__(2)
        self.submitted = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


def cpus(doc: dict[str, Any], count: int) -> dict[str, Any]:
    doc["nodes"][0]["resources"] = {"cpus": count}
    return doc


CONSTANTS = graph(*(node(f"c{i}", "core.Constant", value=i) for i in range(QUICK_GRAPH_MAX_NODES + 1)))


@pytest.mark.parametrize(("doc", "on_a_thread"), [
    (hello(), False),
    (cpus(hello(), 1), True),  # a node that waits for cpus never waits on the loop
    (graph(node("p", "core.Print", prefix="hi")), True),  # not a quick type
    (CONSTANTS, True),  # too many to walk in one go on the loop
])
async def test_a_graph_of_a_few_quick_nodes_is_walked_at_once_and_any_other_on_a_thread(doc, on_a_thread):
    run = Inbox("runs/r")
    run.start()
    pool = CountingPool()
    message = Execute(graph=prepare_executable_graph(Graph.model_validate(doc), load_catalog()), run_id="r",
                      device="cpu", seed=None, deterministic=False, max_parallel=2, cancel=threading.Event(),
                      pool=pool)
    walked = executor.start(pool, message, asyncio.get_running_loop(), run.ref)
    if walked is None:
        while not run.got or not isinstance(run.got[-1], GraphEnded):
            run.arrived.clear()
            await asyncio.wait_for(run.arrived.wait(), 10)
        *sent, ended = run.got
        outcome = ended.outcome
        kinds = [e.type for message in sent if isinstance(message, NodeEvents) for e in message.events]
    else:
        await asyncio.sleep(0)  # the loop's turn, where a courier's deliveries would be
        assert await run.settled() == []
        outcome, kinds = walked.outcome, [e.type for e in walked.events]
    assert outcome.status == "succeeded"
    assert kinds.count("node_started") == kinds.count("node_finished") == len(doc["nodes"])
    assert (pool.submitted > 0) == on_a_thread == (walked is None)
    pool.shutdown()
