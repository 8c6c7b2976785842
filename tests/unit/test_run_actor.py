"""RunActor by messages, with a real store and stand-ins for its peers."""

from __future__ import annotations

import asyncio
import gc
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.helpers import hello
from tests.unit.stand_ins import Inbox, run_record, store_run
from troupe.actors.base import Registry
from troupe.actors.executor import GraphEnded
from troupe.actors.placer.messages import Released
from troupe.actors.placer.queue import Release
from troupe.actors.run import RunActor
from troupe.actors.run_messages import Cancel, RunStatusChanged, Start
from troupe.actors.store import StoreActor, StoreClient
from troupe.actors.store.events import GetEvents
from troupe.actors.store.runs import GetRun
from troupe.actors.threaded import start_thread_actor
from troupe.protocol.graph import Graph
from troupe.protocol.settings import Settings
from troupe.subprocess_runner.catalog import load_catalog
from troupe.subprocess_runner.engine import prepare_executable_graph

RUN_ID = "ab" * 16



async def setup(tmp_path: Path, registry: Registry | None = None, **extra: Any):
    registry = registry or Registry()
    store = StoreClient(start_thread_actor(StoreActor, "store", tmp_path / "db", tmp_path / "runs"))
    queue, placer = Inbox("queues/cpu"), Inbox("placer")
    queue.start(registry)
    placer.start(registry)
    record = run_record(RUN_ID, name="t", graph=hello(), warnings=("a warning",), **extra)
    await store_run(store, record)
    graph = prepare_executable_graph(Graph.model_validate(hello()), load_catalog())
    settings = Settings(home=tmp_path)
    run = RunActor(record, graph, store, registry, settings, executor_pool=ThreadPoolExecutor(2)).start(registry)
    return store, run, queue, placer


async def test_a_started_run_executes_and_releases_its_slot_before_its_final_status(tmp_path):
    store, run, queue, placer = await setup(tmp_path)
    run.tell(Start())
    await asyncio.wait_for(run.wait(), 10)
    await store.drain()
    row = await store.read(GetRun(RUN_ID))
    assert row["status"] == "succeeded"
    events, _ = await store.read(GetEvents(RUN_ID))
    assert [e["type"] for e in events][:3] == ["run_queued", "warning", "run_started"]
    assert events[-1]["type"] == "run_finished" and [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert queue.got == [Release(RUN_ID)] and placer.got == [Released(RUN_ID)]
    await store.ref.stop()


async def test_a_study_attempt_tells_its_study_each_status_once_it_is_committed(tmp_path):
    registry = Registry()
    study = StatusWatcher("studies/" + "cd" * 16)
    study.start(registry)
    store, run, _, _ = await setup(tmp_path, registry, study_id="cd" * 16)
    study.store = store
    run.tell(Start())
    await asyncio.wait_for(run.wait(), 10)
    told = await study.settled()
    # hello's few quick nodes are walked as the run starts: its row goes from queued to
    # its end in one write, so "running" is never committed, and never told.
    assert [(c.run_id, c.status) for c in told] == [(RUN_ID, "succeeded")]
    assert study.stored == ["succeeded"]  # when told, the row already says so
    await store.ref.stop()


class StatusWatcher(Inbox):
    """A study's stand-in: what the run's row said in the store when each change came."""

    store: StoreClient | None = None

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.stored: list[str] = []

    async def receive(self, message: object) -> None:
        if isinstance(message, RunStatusChanged) and self.store is not None:
            self.stored.append((await self.store.read(GetRun(message.run_id)))["status"])
        await super().receive(message)


async def test_cancel_of_a_queued_run_withdraws_it_and_a_late_start_is_ignored(tmp_path):
    store, run, queue, _ = await setup(tmp_path)
    assert await run.ask(Cancel()) == {"run_id": RUN_ID, "status": "cancelled", "repeat": False}
    run.tell(Start())  # the grant was already on its way
    await asyncio.wait_for(run.wait(), 10)
    await store.drain()
    row = await store.read(GetRun(RUN_ID))
    assert row["status"] == "cancelled" and row["started_at"] is None
    assert queue.got == [Release(RUN_ID)]
    await store.ref.stop()


async def test_a_crashed_run_actor_fails_its_run_and_frees_its_slot(tmp_path):
    store, run, queue, placer = await setup(tmp_path)
    run.tell(GraphEnded(None))  # type: ignore[arg-type]  # a message it cannot handle crashes it
    exit_ = await asyncio.wait_for(run.wait(), 10)
    assert exit_.crashed
    await store.drain()
    row = await store.read(GetRun(RUN_ID))
    assert row["status"] == "failed" and row["error"].startswith("internal error")
    events, _ = await store.read(GetEvents(RUN_ID))
    assert events[-1]["type"] == "run_finished" and events[-1]["payload"]["internal"] is True
    assert queue.got == [Release(RUN_ID)] and placer.got == [Released(RUN_ID)]
    await store.ref.stop()


async def test_a_finished_run_is_freed_at_once_not_by_the_collector(tmp_path):
    store, run, _, _ = await setup(tmp_path)
    freed = weakref.ref(run._actor)  # the test's one look inside: whether the actor is gone
    run.tell(Start())
    await asyncio.wait_for(run.wait(), 10)
    await store.drain()
    gc.collect()  # what the run's start made in cycles elsewhere (the test's set-up) goes first
    gc.disable()  # then only reference counting may free the RunActor
    try:
        for _ in range(3):
            await asyncio.sleep(0)
        assert freed() is None
    finally:
        gc.enable()
    assert not run.is_alive and (await run.wait()).reason == "finished"
    await store.ref.stop()
