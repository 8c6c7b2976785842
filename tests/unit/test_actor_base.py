"""The asyncio actor contract, driven by messages."""

from __future__ import annotations

import asyncio
import gc
import weakref
from dataclasses import dataclass

import pytest

from troupe.actors.base import Actor, Registry
from troupe.actors.errors import ActorDeadError, AskTimeout
from troupe.protocol.errors import StateConflict


@dataclass(frozen=True)
class Put:
    value: int


@dataclass(frozen=True)
class Get:
    pass


@dataclass(frozen=True)
class Block:
    event: asyncio.Event


@dataclass(frozen=True)
class Refuse:
    pass


@dataclass(frozen=True)
class Crash:
    pass


class Recorder(Actor):
    def __init__(self) -> None:
        super().__init__("recorder")
        self.seen: list[int] = []
        self.hooks: list[str] = []

    async def on_start(self) -> None:
        self.hooks.append("start")

    async def receive(self, message):
        match message:
            case Put(value):
                self.seen.append(value)
            case Get():
                return list(self.seen)
            case Block(event):
                await event.wait()
            case Refuse():
                raise StateConflict("no")
            case Crash():
                raise RuntimeError("boom")

    async def on_stop(self, reason: str) -> None:
        self.hooks.append(f"stop:{reason}")

    async def on_failure(self, error: BaseException) -> None:
        self.hooks.append(f"failure:{error}")


async def test_messages_are_handled_one_at_a_time_in_order():
    actor = Recorder()
    ref = actor.start()
    for i in range(100):
        ref.tell(Put(i))
    assert await ref.ask(Get()) == list(range(100))


async def test_an_idle_actor_holds_no_task_and_its_next_message_wakes_it():
    # A lab's thousands of idle queues, ledgers and connections cost no task, coroutine
    # or future each: the next message starts a burst that ends when the mailbox is empty.
    refs = [Recorder().start() for _ in range(50)]
    for ref in refs:
        assert await ref.ask(Get()) == []
    await asyncio.sleep(0)  # the bursts that answered return
    assert [t for t in asyncio.all_tasks() if t.get_coro().__qualname__.startswith("Actor.")] == []
    refs[0].tell(Put(1))
    refs[0].tell(Put(2))
    assert await refs[0].ask(Get()) == [1, 2]
    refs[1].stop()
    assert (await refs[1].wait()).reason == "normal"


async def test_an_ask_put_first_goes_ahead_of_the_line_behind_earlier_ones_put_first():
    ref = Recorder().start()
    gate = asyncio.Event()
    ref.tell(Block(gate))
    await asyncio.sleep(0)  # the actor is inside the Block handler; what follows waits in line
    for i in range(3):
        ref.tell(Put(i))
    early = asyncio.ensure_future(ref.ask(Get(), first=True))
    ref.tell(Put(3))
    later = asyncio.ensure_future(ref.ask(Put(9), first=True))
    await asyncio.sleep(0)
    gate.set()
    assert await early == [] and await later is None  # ahead of the three Puts, in the order they came
    assert await ref.ask(Get()) == [9, 0, 1, 2, 3]


async def test_ask_can_time_out_if_the_actor_is_busy():
    ref = Recorder().start()
    gate = asyncio.Event()
    ref.tell(Block(gate))
    with pytest.raises(AskTimeout):
        await ref.ask(Get(), timeout=0.05)
    gate.set()
    assert await ref.ask(Get()) == []


async def test_a_domain_error_answers_the_ask_and_the_actor_lives_on():
    ref = Recorder().start()
    with pytest.raises(StateConflict):
        await ref.ask(Refuse())
    assert ref.is_alive and await ref.ask(Get()) == []


async def test_a_crash_fails_the_ask_calls_on_failure_and_fails_pending_asks():
    actor = Recorder()
    ref = actor.start()
    gate = asyncio.Event()
    ref.tell(Block(gate))
    crash = asyncio.ensure_future(ref.ask(Crash()))
    pending = asyncio.ensure_future(ref.ask(Get()))
    await asyncio.sleep(0)
    gate.set()
    with pytest.raises(ActorDeadError):
        await crash
    with pytest.raises(ActorDeadError):
        await pending
    exit_ = await ref.wait()
    assert exit_.crashed and "boom" in exit_.reason
    assert actor.hooks == ["start", "failure:boom"]
    with pytest.raises(ActorDeadError):
        await ref.ask(Get())


async def test_stop_runs_after_queued_messages_and_calls_on_stop():
    actor = Recorder()
    registry = Registry()
    ref = actor.start(registry)
    assert registry.lookup("recorder") is ref
    ref.tell(Put(1))
    ref.stop("done")
    exit_ = await ref.wait()
    assert not exit_.crashed and exit_.reason == "done"
    assert actor.seen == [1] and actor.hooks == ["start", "stop:done"]
    assert registry.lookup("recorder") is None
    ref.tell(Put(2))  # dropped, not raised


