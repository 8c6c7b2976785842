"""Restart policies, intensity limits, quarantine and escalation, driven by messages."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from tests.unit.stand_ins import Inbox, run_record, store_run
from troupe.actors.base import Actor, Registry
from troupe.actors.errors import ActorDeadError
from troupe.actors.placer.messages import Admit
from troupe.actors.placer.queue import Occupying, QueueActor, Release, Snapshot
from troupe.actors.store import StoreActor, StoreClient
from troupe.actors.store.runs import UpdateRun
from troupe.actors.threaded import start_thread_actor
from troupe.supervisors.supervisor import ChildSpec, MaxRestartsExceeded, Restart, Supervisor


@dataclass(frozen=True)
class Poison:
    pass


class Echo(Actor):
    starts = 0

    def __init__(self, name="echo"):
        super().__init__(name)
        Echo.starts += 1

    async def receive(self, message):
        if isinstance(message, Poison):
            raise RuntimeError("poisoned")
        return message



async def restarted(supervisor, name, old):
    for _ in range(200):
        child = supervisor.child(name)
        if child is not None and child is not old:
            return child
        await asyncio.sleep(0.005)
    raise AssertionError(f"{name} was not restarted")


@pytest.fixture
def reset_starts():
    Echo.starts = 0


async def test_a_crashed_permanent_child_is_restarted(reset_starts):
    sup = Supervisor("test")
    first = sup.start_child(ChildSpec("echo", lambda: Echo().start()))
    first.tell(Poison())
    second = await restarted(sup, "echo", first)
    assert await second.ask("hi") == "hi" and Echo.starts == 2
    await sup.stop()


async def test_a_transient_child_that_stops_normally_is_not_restarted(reset_starts):
    sup = Supervisor("test")
    child = sup.start_child(ChildSpec("echo", lambda: Echo().start(), Restart.TRANSIENT))
    child.stop()
    await child.wait()
    await asyncio.sleep(0.02)
    assert sup.child("echo") is None and Echo.starts == 1
    crashy = sup.start_child(ChildSpec("echo", lambda: Echo().start(), Restart.TRANSIENT))
    crashy.tell(Poison())
    assert await restarted(sup, "echo", crashy) is not None
    await sup.stop()


async def test_a_temporary_child_is_never_restarted(reset_starts):
    exits = []
    sup = Supervisor("test", on_exit=lambda spec, info: exits.append(info))
    child = sup.start_child(ChildSpec("echo", lambda: Echo().start(), Restart.TEMPORARY))
    child.tell(Poison())
    await child.wait()
    await asyncio.sleep(0.02)
    assert sup.child("echo") is None and Echo.starts == 1
    assert exits and exits[0].error is not None


async def test_past_the_intensity_a_per_kind_supervisor_quarantines(reset_starts):
    gave_up = []
    sup = Supervisor("queues", intensity=3, period=10, on_give_up=lambda spec, info: gave_up.append(spec.name))
    child = sup.start_child(ChildSpec("queues/cpu", lambda: Echo("queues/cpu").start()))
    for _ in range(4):
        child.tell(Poison())
        await child.wait()
        await asyncio.sleep(0.01)
        child = sup.child("queues/cpu") or child
    assert gave_up == ["queues/cpu"] and Echo.starts == 4
    assert not sup.failed.done()


async def test_past_the_intensity_without_quarantine_the_supervisor_escalates(reset_starts):
    sup = Supervisor("root", intensity=2, period=10)
    child = sup.start_child(ChildSpec("events", lambda: Echo("events").start()))
    while not sup.failed.done():
        child.tell(Poison())
        await child.wait()
        await asyncio.sleep(0.01)
        child = sup.child("events") or child
    assert isinstance(sup.failed.result(), MaxRestartsExceeded)
    assert "events" in str(sup.failed.result())


async def test_a_crashed_queue_rebuilds_its_fifo_from_the_store(tmp_path):
    class FragileQueue(QueueActor):
        async def receive(self, message):
            if isinstance(message, Poison):
                raise RuntimeError("poisoned")
            return await super().receive(message)

    registry = Registry()
    store = StoreClient(start_thread_actor(StoreActor, "store", tmp_path / "db", tmp_path / "runs"))
    placer = Inbox("placer")
    placer.start(registry)
    for seq, run_id in enumerate(("a" * 32, "b" * 32, "c" * 32), start=1):
        Inbox(f"runs/{run_id}").start(registry)
        await store_run(store, run_record(run_id, seq))
    sup = Supervisor("queues")
    queue = sup.start_child(ChildSpec("queues/cpu", lambda: FragileQueue("cpu", 1, store, registry).start(registry)))
    assert await queue.ask(Snapshot()) == {"queue_key": "cpu", "limit": 1, "running": 0, "queued": 3}
    queue.tell(Release("none"))  # any message pumps; the rebuilt head goes to the placer
    await placer.arrived.wait()
    assert placer.got == [Admit("a" * 32, "cpu", False)]
    await store.write(UpdateRun("a" * 32, {"status": "running"}))

    queue.tell(Poison())
    queue = await restarted(sup, "queues/cpu", queue)
    queue.tell(Occupying("a" * 32))  # what the live run answers to ReportOccupancy
    assert await queue.ask(Snapshot()) == {"queue_key": "cpu", "limit": 1, "running": 1, "queued": 2}
    placer.arrived.clear()
    queue.tell(Release("a" * 32))
    await placer.arrived.wait()
    assert placer.got[-1] == Admit("b" * 32, "cpu", False)
    await sup.stop()
    await store.ref.stop()


def test_the_architecture_doc_draws_the_declared_tree():
    from pathlib import Path

    from troupe.supervisors.tree import TREE, drawing

    doc = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
    assert drawing() in doc  # the drawing is made from the declaration: change one, the test asks for the other
    assert len({kind.name for kind in TREE}) == len(TREE)  # a name says one kind


async def test_crashes_provoked_by_asks_are_restarted_without_spending_the_intensity(reset_starts):
    # Six bad requests in ten seconds once stopped the whole control plane: a crash that
    # answered its asker is restarted but never counted; a crash nobody asked for is.
    sup = Supervisor("test", intensity=2, period=60)
    child = sup.start_child(ChildSpec("echo", lambda: Echo().start()))
    for _ in range(6):
        with pytest.raises(ActorDeadError):
            await child.ask(Poison())
        child = await restarted(sup, "echo", child)
    assert not sup.failed.done() and await child.ask("hi") == "hi"
    for _ in range(3):
        child.tell(Poison())
        exit_info = await child.wait()
        assert not exit_info.provoked
        if sup.failed.done():
            break
        child = await restarted(sup, "echo", child)
    assert isinstance(await asyncio.wait_for(sup.failed, 5), MaxRestartsExceeded)
    await sup.stop()
