"""LedgerActor: the slots of one physical device, named ``ledgers/<physical id>``.

A physical device is a card (its NVML UUID) or a machine's cpu (``cpu@<machine id>``).
Several providers may offer it: two workers that see the same card, or a worker on the
server's own machine offering the cpu the server also runs on. It is one quota, with the
smallest limit among the providers online now (#842). The placer asks ``TryHold``; a run
that got a slot gives it back with ``Free``. A ledger holds nothing it cannot rebuild:
a fresh one is told its providers, its policy and its holders again by the placer, which
keeps which run it placed where.

A card is ``exclusive`` (count its slots) or shared by ``memory``: then a run holds it
while its budget plus the CUDA context fits both what the card has free now and what is
not promised to the runs holding it already (``fits``). The ledger counts budgets, not
use: a heartbeat cannot see each run's memory, and a run that just started has not yet
allocated what it will.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from troupe.actors.base import Actor, Snapshot

log = logging.getLogger("troupe.ledger")

EXCLUSIVE, MEMORY = "exclusive", "memory"
# The registry mark of a ledger whose holders have memory budgets: the Workers list shows
# those books, and finds the few ledgers that have any without reading thousands.
PROMISING = "ledgers promising memory"
# The registry mark of a ledger that several providers online offer now (the server's cpu
# and a same-machine worker's): the queue gauges read those few to say which keys share
# one quota, and how much of it is held through any of them.
SHARED = "ledgers shared by several providers"


@dataclass(frozen=True)
class Offer:
    """``provider`` (a worker's name, or ``local`` for the server) offers this device at
    ``limit``; for a card, with its total and free memory as last reported."""

    provider: str
    limit: int
    total_mib: int | None = None
    free_mib: int | None = None
    queue_key: str = ""  # the key its runs wait on there (``cpu``, ``gpu-a/cpu``); the provider's name if unsaid


@dataclass(frozen=True)
class Withdraw:
    """The provider went offline or drains: it no longer counts for the limit."""

    provider: str


@dataclass(frozen=True)
class FreeMemory:
    """A provider's heartbeat: the card has this much memory free now."""

    free_mib: int


@dataclass(frozen=True)
class Policy:
    sharing: str = EXCLUSIVE
    reserved_mib: int = 0


@dataclass(frozen=True)
class TryHold:
    """Ask: take the device for ``run_id`` if it is free for it (a slot, or on a shared
    card room for ``budget_mib``). Replies a ``Hold``, or None."""

    run_id: str
    budget_mib: int | None = None


@dataclass(frozen=True)
class Hold:
    """What a run got: ``shared`` says its budget is to be its memory cap on a card of
    ``total_mib``. ``full``: an exclusive device whose slots are all held now; the placer,
    the only one that changes a ledger, knows a next ``TryHold`` fails until it sends
    the ledger anything else, and spares itself the ask."""

    shared: bool = False
    total_mib: int | None = None
    full: bool = False


@dataclass(frozen=True)
class Fits:
    """Ask, before a run is stored: could ``budget_mib`` ever fit this card, and does it
    now? Replies ``{"sharing", "ever", "now", "numbers"}``; ``sharing`` is all a caller
    needs for an exclusive card."""

    budget_mib: int | None


@dataclass(frozen=True)
class Free:
    run_id: str


@dataclass(frozen=True)
class Adopt:
    """A fresh ledger learns the runs that already hold it, with their budgets."""

    run_ids: tuple[str, ...]
    budgets: dict[str, int | None] = field(default_factory=dict)


class LedgerActor(Actor):
    publishes_view = True  # the Workers panel reads each card's books without an ask
    quiet_messages = frozenset({Fits, Snapshot})

    def __init__(self, physical_id: str, context_mib: int = 500) -> None:
        super().__init__(f"ledgers/{physical_id}")
        self.physical_id = physical_id
        self._context_mib = context_mib
        self._providers: dict[str, int] = {}
        self._keys: dict[str, str] = {}  # provider -> the queue key it offers this device as
        self._holders: dict[str, int | None] = {}  # run -> its memory budget
        self._policy = Policy()
        self._total_mib: int | None = None
        self._free_mib: int | None = None

    @property
    def _limit(self) -> int:
        # No provider online: nothing can start here until one attaches.
        return min(self._providers.values()) if self._providers else 0

    async def receive(self, message: Any) -> Any:
        match message:
            case Offer(provider, limit, total_mib, free_mib, queue_key):
                self._providers[provider] = limit
                self._keys[provider] = queue_key or provider
                self.mark(SHARED, len(self._providers) > 1)
                if total_mib is not None:
                    self._total_mib = total_mib if self._total_mib is None else min(self._total_mib, total_mib)
                if free_mib is not None:
                    self._free_mib = free_mib
            case Withdraw(provider):
                self._providers.pop(provider, None)
                self._keys.pop(provider, None)
                self.mark(SHARED, len(self._providers) > 1)
            case FreeMemory(free_mib):
                self._free_mib = free_mib
            case Policy() as policy:
                self._policy = policy
            case TryHold(run_id, budget_mib):
                hold = self._try_hold(run_id, budget_mib)
                self._mark_promising()
                return hold
            case Fits(budget_mib):
                return self._fits(budget_mib)
            case Free(run_id):
                self._holders.pop(run_id, None)
                self._mark_promising()
            case Adopt(run_ids, budgets):
                for run_id in run_ids:
                    self._holders[run_id] = budgets.get(run_id)
                self._mark_promising()
            case Snapshot():
                return self.make_view()
            case _:
                raise TypeError(f"{self.name} got an unknown message {message!r}")
        return None

    def _mark_promising(self) -> None:
        self.mark(PROMISING, any(budget is not None for budget in self._holders.values()))

    @property
    def _shared(self) -> bool:
        return self._policy.sharing == MEMORY and self._total_mib is not None

    def _try_hold(self, run_id: str, budget_mib: int | None) -> Hold | None:
        if run_id not in self._holders:
            if not self._providers:
                return None
            if self._shared:
                if budget_mib is None or not self._fits(budget_mib)["now"]:
                    return None
            elif len(self._holders) >= self._limit:
                return None
            self._holders[run_id] = budget_mib
        shared = self._shared
        return Hold(shared, self._total_mib, full=not shared and len(self._holders) >= self._limit)

    def _fits(self, budget_mib: int | None) -> dict[str, Any]:
        if not self._shared:
            return {"sharing": EXCLUSIVE, "ever": True, "now": len(self._holders) < self._limit, "numbers": {}}
        assert self._total_mib is not None
        reserved, context = self._policy.reserved_mib, self._context_mib
        # A holder without a budget (it started before the card was shared) has all of it.
        promised = sum(self._total_mib if b is None else b + context for b in self._holders.values())
        free = self._total_mib if self._free_mib is None else self._free_mib
        room = min(free - reserved, self._total_mib - reserved - promised)
        numbers = {"budget_mib": budget_mib, "context_mib": context, "total_mib": self._total_mib,
                   "free_mib": free, "reserved_mib": reserved, "promised_mib": promised, "room_mib": room}
        if budget_mib is None:
            return {"sharing": MEMORY, "ever": False, "now": False, "numbers": numbers}
        need = budget_mib + context
        return {"sharing": MEMORY, "ever": need <= self._total_mib - reserved, "now": need <= room and
                bool(self._providers), "numbers": numbers}

    def make_view(self) -> dict[str, Any]:
        return {"physical_id": self.physical_id, "limit": self._limit, "providers": dict(self._providers),
                "queue_keys": sorted(self._keys.values()),
                "holders": sorted(self._holders), "sharing": self._policy.sharing,
                "reserved_mib": self._policy.reserved_mib, "total_mib": self._total_mib, "free_mib": self._free_mib,
                "context_mib": self._context_mib,
                "budgets": {run: b for run, b in sorted(self._holders.items()) if b is not None}}
