"""The pykka bridge: asks from asyncio that never block the loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from troupe.actors.errors import ActorDeadError, AskTimeout
from troupe.actors.threaded import ThreadActor, start_thread_actor


class Worker(ThreadActor):
    def handle(self, message):
        kind, arg = message
        if kind == "echo":
            return (arg, threading.current_thread().name)
        if kind == "fail":
            raise ValueError(arg)
        if kind == "block":
            arg.wait(5)
            return "unblocked"
        if kind == "record":
            arg.append("ran")
            return None
        if kind == "break":
            raise OSError(arg)
        raise TypeError(kind)

    def is_broken(self, error):
        return isinstance(error, OSError)


async def test_ask_runs_in_the_actor_thread():
    ref = start_thread_actor(Worker, "w")
    value, thread = await ref.ask(("echo", 3))
    assert value == 3 and thread != threading.current_thread().name
    await ref.stop()


async def test_a_thread_actor_survives_an_exception_in_a_handler():
    ref = start_thread_actor(Worker, "w")
    with pytest.raises(ValueError, match="bad"):
        await ref.ask(("fail", "bad"))
    assert (await ref.ask(("echo", 1)))[0] == 1
    await ref.stop()


async def test_waiting_on_a_thread_actor_does_not_block_the_loop():
    ref = start_thread_actor(Worker, "w")
    gate = threading.Event()
    slow = asyncio.ensure_future(ref.ask(("block", gate)))
    ticks = 0
    for _ in range(5):
        await asyncio.sleep(0)
        ticks += 1
    assert ticks == 5 and not slow.done()
    gate.set()
    assert await slow == "unblocked"
    await ref.stop()


async def test_an_ask_that_times_out_is_not_executed_later():
    ref = start_thread_actor(Worker, "w")
    gate = threading.Event()
    blocked = asyncio.ensure_future(ref.ask(("block", gate)))
    await asyncio.sleep(0)
    record: list[str] = []
    with pytest.raises(AskTimeout):
        await ref.ask(("record", record), timeout=0.05)
    gate.set()
    await blocked
    await ref.ask(("echo", 0))  # everything before it has been handled
    assert record == []
    await ref.stop()


async def test_a_broken_resource_stops_the_actor_and_reports_it():
    exits = []
    ref = start_thread_actor(Worker, "w", on_exit=exits.append)
    with pytest.raises(OSError):
        await ref.ask(("break", "disk gone"))
    exit_ = await asyncio.wait_for(ref.wait(), 5)
    assert exit_.reason == "broken" and isinstance(exit_.error, OSError)
    assert exits == [exit_]
    with pytest.raises(ActorDeadError):
        await ref.ask(("echo", 1))
