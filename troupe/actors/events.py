"""The event hub: fans committed events out to stream subscribers.

The store's client tells the hub what each batch committed (``Committed``); the hub turns
those writes into a run's events and the global stream's changes. A subscriber is a
``Feed`` owned by an SSE handler. The handler subscribes first, then replays from the
store, then takes live items, dropping seqs it already sent: no gap and no duplicate at
the hand-over. When the hub stops, the subscriber gets ``RESET`` and replays from the
store again; when the web server stops (``CloseStreams``), it gets ``CLOSING`` and its
stream ends at once, so that no open page holds the stop. A subscriber whose feed holds
more than ``MAX_BACKLOG_BYTES`` (its reader stopped reading) is dropped and gets
``LAGGED``: its handler tells the client where to resume from and ends the stream, so a
stalled reader holds a bounded amount of memory.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from troupe.actors.base import Actor
from troupe.actors.run_tally import RunTally
from troupe.actors.store.artifacts import RecordLateArtifact
from troupe.actors.store.events import AppendEvents
from troupe.actors.store.retention import Prune, Pruned
from troupe.actors.store.runs import DeleteRun, UpdateRun
from troupe.actors.store.studies import UpdateStudy
from troupe.actors.store.sweeps import created_runs
from troupe.protocol import events as ev
from troupe.protocol.run_record import RunRecord

log = logging.getLogger("troupe.retention")

RESET = object()
LAGGED = object()
CLOSING = object()  # the server stops: the stream ends
# A global subscriber that asked for the changes after an id the hub no longer holds
# (past the window, or numbered by an earlier life of the hub): it re-reads the list.
MISSED = object()
# The global stream's newest changes kept, each numbered (``change_id``): a client that
# reconnects with its Last-Event-ID within them gets what it missed.
CHANGE_WINDOW = 4096
# A subscriber further behind than this is cut loose (it resumes from the store on its
# next request), so one stalled browser tab cannot grow the control plane's memory.
MAX_BACKLOG_BYTES = 512 * 1024
BURST_BYTES = 256 * 1024  # the most a handler takes (and writes) at once
_CHANGE_BYTES = 256  # what a row change (created, status) weighs, about
_EVENT_BYTES = 400  # what an event weighs beside its payload: the frame around it, its dict


class Feed:
    """A subscriber's queue, bounded by the bytes it holds. The hub puts, the handler
    takes; both run on the event loop's thread."""

    def __init__(self) -> None:
        self._items: deque[tuple[Any, int]] = deque()
        self._bytes = 0
        self._ready = asyncio.Event()

    def put(self, item: Any, size: int = 0) -> bool:
        """False, and nothing kept, when the item would take the feed past its bound."""
        if self._bytes + size > MAX_BACKLOG_BYTES and size:
            return False
        self._items.append((item, size))
        self._bytes += size
        self._ready.set()
        return True

    async def burst(self, wait_s: float) -> list[Any]:
        """The items waiting now, up to ``BURST_BYTES`` of them (written as one chunk),
        after waiting up to ``wait_s`` for the first; an empty list means none came."""
        if not self._items:
            self._ready.clear()
            try:
                await asyncio.wait_for(self._ready.wait(), wait_s)
            except TimeoutError:
                return []
        items: list[Any] = []
        taken = 0
        while self._items and (not items or taken + self._items[0][1] <= BURST_BYTES):
            item, size = self._items.popleft()
            items.append(item)
            taken += size
        self._bytes -= taken
        return items

    def qsize(self) -> int:
        return len(self._items)


@dataclass(frozen=True)
class Subscribe:
    """``follows``: run ids whose events the queue gets, and None for every run's changes
    (the Runs panel's stream; a run's stream follows both, as changes move its place)."""

    queue: Feed
    follows: tuple[str | None, ...] = (None,)
    # Whether the subscriber's client is still connected: the count of subscribers is
    # exact when read, even before a handler notices that its client left.
    alive: Callable[[], bool] = lambda: True
    # The global stream's last change the client had (its Last-Event-ID): the ones after
    # it go first, or ``MISSED`` when they are no longer held.
    after_change: int | None = None


@dataclass(frozen=True)
class Unsubscribe:
    queue: Feed


@dataclass(frozen=True)
class Committed:
    """The writes of one store batch that committed, each with its result, in order."""

    writes: tuple[tuple[Any, Any], ...]


@dataclass(frozen=True)
class SubscriberCount:
    pass


@dataclass(frozen=True)
class CloseStreams:
    """The web server stops: every stream ends now (``CLOSING``), rather than when the
    server's shutdown timeout gives up on its handler."""


def _weight(event: Any) -> int:
    encoded = getattr(event, "payload_json", None)
    return _EVENT_BYTES + (len(encoded) if encoded is not None else _CHANGE_BYTES)


