"""QueueActor: the line of one queue key (``cpu``, ``cuda:0``) and its slot count.

It hands the run whose turn it is to the placer with ``Admit`` whenever a slot is free,
counting the run as holding the slot from then on; the slot comes back with ``Release``,
which the run sends as soon as its graph ends (or it is withdrawn). Whose turn it is:
FIFO among one submitter's runs, and among submitters the one that used the key least
lately (``fair_share.py``), unless the order is ``fifo``. A submitter whose session
allows N runs at once waits while N of its runs hold slots here or execute on this key in
the interactive lane (those never wait here, and hold no slot). On a restart the line is
rebuilt from the queued rows in the store, and what each submitter used from the runs'
start and end times.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from troupe.actors.base import Actor, Registry, Snapshot
from troupe.actors.placer.fair_share import FairLine, Order, Usage
from troupe.actors.placer.messages import Admit
from troupe.actors.store import StoreClient
from troupe.actors.store.runs import QueuedRuns
from troupe.actors.store.submitters import KeyUsage, SessionCap

log = logging.getLogger("troupe.queue")


@dataclass(frozen=True)
class Enqueue:
    run_id: str
    enqueue_seq: int
    seeded: bool
    # Every device a named-worker run asks for when it names several; handed on in Admit.
    devices: tuple[str, ...] = ()
    budget_mib: int | None = None
    duration_s: float | None = None
    submitter: str = ""  # a session's id, "server", or "" (unknown: a run from before it was recorded)


@dataclass(frozen=True)
class Release:
    """The run no longer needs this queue: its graph ended, or it was withdrawn."""

    run_id: str


@dataclass(frozen=True)
class Beside:
    """An interactive run of ``submitter`` executes on this key. It took no slot here, but
    it counts against its session's runs at once (``max_running``) until its Release:
    else a session's queued run started beside its interactive one, past its limit."""

    run_id: str
    submitter: str


@dataclass(frozen=True)
class Readmit:
    """From a restarted placer: hand on again every run counted as holding a slot; the
    placer skips those it knows already started."""


@dataclass(frozen=True)
class Occupying:
    """A live run tells a restarted queue it holds one of its slots, and whose run it is
    (a session's runs at once count it)."""

    run_id: str
    submitter: str = ""



@dataclass(frozen=True)
class PositionOf:
    """Ask: the run's place in the fair line now (1: next), or None where the FIFO order
    the store counts is the order. A submitter asks once its run is stored."""

    run_id: str


@dataclass(frozen=True)
class PredictFor:
    """Ask: where a run this submitter queued now would start (1: next), or None where
    the FIFO order is the order."""

    submitter: str


@dataclass(frozen=True)
class UseKnown:
    """From the queue itself: what each submitter used of the key lately, as the store
    read it (rows of ``KeyUsage``)."""

    rows: tuple[tuple[str, float, float | None, str], ...]


@dataclass(frozen=True)
class CapKnown:
    """From the queue itself: the store answered how many runs a session may run at once."""

    submitter: str
    cap: int | None


class QueueView(NamedTuple):
    """What the queues panel and a queued run's position read: counts, and the line's
    ``order`` while several submitters wait under fair order (else None: FIFO). A named
    tuple: made after every burst of messages, it costs a third of a frozen dataclass."""

    queue_key: str
    limit: int
    running: int
    queued: int
    order: Order | None
    fair: bool = False
    submitters: frozenset[str] = frozenset()  # those with runs waiting
    # (submitter, max_running, runs waiting) of those holding as many runs as they may
    at_limit: tuple[tuple[str, int, int], ...] = ()

    def limit_of(self, submitter: str) -> int | None:
        """The limit of runs at once a session has reached on this key, else None."""
        return next((cap for who, cap, _ in self.at_limit if who == submitter), None)

    def held_back(self, asker: str) -> int:
        """Runs waiting that the line passes over for now (their sessions are at their
        limit), those of ``asker`` aside: a run of another session goes before them."""
        return sum(waiting for who, _, waiting in self.at_limit if who != asker)

    def counts(self) -> dict[str, Any]:
        return {"queue_key": self.queue_key, "limit": self.limit, "running": self.running, "queued": self.queued}