async def test_a_timed_out_ask_is_skipped_but_a_cancelled_askers_message_is_handled():
    ref = Recorder().start()
    gate = asyncio.Event()
    ref.tell(Block(gate))
    with pytest.raises(AskTimeout):
        await ref.ask(Put(1), timeout=0.05)  # gave up on: not handled later
    cancelled = asyncio.ensure_future(ref.ask(Put(2)))
    await asyncio.sleep(0)
    cancelled.cancel()  # its asker went away (a closed request): the message still counts
    gate.set()
    assert await ref.ask(Get()) == [2]


class Counter(Recorder):
    publishes_view = True

    def make_view(self) -> dict[str, int]:
        return {"seen": len(self.seen)}


async def test_a_published_view_is_read_without_an_ask_and_rebuilt_once_per_burst():
    actor = Counter()
    ref = actor.start()
    await asyncio.sleep(0)
    assert ref.view == {"seen": 0}
    builds = 0
    make = actor.make_view

    def counted() -> dict[str, int]:
        nonlocal builds
        builds += 1
        return make()

    actor.make_view = counted  # type: ignore[method-assign]  # counts the rebuilds
    for i in range(50):
        ref.tell(Put(i))
    await ref.ask(Get())
    assert ref.view == {"seen": 50}
    assert builds <= 2  # the burst of 50 and the ask: not one build per message
    await asyncio.sleep(0)
    builds = 0
    actor.quiet_messages = frozenset({Get})  # a read never changes the view: no rebuild after it
    assert await ref.ask(Get()) == list(range(50))
    await asyncio.sleep(0)
    assert builds == 0
    ref.tell(Put(50))
    await ref.ask(Get())
    await asyncio.sleep(0)
    assert builds == 1 and ref.view == {"seen": 51}


class Named(Actor):
    async def receive(self, message):
        return None


async def test_the_registry_lists_the_live_actors_of_a_kind_and_of_a_longer_prefix():
    registry = Registry()
    refs = {name: Named(name).start(registry) for name in
            ("placer", "queues/cpu", "queues/gpu-a/cuda:0", "queues/gpu-a/cuda:1", "ledgers/GPU-1", "workers/gpu-a")}
    assert sorted(registry.names("queues/")) == ["queues/cpu", "queues/gpu-a/cuda:0", "queues/gpu-a/cuda:1"]
    assert sorted(registry.names("queues/gpu-a/")) == ["queues/gpu-a/cuda:0", "queues/gpu-a/cuda:1"]
    assert registry.names("placer") == ["placer"] and len(registry.names()) == 6
    refs["queues/cpu"].stop()
    await refs["queues/cpu"].wait()
    assert registry.names("queues/") == ["queues/gpu-a/cuda:0", "queues/gpu-a/cuda:1"]
    assert registry.lookup("queues/cpu") is None and registry.names("runs/") == []
    again = Named("queues/cpu").start(registry)  # a restarted actor is found again under its name
    assert registry.lookup("queues/cpu") is again and "queues/cpu" in registry.names("queues/")


class Viewed(Recorder):
    publishes_view = True

    def make_view(self):
        return tuple(self.seen)


async def test_an_exited_actor_is_freed_without_the_collector_and_its_ref_still_answers():
    registry = Registry()
    actor = Viewed()
    ref = actor.start(registry)
    ref.tell(Put(7))
    assert await ref.ask(Get()) == [7]
    ref.tell(Put(9))  # its view is published after the stop below is handled
    freed = weakref.ref(actor)
    del actor
    gc.disable()  # only reference counting may free it
    try:
        ref.stop()
        exit_ = await ref.wait()
        await asyncio.sleep(0)
        assert freed() is None
    finally:
        gc.enable()
    assert exit_.reason == "normal" and not ref.is_alive and ref.name == "recorder"
    assert ref.view == (7, 9)  # the last view stays readable, with the last change in it
    ref.tell(Put(8))  # dropped
    ref.stop()
    with pytest.raises(ActorDeadError):
        await ref.ask(Get())
    assert registry.lookup("recorder") is None


class HalfWay(Counter):
    """Changes its state, then waits inside the handler, as the placer does on a ledger."""

    async def receive(self, message):
        if isinstance(message, Block):
            self.seen.append(-1)
            await message.event.wait()
            self.seen.append(-2)
            return None
        return await super().receive(message)


async def test_a_view_is_never_made_while_a_handler_waits_half_way():
    ref = HalfWay().start()
    await asyncio.sleep(0)
    assert ref.view == {"seen": 0}
    gate = asyncio.Event()
    ref.tell(Put(1))
    ref.tell(Block(gate))
    for _ in range(5):
        await asyncio.sleep(0)  # the view owed after Put(1) comes due while Block waits
    assert ref.view == {"seen": 0}  # not 1, nor the 2 of a half-done Block
    gate.set()
    await ref.ask(Get())
    await asyncio.sleep(0)
    assert ref.view == {"seen": 3}
