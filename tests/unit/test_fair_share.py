"""Fair order within a queue key, by its public parts: the QueueActor by messages (a
stand-in placer receives the Admits), and the published ``Order``'s positions checked
against the picks the queue really makes, with a clock the test moves."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from tests.unit.stand_ins import Inbox
from troupe.actors.base import Registry, Snapshot
from troupe.actors.placer.fair_share import FairLine, Usage
from troupe.actors.placer.messages import Admit
from troupe.actors.placer.queue import Enqueue, PositionOf, PredictFor, QueueActor, Release
from troupe.actors.store import StoreActor, StoreClient
from troupe.actors.store.logins import AddLoginLink, UseLoginLink
from troupe.actors.threaded import start_thread_actor


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@asynccontextmanager
async def _queue(tmp_path: Path, order: str = "fair", limit: int = 1, caps: dict[str, int] | None = None
                 ) -> AsyncIterator[tuple[QueueActor, Inbox]]:
    """A queue with a real store, whose sessions ann, bob and cem came from class links
    (``caps``: a session's limit of runs at once); stopped at the end, store included."""
    registry = Registry()
    placer = Inbox("placer")
    placer.start(registry)
    store = StoreClient(start_thread_actor(StoreActor, "store", tmp_path / "db", tmp_path / "runs"))
    try:
        for who in ("ann", "bob", "cem"):
            quotas = {"max_running": caps[who]} if caps and who in caps else None
            await store.write(AddLoginLink(f"link-{who}", "class", 1, time.time() + 60, quotas))
            await store.write(UseLoginLink(f"link-{who}", f"secret-{who}", who, who, 60))
        queue = QueueActor("cpu", limit, store, registry, rebuild=False, order=order)
        queue.start(registry)
        yield queue, placer
        queue.ref.stop()
        await queue.ref.wait()
    finally:
        placer.ref.stop()
        await store.ref.stop()


async def _admitted(placer: Inbox, count: int) -> list[str]:
    """The runs handed on, once ``count`` were (the queue hands on once it knows every
    waiting session's limit, a store read away)."""

    async def enough() -> list[str]:
        while True:
            found = [m.run_id for m in placer.got if isinstance(m, Admit)]
            if len(found) >= count:
                return found
            placer.arrived.clear()
            await placer.arrived.wait()

    await asyncio.wait_for(enough(), 10)
    return [m.run_id for m in await placer.settled() if isinstance(m, Admit)]


async def test_a_freed_slot_goes_to_the_person_who_waited_behind_a_long_line(tmp_path):
    async with _queue(tmp_path) as (queue, placer):
        ref = queue.ref
        for i in range(20):
            ref.tell(Enqueue(f"ann{i}", i + 1, False, submitter="ann"))
        assert await _admitted(placer, 1) == ["ann0"]
        ref.tell(Enqueue("bob0", 21, False, submitter="bob"))
        assert await ref.ask(PositionOf("bob0")) == 1  # next, though 19 of ann's were queued first
        assert await ref.ask(PositionOf("ann1")) == 2
        assert await ref.ask(PredictFor("cem")) == 2  # a third person's run would come right after bob's
        ref.tell(Release("ann0"))
        assert await _admitted(placer, 2) == ["ann0", "bob0"]
        ref.tell(Release("bob0"))
        assert await _admitted(placer, 3) == ["ann0", "bob0", "ann1"]


async def test_with_one_person_or_fifo_order_the_line_is_fifo(tmp_path):
    for order, submitters in (("fair", ["ann"] * 6), ("fifo", ["ann", "ann", "bob", "ann", "bob", "cem"])):
        async with _queue(tmp_path / order, order) as (queue, placer):
            for i, who in enumerate(submitters):
                queue.ref.tell(Enqueue(f"r{i}", i + 1, False, submitter=who))
            for i in range(6):
                assert (await _admitted(placer, i + 1))[-1] == f"r{i}"
                if i == 0:  # no fair line to read: the store's FIFO count is the position
                    assert await queue.ref.ask(PositionOf("r3")) is None
                queue.ref.tell(Release(f"r{i}"))


async def test_a_session_at_its_limit_of_runs_at_once_waits_while_others_go(tmp_path):
    async with _queue(tmp_path, limit=3, caps={"ann": 1}) as (queue, placer):
        for i, who in enumerate(["ann", "ann", "ann", "bob", "bob"]):
            queue.ref.tell(Enqueue(f"r{i}", i + 1, False, submitter=who))
        assert await _admitted(placer, 3) == ["r0", "r3", "r4"]  # ann one at a time, bob the other slots
        assert await queue.ref.ask(Snapshot()) == {"queue_key": "cpu", "limit": 3, "running": 3, "queued": 2}
        queue.ref.tell(Release("r0"))
        assert (await _admitted(placer, 4))[-1] == "r1"


def test_published_positions_are_the_order_the_line_is_picked_in():
    """Whatever each person used before, and however their runs were queued: with each
    run holding its slot as long as the estimate, ``Order.position`` of every waiting
    run is the turn the picks give it."""
    rng = random.Random(7)
    for trial in range(30):
        clock = Clock()
        usage = Usage(1e9, clock)  # the picture leaves out decay over the line's own length
        for who in ("ann", "bob", "cem", "dee"):
            if rng.random() < 0.7:
                usage.charge(who, rng.uniform(0, 20), clock.now - rng.uniform(0, 100))
        line: FairLine[int] = FairLine(lambda seq: seq, usage, fair=True)
        seqs = itertools.count(1)
        for _ in range(rng.randint(2, 25)):
            who = rng.choice(["ann", "bob", "cem", "dee"])
            seq = next(seqs)
            line.add(f"r{seq}", who, seq)
        usage.estimate_s = 2.0
        order = line.order()
        if order is None:  # one person drew every run: FIFO
            continue
        predicted = [run_id for who in order.lines for run_id in order.ids(who)]
        predicted.sort(key=lambda run_id: order.position(run_id) or 0)
        picked = []
        while len(line):
            found = line.pick(lambda who: False)
            assert found is not None
            run_id, who, _ = found
            picked.append(run_id)
            usage.hold(run_id, who)
            clock.now += usage.estimate_s  # it holds the slot as long as the estimate says
            usage.estimate_s = 2.0
            usage.release(run_id)
            usage.estimate_s = 2.0  # release eases the estimate toward what it saw: the same here
        assert picked == predicted, (trial, picked, predicted)
        assert sorted(order.position(r) or 0 for r in picked) == list(range(1, len(picked) + 1))


def test_every_pick_is_the_least_used_submitter_whatever_happened_before():
    """The pick reads a heap it keeps right lazily; here it is checked against the rule
    itself, read off ``Usage.of`` over everyone waiting, through runs queued, withdrawn
    (from the front and the middle), holding slots, ending (charged) and capped people,
    and a base that moves (every figure rescaled)."""
    rng = random.Random(11)
    people = ["ann", "bob", "cem", "dee", "eve"]
    for trial in range(40):
        clock = Clock()
        usage = Usage(50.0, clock)
        line: FairLine[int] = FairLine(lambda seq: seq, usage, fair=True)
        seqs, waiting, holding = itertools.count(1), {}, {}
        caps = {who: rng.choice([None, 1, 2]) for who in people}

        def capped(who: str, holding=holding, caps=caps) -> bool:
            return caps[who] is not None and sum(1 for w in holding.values() if w == who) >= caps[who]

        for _ in range(150):
            action = rng.random()
            clock.now += rng.choice([0.0, 0.001, 0.5, 3.0, 30_000.0 if rng.random() < 0.02 else 1.0])
            if action < 0.4:
                seq, who = next(seqs), rng.choice(people)
                line.add(f"r{seq}", who, seq)
                waiting[f"r{seq}"] = who
            elif action < 0.5 and waiting:
                run_id = rng.choice(list(waiting))
                assert line.remove(run_id) == int(run_id[1:])
                del waiting[run_id]
            elif action < 0.7 and holding:
                run_id = rng.choice(list(holding))
                usage.release(run_id)
                del holding[run_id]
            elif waiting:
                open_ = {who for who in waiting.values() if not capped(who)}
                used = usage.of(sorted(open_))
                picked = line.pick(capped)
                if not open_:
                    assert picked is None
                    continue
                assert picked is not None, trial
                run_id, who, seq = picked
                least = min(used.values())
                heads = {w: min(int(r[1:]) for r, o in waiting.items() if o == w) for w in open_}
                if len(set(waiting.values())) > 1:  # several people: least use, FIFO on a tie
                    ties = [w for w in open_ if used[w] <= least + 1e-6 * usage.step()]
                    assert who == min(ties, key=heads.__getitem__), (trial, who, used, heads)
                else:  # one person: FIFO
                    assert seq == heads[who]
                assert seq == heads[who] and waiting.pop(run_id) == who
                holding[run_id] = who
                usage.hold(run_id, who)
        assert len(line) == len(waiting)
