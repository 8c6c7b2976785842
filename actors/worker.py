"""WorkerConnection: one per enrolled worker that has connected, named ``workers/<name>``.

The websocket lives in its aiohttp handler task, which tells this actor ``Attached``
(with an outbox queue the handler drains onto the socket), ``Beat`` and ``Detached``.
Three missed heartbeats, or the socket closing, make the worker ``disconnected``; past
``TROUPE_WORKER_RESUME_GRACE_S`` the actor stops normally (transient: not restarted).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from actors.base import Actor, Registry
from protocol import worker as wire

log = logging.getLogger("troupe.worker")


@dataclass(frozen=True)
class Attached:
    hello: wire.Hello
    degraded: bool
    missing_node_types: tuple[str, ...]
    outbox: asyncio.Queue[Any]


@dataclass(frozen=True)
class Beat:
    """A frame arrived: the worker is alive."""

    inventory: wire.Inventory | None = None


@dataclass(frozen=True)
class Detached:
    outbox: asyncio.Queue[Any]


@dataclass(frozen=True)
class Revoked:
    """The worker's credential was revoked: refuse it and close."""


@dataclass(frozen=True)
class Drain:
    pass


@dataclass(frozen=True)
class AssignRun:
    """From a RunActor that was admitted on this worker."""

    run_id: str
    frame: wire.Assign


@dataclass(frozen=True)
class CancelOnWorker:
    run_id: str


@dataclass(frozen=True)
class Rebind:
    """After a reconnect: the runs the agent still executes and this server still holds."""

    run_ids: tuple[str, ...]


@dataclass(frozen=True)
class RunDone:
    """The worker reported the run's end."""

    run_id: str


@dataclass(frozen=True)
class Snapshot:
    pass


@dataclass(frozen=True)
class _Check:
    pass


CLOSE = object()  # put in an outbox: the handler closes the socket


