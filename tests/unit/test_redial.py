"""When an agent dials its control plane again: every quarter second while the dial is
refused (a restart), for the first ten seconds of refusals; the backoff otherwise."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest

from troupe.actors.link import BACKOFF_S, JITTER, RESTART_RETRY_S, RESTART_WINDOW_S, Redial


def _refused_dial() -> BaseException:
    """What aiohttp raises for a dial to a loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again before the dial: nothing listens

    async def dial() -> BaseException:
        async with aiohttp.ClientSession() as session:
            try:
                await session.ws_connect(f"ws://127.0.0.1:{port}/ws/worker")
            except aiohttp.ClientError as exc:
                return exc
        raise AssertionError("the dial connected")

    return asyncio.run(dial())


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_refused_dials_are_retried_every_quarter_second_for_the_window_then_back_off():
    clock, refused = _Clock(), _refused_dial()
    redial = Redial(clock)
    for _ in range(3):
        redial.failed(refused)
        assert redial.every() == RESTART_RETRY_S
        assert RESTART_RETRY_S * (1 - JITTER) <= redial.wait() <= RESTART_RETRY_S
    clock.now += RESTART_WINDOW_S
    redial.failed(refused)
    assert redial.every() == BACKOFF_S[-1]  # a server away for long: once a second
    redial.connected()
    redial.failed(refused)  # a new run of refusals starts a new window
    assert (redial.failures, redial.every()) == (1, RESTART_RETRY_S)


@pytest.mark.parametrize("failure", [aiohttp.ServerDisconnectedError(), ConnectionResetError(), TimeoutError()])
def test_other_failures_back_off_and_end_a_window_of_refusals(failure):
    redial = Redial(_Clock())
    redial.failed(_refused_dial())
    redial.failed(failure)
    assert redial.every() == BACKOFF_S[min(2, len(BACKOFF_S) - 1)]
    redial.connected()
    waits = []
    for _ in range(3):
        redial.failed(failure)
        waits.append(redial.every())
    assert waits == [BACKOFF_S[1], BACKOFF_S[2], BACKOFF_S[2]]
