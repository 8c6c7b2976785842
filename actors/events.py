"""The event hub: fans committed events out to stream subscribers.

The store's client tells the hub what each batch committed (``Committed``); the hub turns
those writes into a run's events and the global stream's changes. A subscriber is an
``asyncio.Queue`` owned by an SSE handler. The handler subscribes
first, then replays from the store, then takes live items, dropping seqs it already
sent: no gap and no duplicate at the hand-over. When the hub stops, or a subscriber
falls too far behind, the subscriber gets ``RESET`` and replays from the store again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from actors.base import Actor
from actors.store.events import AppendEvents
from actors.store.runs import DeleteRun, InsertRun, Prune, UpdateRun
from actors.store.studies import UpdateStudy

RESET = object()
# A subscriber more than this many items behind is cut loose (it replays from the
# store), so one stalled browser tab cannot grow the control plane's memory.
MAX_BACKLOG = 10_000


@dataclass(frozen=True)
class Subscribe:
    """``follows``: run ids whose events the queue gets, and None for every run's changes
    (the Runs panel's stream; a run's stream follows both, as changes move its place)."""

    queue: asyncio.Queue[Any]
    follows: tuple[str | None, ...] = (None,)
    # Whether the subscriber's client is still connected: the count of subscribers is
    # exact when read, even before a handler notices that its client left.
    alive: Callable[[], bool] = lambda: True


@dataclass(frozen=True)
class Unsubscribe:
    queue: asyncio.Queue[Any]


@dataclass(frozen=True)
class Committed:
    """The writes of one store batch that committed, each with its result, in order."""

    writes: tuple[tuple[Any, Any], ...]


@dataclass(frozen=True)
class SubscriberCount:
    pass


class EventHub(Actor):
    def __init__(self, name: str = "events") -> None:
        super().__init__(name)
        self._by_run: dict[str, set[asyncio.Queue[Any]]] = {}
        self._global: set[asyncio.Queue[Any]] = set()
        # What each subscriber follows: run ids, and None for every run's changes.
        self._where: dict[asyncio.Queue[Any], set[str | None]] = {}
        self._liveness: dict[asyncio.Queue[Any], Callable[[], bool]] = {}

    async def receive(self, message: Any) -> Any:
        match message:
            case Committed(writes):
                for op, result in writes:
                    self._publish(op, result)
            case Subscribe(queue, follows, alive):
                self._where.setdefault(queue, set()).update(follows)
                self._liveness[queue] = alive
                for run_id in follows:
                    if run_id is None:
                        self._global.add(queue)
                    else:
                        self._by_run.setdefault(run_id, set()).add(queue)
            case Unsubscribe(queue):
                self._drop(queue)
            case SubscriberCount():
                return sum(1 for queue in self._where if self._liveness.get(queue, lambda: True)())
        return None

    def _publish(self, op: Any, result: Any) -> None:
        match op:
            case AppendEvents(run_id, events):
                for queue in list(self._by_run.get(run_id, ())):
                    for event in events:
                        self._offer(queue, event)
            case InsertRun(row):
                self._change({"kind": "created", "run_id": row["id"], "status": row["status"],
                              "queue_key": row["queue_key"], "lane": row["lane"], "name": row.get("name")})
            case UpdateRun(run_id, fields) if "status" in fields:
                self._change({"kind": "status", "run_id": run_id, "status": fields["status"]})
            case DeleteRun(run_id):
                self._change({"kind": "deleted", "run_id": run_id})
            case UpdateStudy(study_id, fields) if "state" in fields:
                self._change({"kind": "study", "study_id": study_id, "state": fields["state"],
                              "halt_reason": fields.get("halt_reason")})
            case Prune():
                for run_id in result:
                    self._change({"kind": "deleted", "run_id": run_id, "reason": "retention"})

    def _change(self, change: Mapping[str, Any]) -> None:
        """A committed change of a run row (created, status), for the global stream."""
        for queue in list(self._global):
            self._offer(queue, change)

    def _offer(self, queue: asyncio.Queue[Any], item: Any) -> None:
        if queue.qsize() >= MAX_BACKLOG:
            self._drop(queue)
            queue.put_nowait(RESET)
            return
        queue.put_nowait(item)

    def _drop(self, queue: asyncio.Queue[Any]) -> None:
        self._liveness.pop(queue, None)
        for run_id in self._where.pop(queue, set()):
            if run_id is None:
                self._global.discard(queue)
                continue
            subscribers = self._by_run.get(run_id, set())
            subscribers.discard(queue)
            if not subscribers:
                self._by_run.pop(run_id, None)

    def _reset_all(self) -> None:
        for queue in list(self._where):
            queue.put_nowait(RESET)
        self._where.clear()
        self._liveness.clear()
        self._by_run.clear()
        self._global.clear()

    async def on_stop(self, reason: str) -> None:
        self._reset_all()

    async def on_failure(self, error: BaseException) -> None:
        self._reset_all()