class EventHub(Actor):
    def __init__(self, name: str = "events", tally: RunTally | None = None) -> None:
        super().__init__(name)
        self._tally = tally  # counts what runs did for /metrics, from the same commits
        self._by_run: dict[str, set[Feed]] = {}
        self._global: set[Feed] = set()
        # What each subscriber follows: run ids, and None for every run's changes.
        self._where: dict[Feed, set[str | None]] = {}
        self._liveness: dict[Feed, Callable[[], bool]] = {}
        # Numbered from the clock, so an id of an earlier life of the hub (a restart)
        # is never mistaken for one of this life's.
        self._change_id = time.time_ns() // 1000
        self._changes: deque[dict[str, Any]] = deque(maxlen=CHANGE_WINDOW)

    async def receive(self, message: Any) -> Any:
        match message:
            case Committed(writes):
                for op, result in writes:
                    self._publish(op, result)
            case Subscribe(queue, follows, alive, after_change):
                self._where.setdefault(queue, set()).update(follows)
                self._liveness[queue] = alive
                for run_id in follows:
                    if run_id is None:
                        self._global.add(queue)
                    else:
                        self._by_run.setdefault(run_id, set()).add(queue)
                # After it is registered everywhere: a catch-up too large for the feed
                # drops it from everywhere, as any lagging feed is.
                if after_change is not None and None in follows:
                    self._catch_up(queue, after_change)
            case Unsubscribe(queue):
                self._drop(queue)
            case CloseStreams():
                self._reset_all(CLOSING)
            case SubscriberCount():
                return sum(1 for queue in self._where if self._liveness.get(queue, lambda: True)())
        return None

    def _publish(self, op: Any, result: Any) -> None:
        for record in created_runs(op):  # a run, a sweep's runs: whichever write made them
            self._created(record)
        match op:
            case AppendEvents(run_id, events):
                for queue in list(self._by_run.get(run_id, ())):
                    for event in events:
                        if not self._offer(queue, event, _weight(event)):
                            break
            case RecordLateArtifact(artifact):  # an ended run's file that came late: its event
                for queue in list(self._by_run.get(artifact.run_id, ())):
                    self._offer(queue, result, _weight(result))
            case UpdateRun(run_id, fields) if "status" in fields:
                if self._tally is not None:
                    self._tally.changed(run_id, fields)
                self._change({"kind": "status", "run_id": run_id, "status": fields["status"]})
            case DeleteRun(run_id):
                if self._tally is not None:
                    self._tally.deleted(run_id)
                self._change({"kind": "deleted", "run_id": run_id})
            case UpdateStudy(study_id, fields) if "state" in fields and result:
                self._change({"kind": "study", "study_id": study_id, "state": fields["state"],
                              "halt_reason": fields.get("halt_reason")})
            case Prune(keep_last):
                pruned: Pruned = result
                if pruned.run_ids:  # one line a pass, said once it is committed
                    log.info("retention removed %d run%s, keeping the newest %d of each submitter: %s",
                             len(pruned.run_ids), "" if len(pruned.run_ids) == 1 else "s", keep_last,
                             ", ".join(f"{name} {count}" for _, name, count in pruned.by_submitter))
                for run_id in pruned.run_ids:
                    self._change({"kind": "deleted", "run_id": run_id, "reason": "retention"})

    def _created(self, record: RunRecord) -> None:
        """The one place a new run is counted (the tally measures its wait and run from
        here) and announced ``created`` on the global stream."""
        if self._tally is not None:
            self._tally.inserted(record.id, str(record.queue_key), record.created_at, record.worker)
        self._change({"kind": "created", "run_id": record.id, "status": ev.QUEUED,
                      "queue_key": str(record.queue_key), "lane": record.lane, "name": record.name})

    def _change(self, change: Mapping[str, Any]) -> None:
        """A committed change of a run row (created, status), for the global stream."""
        self._change_id += 1
        numbered = {**change, "change_id": self._change_id}
        self._changes.append(numbered)
        for queue in list(self._global):
            self._offer(queue, numbered, _CHANGE_BYTES)

    def _catch_up(self, queue: Feed, after: int) -> None:
        oldest = self._changes[0]["change_id"] if self._changes else self._change_id + 1
        if after > self._change_id or after < oldest - 1:
            queue.put(MISSED)
            return
        for change in self._changes:
            if change["change_id"] > after and not self._offer(queue, change, _CHANGE_BYTES):
                return

    def _offer(self, queue: Feed, item: Any, size: int) -> bool:
        if queue.put(item, size):
            return True
        self._drop(queue)
        queue.put(LAGGED)
        return False

    def _drop(self, queue: Feed) -> None:
        self._liveness.pop(queue, None)
        for run_id in self._where.pop(queue, set()):
            if run_id is None:
                self._global.discard(queue)
                continue
            subscribers = self._by_run.get(run_id, set())
            subscribers.discard(queue)
            if not subscribers:
                self._by_run.pop(run_id, None)

    def _reset_all(self, item: object = RESET) -> None:
        for queue in list(self._where):
            queue.put(item)
        self._where.clear()
        self._liveness.clear()
        self._by_run.clear()
        self._global.clear()

    async def on_stop(self, reason: str) -> None:
        self._reset_all()

    async def on_failure(self, error: BaseException) -> None:
        self._reset_all()