class WorkerConnection(Actor):
    def __init__(self, name: str, heartbeat_s: float, grace_s: float, registry: Registry,
                 limit_for: Callable[[str], int] = lambda key: 1) -> None:
        super().__init__(f"workers/{name}")
        self._registry = registry
        self._limit_for = limit_for
        self._runs: dict[str, str] = {}  # run id -> the device it executes on
        self.worker = name
        self._heartbeat_s = heartbeat_s
        self._grace_s = grace_s
        self._hello: wire.Hello | None = None
        self._degraded = False
        self._missing: tuple[str, ...] = ()
        self._outbox: asyncio.Queue[Any] | None = None
        self._last_beat = time.monotonic()
        self._disconnected_at: float | None = None
        self._draining = False
        self._timer: asyncio.TimerHandle | None = None

    async def on_start(self) -> None:
        self._schedule()

    async def on_stop(self, reason: str) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _schedule(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(self._heartbeat_s / 2, self.ref.tell, _Check())

    async def receive(self, message: Any) -> Any:
        match message:
            case Attached(hello, degraded, missing, outbox):
                if self._outbox is not None and self._outbox is not outbox:
                    self._outbox.put_nowait(CLOSE)  # a newer socket of the same worker wins
                self._hello, self._degraded, self._missing, self._outbox = hello, degraded, missing, outbox
                self._last_beat, self._disconnected_at = time.monotonic(), None
                self._tell_placer(online=True)
            case Beat(inventory):
                self._last_beat = time.monotonic()
                if inventory is not None and self._hello is not None:
                    self._hello = self._hello.model_copy(update={"inventory": inventory})
            case Detached(outbox):
                if outbox is self._outbox:
                    self._disconnect("the socket closed")
            case Revoked():
                self._tell_runs("lost")  # its agent stops: nothing of it will come back
                if self._outbox is not None:
                    self._outbox.put_nowait(wire.Refused(code="revoked", reason="this worker's credential was revoked"))
                    self._outbox.put_nowait(CLOSE)
                self.stop_self("revoked")
            case AssignRun(run_id, frame):
                self._runs[run_id] = frame.devices[0] if frame.devices else "cpu"
                if self._outbox is not None:
                    self._outbox.put_nowait(frame)
                else:
                    self._tell_runs("lost", only={run_id})
            case CancelOnWorker(run_id):
                if self._outbox is not None:
                    self._outbox.put_nowait(wire.CancelRun(run_id=run_id))
            case RunDone(run_id):
                self._runs.pop(run_id, None)
            case Rebind(run_ids):
                # Runs the agent no longer executes (it restarted) are lost; the rest go on.
                gone = set(self._runs) - set(run_ids)
                if gone:
                    self._tell_runs("lost", only=gone)
                for run_id in run_ids:
                    self._runs.setdefault(run_id, "cpu")
                if run_ids:
                    self._tell_runs("back", only=set(run_ids))
            case Drain():
                self._draining = True
                if self._outbox is not None:
                    self._outbox.put_nowait(wire.Drain())
                    self._tell_placer(online=True)  # draining: no new runs start here
            case _Check():
                self._check()
            case Snapshot():
                return self._snapshot()
            case _:
                raise TypeError(f"{self.name} got an unknown message {message!r}")
        return None

    def _tell_placer(self, online: bool) -> None:
        from actors.placer import WorkerOffline, WorkerOnline  # the placer module imports the run module

        placer = self._registry.lookup("placer")
        if placer is None:
            return
        if not online or self._hello is None:
            placer.tell(WorkerOffline(self.worker))
            return
        placer.tell(WorkerOnline(self.worker, self._devices(), self._draining, complete=not self._missing))

    def _devices(self) -> dict[str, tuple[str, int]]:
        """Each offered device with its physical identity (NVML UUID; the machine for its
        cpu) and its slot limit."""
        assert self._hello is not None
        limit = self._limit_for
        devices = {"cpu": (f"cpu@{self._hello.machine_id}", limit(f"{self.worker}/cpu"))}
        for card in self._hello.inventory.cards:
            devices[f"cuda:{card.index}"] = (card.uuid, limit(f"{self.worker}/cuda:{card.index}"))
        return devices

    def _tell_runs(self, what: str, only: set[str] | None = None) -> None:
        from actors.run import WorkerBack, WorkerGone, WorkerLost  # run.py sends to this module

        message = {"gone": WorkerGone, "back": WorkerBack, "lost": WorkerLost}[what]()
        targets = set(self._runs) if only is None else only
        for run_id in targets:
            run = self._registry.lookup(f"runs/{run_id}")
            if run is not None:
                run.tell(message)
        if what == "lost":
            for run_id in targets:
                self._runs.pop(run_id, None)

    def _disconnect(self, why: str) -> None:
        if self._disconnected_at is None:
            log.warning("worker %s disconnected: %s", self.worker, why)
            self._disconnected_at = time.monotonic()
            self._tell_placer(online=False)
            self._tell_runs("gone")
        if self._outbox is not None:
            self._outbox.put_nowait(CLOSE)
        self._outbox = None

    def _check(self) -> None:
        now = time.monotonic()
        if self._outbox is not None and now - self._last_beat > 3 * self._heartbeat_s:
            self._disconnect("three heartbeats missed")
        if self._disconnected_at is not None and now - self._disconnected_at >= self._grace_s:
            log.warning("worker %s stayed away past the grace of %ss", self.worker, self._grace_s)
            self._tell_runs("lost")
            self.stop_self("grace expired")
            return
        self._schedule()

    def _snapshot(self) -> dict[str, Any]:
        hello = self._hello
        return {
            "name": self.worker,
            "state": "connected" if self._outbox is not None else "disconnected",
            "degraded": self._degraded,
            "draining": self._draining,
            "missing_node_types": list(self._missing),
            "version": hello.version if hello else None,
            "machine_id": hello.machine_id if hello else None,
            "devices": ["cpu", *(f"cuda:{c.index}" for c in hello.inventory.cards)] if hello else [],
            "inventory": hello.inventory.model_dump() if hello else None,
            "slots": [{"device": device, "physical_id": physical, "limit": limit,
                       "running": sum(1 for on in self._runs.values() if on == device)}
                      for device, (physical, limit) in (self._devices().items() if hello else [])],
            "running_runs": sorted(self._runs),
        }
