"""WarmPool (agent side): run children forked before any run needs them.

With ``troupe agent start --warm N`` the agent starts a zygote (``subprocess_runner.
zygote``): one interpreter that imported torch, the engine and the built-in packs, and
forks a run child in a few milliseconds. The pool keeps N forked children waiting for a
run. A child takes one run and exits: a run in it is as isolated as one in a fresh
interpreter.

The next child is forked ``REFILL_AFTER_S`` after one is taken, not at once: a fork of
the zygote and the new child's priming take a core for about 30 ms, and on a small
machine that is the core the run that just took a child needs for its start (the agent,
the child and the control plane take turns), which then came up to 4-5 ms late. A run
that finds no child ready meanwhile (runs in a burst, a sweep's next variant) waits for
one forked for it, which skips its priming: a fork takes about 10 ms, a fresh
interpreter a second.

Until the zygote is ready (about 2.5 s after the agent starts) a run is started cold, as
without a pool: it never waits for a zygote that is starting. A zygote that dies is
started again, up to ``_RESTARTS`` times in ``_RESTART_WINDOW_S``; then the pool stays
empty and says so. Where fork is not offered (not Linux) the pool holds nothing and every
run starts cold.

Starting the zygote and forking block, so both run on a thread; the agent's loop only
learns the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from troupe.actors.base import Actor
from troupe.protocol import pipe
from troupe.protocol import worker as wire
from troupe.subprocess_runner.run_dirs import pool_dir_prefix, remove_left
from troupe.subprocess_runner.zygote import FORKS, ForkedChild, Zygote

log = logging.getLogger("troupe.agent")
_RESTARTS = 3  # zygote deaths forgiven in a window
_RESTART_WINDOW_S = 60.0
REFILL_AFTER_S = 0.1  # after a child is taken, before the next is forked


@dataclass(frozen=True)
class WarmChild:
    """A forked child waiting on ``conn`` for its run."""

    process: ForkedChild
    conn: Connection


# Messages ----------------------------------------------------------------------


@dataclass(frozen=True)
class Take:
    """Ask: a future of a forked child (now the asker's), or of None: start one cold."""


@dataclass(frozen=True)
class WhyCold:
    """Ask: why a run found no child (words for its warm scripts, which start cold)."""


@dataclass(frozen=True)
class Stats:
    """Ask: the pool as a heartbeat reports it (``wire.WarmPool``)."""


@dataclass(frozen=True)
class _ZygoteReady:
    zygote: Zygote | None
    refusal: str | None = None  # the zygote's own words when it would not fork


@dataclass(frozen=True)
class _Refill:
    """To the pool itself: the run that took a child is past its start."""


@dataclass(frozen=True)
class _Forked:
    child: WarmChild | None


@dataclass(frozen=True)
class _ZygoteLost:
    zygote: Zygote


# The actor ---------------------------------------------------------------------


class WarmPool(Actor):
    def __init__(self, size: int) -> None:
        super().__init__("warm-pool")
        self._size = size
        self._zygote: Zygote | None = None
        self._starting = False  # a zygote is being started
        self._ready: list[WarmChild] = []
        self._forking = 0
        self._waiting: deque[asyncio.Future[WarmChild | None]] = deque()  # runs that found none ready
        self._deaths: list[float] = []  # when zygotes were lost, the newest last
        self._closed = threading.Event()  # seen by the threads that start and fork
        self._refusal: str | None = None  # why the last zygote would not fork

    async def on_start(self) -> None:
        if not FORKS:
            log.warning("--warm keeps no children here: this platform offers no safe fork; runs start cold")
            return
        self._start_zygote()

    async def on_stop(self, reason: str) -> None:
        self._closed.set()
        for child in self._ready:
            _dismiss(child)
            if not child.process.is_alive():  # it died waiting (an OOM kill): its folder stays otherwise
                remove_left(pool_dir_prefix(child.process.pid))
        self._ready.clear()
        for waiter in self._waiting:
            if not waiter.done():
                waiter.set_result(None)
        self._waiting.clear()
        if self._zygote is not None:
            await asyncio.to_thread(self._zygote.close)

    async def receive(self, message: Any) -> Any:
        match message:
            case Take():
                answer: asyncio.Future[WarmChild | None] = asyncio.get_running_loop().create_future()
                child = self._take()
                if child is not None:
                    answer.set_result(child)
                    self._refill_later()
                elif self._zygote is None or self._closed.is_set():
                    answer.set_result(None)  # no zygote (yet): this run starts cold
                else:
                    self._waiting.append(answer)
                    self._fill(for_pool=False)  # a fork for this run now, unprimed; the pool's after it
                    self._refill_later()
                return answer
            case _Refill():
                self._fill()
            case _ZygoteReady(zygote, refusal):
                self._starting = False
                self._refusal = refusal
                if zygote is None:
                    self._lost()
                else:
                    self._zygote = zygote
                    self._fill()
            case _Forked(child):
                self._forking -= 1
                if self._waiting:
                    self._serve(child)
                else:
                    if child is not None:
                        self._ready.append(child)
                    self._fill()
            case _ZygoteLost(zygote):
                if zygote is self._zygote:
                    self._zygote = None
                    self._lost()
                    while self._waiting and len(self._waiting) > self._forking:
                        self._serve(None)  # nothing will be forked for them: they start cold
            case WhyCold():
                return self._why_cold()
            case Stats():
                self._drop_dead()
                return wire.WarmPool(size=self._size, ready=len(self._ready), rss_mib=_rss_mib(self._ready))
            case _:
                raise TypeError(f"{self.name} got an unknown message {message!r}")
        return None

    def _why_cold(self) -> str:
        if not FORKS:
            return "this platform offers no safe fork (the zygote is Linux only)"
        if self._refusal:
            return f"the agent's zygote refused to fork: {self._refusal}"
        if self._zygote is None and len(self._deaths) > _RESTARTS:
            return "the agent's zygote was lost too often; its runs start cold"
        if self._zygote is None:
            return "the agent's zygote is not ready yet"
        return "no forked child was free"

    def _take(self) -> WarmChild | None:
        self._drop_dead()
        return self._ready.pop(0) if self._ready else None

    def _drop_dead(self) -> None:
        """Children that died waiting (an OOM kill) leave the pool, their folders with
        them, and others are forked in their place: at a run's take, and at each
        heartbeat, which would otherwise count them ready."""
        dead = [child for child in self._ready if not child.process.is_alive()]
        if not dead:
            return
        self._ready = [child for child in self._ready if child.process.is_alive()]
        for child in dead:
            _dismiss(child)
            remove_left(pool_dir_prefix(child.process.pid))
        self._fill()

    def _serve(self, child: WarmChild | None) -> None:
        """The oldest run still waiting gets ``child`` (None: it starts cold); with none
        waiting, a child joins the ready ones."""
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():  # done: cancelled, its run stopped meanwhile
                waiter.set_result(child)
                return
        if child is not None:
            self._ready.append(child)

    def _refill_later(self) -> None:
        asyncio.get_running_loop().call_later(REFILL_AFTER_S, self.ref.tell, _Refill())

    def _fill(self, for_pool: bool = True) -> None:
        """Forks for the waiting runs, and (``for_pool``) up to the pool's size; a child
        forked for a run that waits does not prime itself first."""
        zygote = self._zygote
        if zygote is None or self._closed.is_set():
            return
        loop = asyncio.get_running_loop()
        while len(self._ready) + self._forking < len(self._waiting) + (self._size if for_pool else 0):
            self._forking += 1
            forked = loop.run_in_executor(None, _fork, zygote, for_pool)
            forked.add_done_callback(lambda future: self.ref.tell(
                _Forked(None if future.cancelled() or future.exception() else future.result())))

    def _start_zygote(self) -> None:
        if self._starting or self._closed.is_set():
            return
        self._starting = True
        loop = asyncio.get_running_loop()

        def lost(zygote: Zygote) -> None:  # called from the zygote's reader thread: the loop is told on its own
            with contextlib.suppress(RuntimeError):  # the loop closed: the agent has stopped
                loop.call_soon_threadsafe(self.ref.tell, _ZygoteLost(zygote))

        zygote = Zygote(on_lost=lost)
        started = asyncio.get_running_loop().run_in_executor(None, zygote.start, self._closed)
        started.add_done_callback(lambda future: self.ref.tell(_ZygoteReady(
            zygote if not future.cancelled() and not future.exception() and future.result() else None,
            zygote.refusal)))

    def _lost(self) -> None:
        """The zygote died or never became ready: another, unless they keep dying."""
        if self._closed.is_set():
            return
        now = time.monotonic()
        self._deaths = [t for t in self._deaths if now - t < _RESTART_WINDOW_S] + [now]
        if len(self._deaths) > _RESTARTS:
            log.error("the zygote was lost %d times within %g s; runs start cold from now on",
                      len(self._deaths), _RESTART_WINDOW_S)
            return
        log.warning("the zygote is gone; starting another (runs start cold meanwhile)")
        self._start_zygote()


def _fork(zygote: Zygote, prime: bool) -> WarmChild | None:
    forked = zygote.fork(prime)
    return WarmChild(*forked) if forked is not None else None


def _dismiss(child: WarmChild) -> None:
    with contextlib.suppress(OSError):
        child.conn.send(pipe.Dismiss())  # it exits without a run
    child.conn.close()


def _rss_mib(children: list[WarmChild]) -> int | None:
    """Resident memory of the ready children (Linux: /proc); None elsewhere. Forked, they
    share most of it with the zygote and each other until they write to it."""
    total = 0
    for child in children:
        try:
            with open(f"/proc/{child.process.pid}/statm") as statm:
                total += int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return None
    return total // (1024 * 1024)
