"""QueueActor: the FIFO of one queue key (``cpu``, ``cuda:0``) and its slot count.

It hands its head to the placer with ``Admit`` whenever a slot is free, counting the run
as holding the slot from then on; the slot comes back with ``Release``, which the run
sends as soon as its graph ends (or it is withdrawn). Interactive runs never pass here.
On a restart the FIFO is rebuilt from the queued rows in the store.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from actors.base import Actor, Registry, Snapshot
from actors.placer.messages import Admit
from actors.store import StoreClient
from actors.store.runs import QueuedRuns

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


@dataclass(frozen=True)
class Release:
    """The run no longer needs this queue: its graph ended, or it was withdrawn."""

    run_id: str


@dataclass(frozen=True)
class Readmit:
    """From a restarted placer: hand on again every run counted as holding a slot; the
    placer skips those it knows already started."""


@dataclass(frozen=True)
class Occupying:
    """A live run tells a restarted queue it holds one of its slots."""

    run_id: str



class QueueActor(Actor):
    publishes_view = True  # the queues panel and a queued run's reason read it without an ask
    quiet_messages = frozenset({Readmit, Snapshot})

    def __init__(self, queue_key: str, limit: int, store: StoreClient, registry: Registry,
                 rebuild: bool = True) -> None:
        super().__init__(f"queues/{queue_key}")
        self._rebuild = rebuild  # a restarted queue reads its line back from the store
        self.queue_key = queue_key
        self._limit = limit
        self._store = store
        self._registry = registry
        # The waiting runs by id, in enqueue order: a withdrawn run leaves in O(1).
        self._fifo: OrderedDict[str, Enqueue] = OrderedDict()
        self._holding: set[str] = set()
        self._admitted: dict[str, Enqueue] = {}  # handed on
        self._known: set[str] = set()

    async def on_start(self) -> None:
        # Rebuild: queued rows in enqueue order. Runs already holding a slot announce
        # themselves with Occupying (the runs supervisor asks them after a restart).
        if not self._rebuild:
            return
        for run_id, seq, seeded, devices, budget, duration in await self._store.read(QueuedRuns(self.queue_key)):
            if self._registry.lookup(f"runs/{run_id}") is not None:
                self._fifo[run_id] = Enqueue(run_id, seq, seeded, devices, budget, duration)
                self._known.add(run_id)

    async def receive(self, message: Any) -> Any:
        match message:
            case Enqueue(run_id):
                if run_id not in self._known:
                    self._known.add(run_id)
                    self._fifo[run_id] = message
                self._pump()
            case Release(run_id):
                self._known.discard(run_id)
                self._holding.discard(run_id)
                self._admitted.pop(run_id, None)
                self._fifo.pop(run_id, None)
                self._pump()
            case Occupying(run_id):
                self._known.add(run_id)
                self._fifo.pop(run_id, None)
                self._holding.add(run_id)
            case Readmit():
                placer = self._registry.lookup("placer")
                for entry in sorted(self._admitted.values(), key=lambda e: e.enqueue_seq):
                    if placer is not None and entry.run_id in self._holding:
                        placer.tell(self._admit(entry))
            case Snapshot():
                return self.make_view()
            case _:
                # A message nobody defined is a bug: crash, and let the supervisor act.
                raise TypeError(f"{self.name} got an unknown message {message!r}")
        return None

    def make_view(self) -> dict[str, Any]:
        return {"queue_key": self.queue_key, "limit": self._limit, "running": len(self._holding),
                "queued": len(self._fifo)}

    def _pump(self) -> None:
        placer = self._registry.lookup("placer")
        if placer is None:
            return
        while self._fifo and len(self._holding) < self._limit:
            _, entry = self._fifo.popitem(last=False)
            self._holding.add(entry.run_id)
            self._admitted[entry.run_id] = entry
            placer.tell(self._admit(entry))

    def _admit(self, entry: Enqueue) -> Admit:
        return Admit(entry.run_id, self.queue_key, entry.seeded, entry.devices, entry.budget_mib, entry.duration_s)
