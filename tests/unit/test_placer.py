"""The Placer by messages, with a real store, real ledgers and stand-ins for runs and
queues: target rules (the WorkerBook), admission of named-worker runs on several devices
from what the Admit carries, and adopted runs holding their slots before anything else."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.unit.stand_ins import Inbox, run_record
from troupe.actors.base import Registry, Snapshot
from troupe.actors.placer.actor import (
    Admit,
    Placer,
    Released,
    Restore,
    RunSpec,
    Waiting,
    WorkerOffline,
    WorkerOnline,
)
from troupe.actors.placer.book import WorkerOffer
from troupe.actors.placer.eligibility import ResolveTarget
from troupe.actors.placer.ledger import LedgerActor, TryHold
from troupe.actors.placer.queue import Enqueue, Occupying, QueueActor
from troupe.actors.run_messages import Start
from troupe.actors.store import StoreActor, StoreClient
from troupe.actors.submission import Admission
from troupe.actors.threaded import start_thread_actor
from troupe.protocol.api import RunOptions
from troupe.protocol.errors import CapacityRefused, InvalidRequest
from troupe.protocol.queue_key import QueueKey
from troupe.protocol.run_record import Adoption
from troupe.protocol.settings import Settings
from troupe.subprocess_runner.catalog import load_catalog

TYPES = frozenset({"core.Add", "core.Sleep"})
DEVICES = {"cpu": ("cpu@m1", 2), "cuda:0": ("GPU-0", 1), "cuda:1": ("GPU-1", 1)}



class Plane:
    """A placer and the actors it reaches, found by name as in the real tree."""

    def __init__(self, tmp_path: Path) -> None:
        self.registry = Registry()
        self.store = StoreClient(start_thread_actor(StoreActor, "store", tmp_path / "db", tmp_path / "runs"))
        self.ledgers: dict[str, object] = {}
        self.inboxes: dict[str, Inbox] = {}
        self.placer = Placer(self.store, self.registry, interactive_limit=2, spawn_run=self.spawn,
                             admission=Admission(Settings(home=tmp_path), load_catalog(), ()),
                             ensure_queue=self.queue, ensure_ledger=self.ledger, catalog_types=TYPES
                             ).start(self.registry)

    def spawn(self, spec: RunSpec):
        return self.run(spec.run_id)

    def run(self, run_id: str):
        return self._inbox(f"runs/{run_id}")

    def queue(self, key: str):
        return self._inbox(f"queues/{key}")

    def _inbox(self, name: str):
        if name not in self.inboxes:
            self.inboxes[name] = Inbox(name)
            self.inboxes[name].start(self.registry)
        return self.inboxes[name].ref

    def ledger(self, physical: str):
        fresh = physical not in self.ledgers
        if fresh:
            self.ledgers[physical] = LedgerActor(physical).start(self.registry)
        return self.ledgers[physical], fresh

    async def got(self, name: str) -> list:
        await self.placer.ask(ResolveTarget(RunOptions()))  # everything told before is handled
        return await self.inboxes[name].settled()

    async def close(self) -> None:
        await self.store.ref.stop()


@pytest.fixture
async def plane(tmp_path):
    made = Plane(tmp_path)
    await made.placer.ask(ResolveTarget(RunOptions()))  # started (and found no live run to rebuild from)
    yield made
    await made.close()


def options(**target) -> RunOptions:
    return RunOptions.model_validate({"target": target})


def online(name="gpu-a", types=TYPES, draining=False) -> WorkerOnline:
    return WorkerOnline(WorkerOffer(name, tuple(DEVICES), 8, types), DEVICES, draining)


async def test_a_worker_online_opens_its_devices_queues_before_any_run_comes(plane):
    # With their ledgers, at the worker's hello: a lab's first runs on many cards do not
    # each start a queue actor then.
    plane.placer.tell(online())
    await plane.placer.ask(ResolveTarget(RunOptions()))
    assert sorted(name for name in plane.inboxes if name.startswith("queues/")) == [
        "queues/gpu-a/cpu", "queues/gpu-a/cuda:0", "queues/gpu-a/cuda:1"]


async def test_targets_are_checked_against_the_workers_seen_since_start(plane):
    with pytest.raises(InvalidRequest) as unknown:
        await plane.placer.ask(ResolveTarget(options(worker="gpu-a")))
    assert unknown.value.code == "unknown_target"
    waiting = await plane.placer.ask(ResolveTarget(options(worker="any")))  # none seen yet: it waits
    assert waiting.name == "any" and waiting.devices == ()
    with pytest.raises(CapacityRefused):
        await plane.placer.ask(ResolveTarget(options(worker="any", wait=False)))
    plane.placer.tell(online())
    offer = await plane.placer.ask(ResolveTarget(options(worker="gpu-a")))
    assert offer.devices == ("cpu", "cuda:0", "cuda:1") and offer.cpus == 8
    with pytest.raises(InvalidRequest) as lacking:
        await plane.placer.ask(ResolveTarget(options(worker="gpu-a"), frozenset({"torch.MLP"})))
    assert lacking.value.code == "worker_lacks_node_types"
    plane.placer.tell(WorkerOffline("gpu-a"))
    assert await plane.placer.ask(ResolveTarget(options(worker="gpu-a")))  # waits for it by default
    with pytest.raises(CapacityRefused) as offline:
        await plane.placer.ask(ResolveTarget(options(worker="gpu-a", wait=False)))
    assert offline.value.code == "worker_offline"
    assert await plane.placer.ask(ResolveTarget(options(worker="local"))) is None


async def test_any_needs_a_worker_with_the_graphs_node_types(plane):
    plane.placer.tell(online("partial", types=frozenset({"core.Add"})))
    graph_types = frozenset({"core.Add", "core.Sleep"})
    with pytest.raises(InvalidRequest) as refused:  # seen workers, none able: it could never run
        await plane.placer.ask(ResolveTarget(options(worker="any"), graph_types))
    assert refused.value.code == "no_eligible_worker" and "partial lacks core.Sleep" in refused.value.message
    offer = await plane.placer.ask(ResolveTarget(options(worker="any"), frozenset({"core.Add"})))
    assert offer.devices == ("cpu", "cuda:0", "cuda:1")  # a partial worker serves graphs it can run
    plane.placer.tell(online("full"))
    assert (await plane.placer.ask(ResolveTarget(options(worker="any"), graph_types))).name == "any"


async def test_a_run_on_two_cards_holds_both_or_waits_without_a_lookup(plane):
    plane.placer.tell(online())
    plane.run("one")
    plane.run("two")
    plane.placer.tell(Admit("one", "gpu-a/cuda:0", False, ("cuda:0", "cuda:1")))
    assert await plane.got("runs/one") == [Start(holds=(("gpu-a", "GPU-0"), ("gpu-a", "GPU-1")))]
    plane.placer.tell(Admit("two", "gpu-a/cuda:1", False))
    assert await plane.got("runs/two") == []  # its card is held by the first
    plane.placer.tell(Released("one"))
    assert await plane.got("runs/two") == [Start(holds=(("gpu-a", "GPU-1"),))]


async def test_adopted_runs_hold_their_slots_before_anything_is_admitted(plane):
    record = run_record("old", queue_key=QueueKey("gpu-a", "cuda:0"), device="cuda:0", devices=("cuda:0",),
                        worker="gpu-a")
    adopted = RunSpec(record, graph=None, adoption=Adoption(2, holds=(("gpu-a", "GPU-0"),)))  # type: ignore[arg-type]  # a restart placement reads no graph
    plane.placer.tell(Restore(adopted=(adopted,)))
    assert await plane.got("queues/gpu-a/cuda:0") == [Occupying("old")]
    plane.placer.tell(online())  # the worker comes back and offers the card again
    plane.run("new")
    plane.placer.tell(Admit("new", "gpu-a/cuda:0", False))
    assert await plane.got("runs/new") == []  # no double booking of the card
    plane.placer.tell(Released("old"))
    assert [type(m) for m in await plane.got("runs/new")] == [Start]


async def test_a_line_for_a_card_starts_its_runs_one_by_one_in_order(plane):
    plane.placer.tell(online())
    for name in ("first", "a", "b", "c", "d"):
        plane.run(name)
        plane.placer.tell(Admit(name, "gpu-a/cuda:1", False))
    assert [type(m) for m in await plane.got("runs/first")] == [Start]
    for ended, starts in (("first", "a"), ("a", "b"), ("b", "c"), ("c", "d")):
        plane.placer.tell(Released(ended))  # the runs behind the one that starts wait again, in order
        assert [type(m) for m in await plane.got(f"runs/{starts}")] == [Start]
        for later in ("a", "b", "c", "d"):
            if later > starts:
                assert await plane.got(f"runs/{later}") == []


class CountingLedger(LedgerActor):
    """A card's ledger that counts the placer's asks for a slot."""

    def __init__(self, physical: str) -> None:
        super().__init__(physical)
        self.asked = 0

    async def receive(self, message):
        if isinstance(message, TryHold):
            self.asked += 1
        return await super().receive(message)


async def test_a_full_card_is_asked_once_per_freed_slot(plane):
    """Once a ledger says its last slot went, the placer asks it no more until it tells
    it something: a line of runs for one card costs one ask per freed slot."""
    card = CountingLedger("GPU-1")
    plane.ledgers["GPU-1"] = card.start(plane.registry)
    plane.placer.tell(online())
    for name in ("first", "a", "b", "c"):
        plane.run(name)
        plane.placer.tell(Admit(name, "gpu-a/cuda:1", False))
    assert [type(m) for m in await plane.got("runs/first")] == [Start]
    assert card.asked == 1  # the first took the slot, and the ledger said it was the last
    plane.placer.tell(Released("first"))
    assert [type(m) for m in await plane.got("runs/a")] == [Start]
    assert card.asked == 2 and await plane.got("runs/b") == []


async def test_the_placers_view_says_why_each_run_waits_as_the_ask_does(plane):
    """A page reads the reasons from the view without waiting for a busy placer: the view
    copies the lines, and the words are made for the runs a page asks about."""
    plane.placer.tell(online())
    for name in ("first", "second"):
        plane.run(name)
        plane.placer.tell(Admit(name, "gpu-a/cuda:1", False))
    await plane.got("runs/first")
    await asyncio.sleep(0)  # the view is made on the loop's next turn
    asked = await plane.placer.ask(Waiting())
    assert plane.placer.view.board.answer() == asked and asked["held"] == {"gpu-a/cuda:1": 1}
    assert asked["runs"]["second"]["code"] == "device_busy" and "first" not in asked["runs"]
    assert asked["runs"]["second"]["message"] == "waits for a free slot of gpu-a cuda:1"
    for n in range(300):
        plane.run(f"r{n:03}")
        plane.placer.tell(Admit(f"r{n:03}", "gpu-a/cuda:1", False))
    await plane.got("runs/r000")
    await asyncio.sleep(0)
    board = plane.placer.view.board
    assert board.answer(frozenset({"r050"}))["runs"] == {"r050": asked["runs"]["second"]}  # the same words
    assert board.held() == {"gpu-a/cuda:1": 301}  # a line of runs that ask alike: counted by its length
    plane.run("other")  # a run that asks otherwise (it declares its length) joins the card's line
    plane.placer.tell(Admit("other", "gpu-a/cuda:1", False, duration_s=5.0))
    plane.run("cpu-run")
    plane.placer.tell(Admit("cpu-run", "gpu-a/cpu", False))  # a free slot: it starts
    asked = await plane.placer.ask(Waiting(frozenset({"other", "r299"})))
    assert sorted(asked["runs"]) == ["other", "r299"] and asked["held"] == {"gpu-a/cuda:1": 302}
    plane.placer.tell(WorkerOffline("gpu-a"))
    plane.run("parked")
    plane.placer.tell(Admit("parked", "gpu-a/cuda:0", False))
    asked = await plane.placer.ask(Waiting(frozenset({"parked"})))
    assert asked["runs"]["parked"]["code"] == "worker_offline"


async def test_a_queue_keys_first_start_reads_nothing_and_a_restarted_queue_reads_its_line_back():
    """The placer hands a new key's queue every queued run; only a restarted queue reads
    its line from the store (here a store that is not there: the read fails)."""
    registry = Registry()
    absent = StoreClient()
    first = QueueActor("gpu-b/cuda:0", 1, absent, registry, rebuild=False).start(registry)
    first.tell(Enqueue("r1", 1, False))
    assert (await first.ask(Snapshot()))["queued"] == 1  # no placer yet: it waits in line
    first.stop()
    await first.wait()
    restarted = QueueActor("gpu-b/cuda:0", 1, absent, registry).start(registry)
    exited = await restarted.wait()
    assert exited.crashed and "store" in str(exited.error)
