"""WarmPool (agent side): run children started before any run needs them.

A worker run spends most of its first second in a fresh interpreter importing torch and
the engine. With ``troupe agent start --warm N`` the agent keeps N children that did this
already (``subprocess_runner.child.warm``) and hands one to each run that comes; the pool
starts another the moment one is taken. A child takes one run and exits, so a run in a
warm child is as isolated as one in a fresh child.

A child is *ready* once torch and the engine are imported (about 1.5 s after its start)
and *warm* once the rest is (torch._dynamo and the data loaders, about 2 s more); it says
each on its pipe (``protocol.pipe``'s ``Ready`` and ``Warm``). A ready child goes to any
run; one of core nodes alone starts at once beside the last imports, another waits for
them in the child (it would import torch cold anyway). A warm child is given first.
With none to give (or for a run that sets environment variables of its own, which must
be set before torch is imported) the run's child is started cold, as without a pool.

Starting a child (``Process.start``) and waiting for its ``Ready`` block, so both run on
a thread; the agent's loop only learns the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from actors.base import Actor
from protocol import pipe
from protocol import worker as wire

log = logging.getLogger("troupe.agent")


@dataclass(frozen=True)
class WarmChild:
    """A started child whose imports are done, waiting on ``conn`` for its run."""

    process: Any  # multiprocessing.Process (spawn)
    conn: Connection


# Messages ----------------------------------------------------------------------


@dataclass(frozen=True)
class Take:
    """Ask: a ready child (now the asker's), a warm one first, or None: start one cold."""


@dataclass(frozen=True)
class Stats:
    """Ask: the pool as a heartbeat reports it (``wire.WarmPool``)."""


@dataclass(frozen=True)
class _Warmed:
    child: WarmChild | None


# The actor ---------------------------------------------------------------------


class WarmPool(Actor):
    def __init__(self, size: int) -> None:
        super().__init__("warm-pool")
        self._size = size
        self._ready: list[WarmChild] = []
        self._warm: set[int] = set()  # pids of ready children that said they are warm
        self._starting = 0
        self._closed = threading.Event()  # seen by the threads that start children

    async def on_start(self) -> None:
        self._fill()

    async def on_stop(self, reason: str) -> None:
        self._closed.set()
        for child in self._ready:
            _dismiss(child)
        self._ready.clear()

    async def receive(self, message: Any) -> Any:
        match message:
            case Take():
                child = self._take()
                self._fill()
                return child
            case _Warmed(child):
                self._starting -= 1
                if child is not None:
                    self._ready.append(child)
                else:
                    log.warning("a warm child did not become ready; the next run starts cold")
            case Stats():
                return wire.WarmPool(size=self._size, ready=len(self._ready), rss_mib=_rss_mib(self._ready))
            case _:
                raise TypeError(f"{self.name} got an unknown message {message!r}")
        return None

    def _take(self) -> WarmChild | None:
        for child in list(self._ready):
            if not child.process.is_alive():
                self._ready.remove(child)
                _dismiss(child)
            elif child.process.pid not in self._warm and _said_warm(child):
                self._warm.add(child.process.pid)
        warm = [c for c in self._ready if c.process.pid in self._warm]
        chosen = warm[0] if warm else (self._ready[0] if self._ready else None)
        if chosen is not None:
            self._ready.remove(chosen)
            self._warm.discard(chosen.process.pid)
        return chosen

    def _fill(self) -> None:
        loop = asyncio.get_running_loop()
        while len(self._ready) + self._starting < self._size:
            self._starting += 1
            started = loop.run_in_executor(None, _start_child, self._closed)
            started.add_done_callback(lambda future: self.ref.tell(
                _Warmed(None if future.cancelled() or future.exception() else future.result())))


def _start_child(closed: threading.Event) -> WarmChild | None:
    from subprocess_runner import child

    context = multiprocessing.get_context("spawn")
    parent, child_end = context.Pipe()
    process = context.Process(target=child.warm, args=(child_end,), name="troupe-run-warm", daemon=False)
    process.start()
    child_end.close()
    said: pipe.FromChild | None = None  # None: the pool closed first, or the child died
    try:
        while not closed.is_set():  # the agent may stop while the child imports
            if parent.poll(0.2):
                said = parent.recv()
                break
    except (EOFError, OSError):
        pass
    found = WarmChild(process, parent)
    match said:
        case pipe.Ready() if not closed.is_set():
            return found
        case pipe.Unfit(problem):
            log.warning("a warm child was discarded: %s", problem)
        case pipe.Ready() | None:
            pass
        case _:
            log.warning("a warm child was discarded: it sent an unknown frame %r", said)
    _dismiss(found)
    return None


def _said_warm(child: WarmChild) -> bool:
    """Whether the child said ``Warm`` on its pipe (read without waiting)."""
    try:
        return bool(child.conn.poll()) and isinstance(child.conn.recv(), pipe.Warm)
    except (EOFError, OSError):
        return False


def _dismiss(child: WarmChild) -> None:
    with contextlib.suppress(OSError):
        child.conn.send(pipe.Dismiss())  # it exits without a run
    child.process.join(2)
    if child.process.is_alive():
        child.process.kill()
    child.conn.close()


def _rss_mib(children: list[WarmChild]) -> int | None:
    """Resident memory of the ready children (Linux: /proc); None elsewhere."""
    total = 0
    for child in children:
        try:
            with open(f"/proc/{child.process.pid}/statm") as statm:
                total += int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return None
    return total // (1024 * 1024)