class QueueActor(Actor):
    publishes_view = True  # the queues panel and a queued run's reason read it without an ask
    quiet_messages = frozenset({Readmit, Snapshot, PositionOf, PredictFor})

    def __init__(self, queue_key: str, limit: int, store: StoreClient, registry: Registry,
                 rebuild: bool = True, order: str = "fifo", half_life_s: float = 3600.0) -> None:
        super().__init__(f"queues/{queue_key}")
        self._rebuild = rebuild  # a restarted queue reads its line back from the store
        self.queue_key = queue_key
        self._limit = limit
        self._store = store
        self._registry = registry
        self._fair = order == "fair"
        self._half_life_s = half_life_s
        self._usage = Usage(half_life_s)
        # The waiting runs: a withdrawn run leaves in O(1), a pick costs O(submitters).
        self._line: FairLine[Enqueue] = FairLine(lambda e: e.enqueue_seq, self._usage, self._fair)
        self._holding: set[str] = set()
        self._admitted: dict[str, Enqueue] = {}  # handed on
        self._known: set[str] = set()
        self._beside: dict[str, str] = {}  # interactive runs executing on this key -> their submitter
        self._caps: dict[str, int | None] = {"": None, "server": None}  # submitter -> runs at once it may hold
        self._asking: set[str] = set()  # submitters whose limit is being read
        self._pump_due = False
        self._any_cap = False  # some session seen here has a limit of runs at once
        self._found_running: dict[str, tuple[str, float]] = {}  # a restart: run -> (submitter, started)
        self._loading_use = False  # the store is reading what each submitter used lately

    async def on_start(self) -> None:
        # What each submitter used lately, from the store (fair order only): the order
        # survives a restart. Runs already holding a slot announce themselves with
        # Occupying (the runs supervisor asks them after a restart).
        if self._fair:  # read meanwhile: only a choice between people waits for it
            self._loading_use = True
            me = self.ref
            # Ten half-lives back, but never before 1970: a half-life of years would ask for
            # a date the store cannot write, and every submitter's past use would be lost.
            since = max(0.0, time.time() - 10 * self._half_life_s)
            read = asyncio.ensure_future(self._store.read(KeyUsage(self.queue_key, since)))
            read.add_done_callback(lambda done: me.tell(UseKnown(_use_read(self.queue_key, done))))
        if not self._rebuild:
            return
        for run_id, seq, seeded, devices, budget, duration, submitter in await self._store.read(
                QueuedRuns(self.queue_key)):
            if self._registry.lookup(f"runs/{run_id}") is not None:
                await self._enqueue(Enqueue(run_id, seq, seeded, devices, budget, duration, submitter))

    async def receive(self, message: Any) -> Any:
        match message:
            case Enqueue():
                await self._enqueue(message)
                self._pump_soon()
            case Release(run_id):
                self._beside.pop(run_id, None)
                self._known.discard(run_id)
                self._holding.discard(run_id)
                self._admitted.pop(run_id, None)
                self._line.remove(run_id)
                self._usage.release(run_id)
                self._pump()
            case Beside(run_id, submitter):
                self._beside[run_id] = submitter
                if submitter not in self._caps and submitter not in self._asking:
                    self._ask_cap(submitter)
            case Occupying(run_id, submitter):
                self._known.add(run_id)
                self._line.remove(run_id)
                self._holding.add(run_id)
                found, since = self._found_running.pop(run_id, (submitter, None))
                self._usage.hold(run_id, found or submitter, since)
                if submitter not in self._caps and submitter not in self._asking:
                    self._ask_cap(submitter)
            case UseKnown(rows):
                self._loading_use = False
                for submitter, started, ended, run_id in rows:
                    if ended is None:
                        self._found_running[run_id] = (submitter, started)
                    else:
                        self._usage.charge(submitter, ended - started, ended)
                self._pump()
            case CapKnown(submitter, cap):
                self._asking.discard(submitter)
                self._caps[submitter] = cap
                self._any_cap = self._any_cap or cap is not None
                self._pump()
            case Readmit():
                placer = self._registry.lookup("placer")
                for entry in sorted(self._admitted.values(), key=lambda e: e.enqueue_seq):
                    if placer is not None and entry.run_id in self._holding:
                        placer.tell(self._admit(entry))
            case PositionOf(run_id):
                order = self._line.order()
                return order.position(run_id) if order is not None else None
            case PredictFor(submitter):
                order = self._line.order(also=submitter)
                return order.position_new(submitter) if order is not None else None
            case Snapshot():
                return self.make_view().counts()
            case _:
                # A message nobody defined is a bug: crash, and let the supervisor act.
                raise TypeError(f"{self.name} got an unknown message {message!r}")
        return None

    async def _enqueue(self, entry: Enqueue) -> None:
        if entry.run_id in self._known:
            return
        self._known.add(entry.run_id)
        if entry.submitter not in self._caps and entry.submitter not in self._asking:
            self._ask_cap(entry.submitter)
        self._line.add(entry.run_id, entry.submitter, entry)

    def _ask_cap(self, submitter: str) -> None:
        """A session seen here first: its limit of runs at once, read once, without
        holding the actor (no run is handed on until the answer is in: milliseconds)."""
        self._asking.add(submitter)
        me = self.ref

        def _known(read: asyncio.Future[Any]) -> None:
            failed = read.cancelled() or read.exception() is not None
            if failed:
                log.warning("could not read the quota of session %s; its runs are not limited here", submitter)
            me.tell(CapKnown(submitter, None if failed else read.result()))

        asyncio.ensure_future(self._store.read(SessionCap(submitter))).add_done_callback(_known)

    def make_view(self) -> QueueView:
        at_limit = tuple((who, cap, self._line.waiting_of(who)) for who, cap in self._caps.items()
                         if cap is not None and self._capped(who)) if self._any_cap else ()
        return QueueView(self.queue_key, self._limit, len(self._holding), len(self._line), self._line.order(),
                         self._fair, self._line.submitters(), at_limit)

    def _capped(self, submitter: str) -> bool:
        cap = self._caps.get(submitter)
        if cap is None:
            return False
        beside = sum(1 for who in self._beside.values() if who == submitter) if self._beside else 0
        return self._usage.held_by(submitter) + beside >= cap

    def _pump_soon(self) -> None:
        """Hands runs on once this burst of messages is handled: a restarted server's
        placer hands on every queued run at once, and the first must not take the free
        slot before the others (of people who used the key less) are in line."""
        if not self._pump_due:
            self._pump_due = True
            asyncio.get_running_loop().call_soon(self._pump_now)

    def _pump_now(self) -> None:
        self._pump_due = False
        if self.ref.is_alive:
            self._pump()
            self.changed()

    def _pump(self) -> None:
        placer = self._registry.lookup("placer")
        if placer is None or self._asking:  # whose turn it is waits until every limit is known
            return
        if self._loading_use and len(self._line.submitters()) > 1:  # and who used the key lately
            return
        while len(self._line) and len(self._holding) < self._limit:
            picked = self._line.pick(self._capped if self._any_cap else None)
            if picked is None:
                return
            run_id, submitter, entry = picked
            self._holding.add(run_id)
            self._admitted[run_id] = entry
            self._usage.hold(run_id, submitter)
            placer.tell(self._admit(entry))

    def _admit(self, entry: Enqueue) -> Admit:
        return Admit(entry.run_id, self.queue_key, entry.seeded, entry.devices, entry.budget_mib, entry.duration_s,
                     entry.submitter)


def _use_read(queue_key: str, done: asyncio.Future[Any]) -> tuple[Any, ...]:
    """What each submitter used, as the store read it; a read that failed is said in the
    log (the fair order then starts from nothing), never dropped unseen."""
    if done.cancelled():
        return ()
    if done.exception() is not None:
        log.warning("queue %s: what its submitters used lately could not be read (%s); its fair order starts "
                    "from nothing", queue_key, done.exception())
        return ()
    return tuple(done.result())
