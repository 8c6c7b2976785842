"""CpuLedger: the book of the control plane's cpus (``TROUPE_CPUS``) lent to nodes of
in-process runs that declare ``resources: {"cpus": N}``, and ``LedgerGate``, the
engine-side handle that node threads borrow through.

Waiters are served strictly first come, first served, so a big request is not starved
by small ones slipping past it. Undeclared nodes are not accounted (they run under the
thread caps).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from troupe.actors.base import Actor, ActorRef, Snapshot


@dataclass(frozen=True)
class Acquire:
    run_id: str
    node_id: str
    cpus: int
    granted: concurrent.futures.Future[bool]
    on_wait: Callable[[str], None]


@dataclass(frozen=True)
class Release:
    """The node finished, or gave up waiting: its cpus (or its place) go."""

    run_id: str
    node_id: str



class CpuLedger(Actor):
    def __init__(self, total: int) -> None:
        super().__init__("cpus")
        self._total = total
        self._holders: dict[tuple[str, str], int] = {}
        self._waiters: deque[Acquire] = deque()

    @property
    def _free(self) -> int:
        return self._total - sum(self._holders.values())

    async def receive(self, message: Any) -> Any:
        match message:
            case Acquire(run_id, node_id, cpus):
                if cpus > self._total:
                    message.granted.set_exception(ValueError(
                        f"node {node_id} declares {cpus} cpus; this server lends {self._total} (TROUPE_CPUS)"))
                elif not self._waiters and cpus <= self._free:
                    self._grant(message)
                else:
                    self._waiters.append(message)
                    message.on_wait(f"waiting for {cpus} cpus: {self._free} of {self._total} free, "
                                    f"{len(self._waiters) - 1} nodes ahead")
            case Release(run_id, node_id):
                self._holders.pop((run_id, node_id), None)
                self._waiters = deque(w for w in self._waiters if (w.run_id, w.node_id) != (run_id, node_id))
                while self._waiters and self._waiters[0].cpus <= self._free:
                    self._grant(self._waiters.popleft())
            case Snapshot():
                return {
                    "total": self._total,
                    "free": self._free,
                    "holders": [{"run_id": r, "node_id": n, "cpus": c} for (r, n), c in self._holders.items()],
                    "waiters": [{"run_id": w.run_id, "node_id": w.node_id, "cpus": w.cpus} for w in self._waiters],
                }
            case _:
                raise TypeError(f"{self.name} got an unknown message {message!r}")
        return None

    def _grant(self, request: Acquire) -> None:
        if request.granted.set_running_or_notify_cancel():
            self._holders[(request.run_id, request.node_id)] = request.cpus
            request.granted.set_result(True)


class LedgerGate:
    """What the engine calls from its executor thread to claim cpus for a node, and from
    the node's thread to give them back (``CpuGate``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, ledger: ActorRef) -> None:
        self._loop = loop
        self._ledger = ledger

    def claim(self, ctx: Any, cpus: int, on_wait: Callable[[str], None]) -> concurrent.futures.Future[bool]:
        granted: concurrent.futures.Future[bool] = concurrent.futures.Future()
        self._loop.call_soon_threadsafe(self._ledger.tell, Acquire(ctx.run_id, ctx.node_id, cpus, granted, on_wait))
        return granted

    def release(self, ctx: Any) -> None:
        self._loop.call_soon_threadsafe(self._ledger.tell, Release(ctx.run_id, ctx.node_id))
