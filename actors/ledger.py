"""LedgerActor: the slots of one physical device, named ``ledgers/<physical id>``.

A physical device is a card (its NVML UUID) or a machine's cpu (``cpu@<machine id>``).
Several providers may offer it: two workers that see the same card, or a worker on the
server's own machine offering the cpu the server also runs on. It is one quota, with the
smallest limit among the providers online now (#842). The placer asks ``TryHold``; a run
that got a slot gives it back with ``Free``. A ledger holds nothing it cannot rebuild:
a fresh one is told its providers and holders again by the placer, which keeps which run
it placed where.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from actors.base import Actor, Snapshot

log = logging.getLogger("troupe.ledger")


@dataclass(frozen=True)
class Offer:
    """``provider`` (a worker's name, or ``local`` for the server) offers this device at ``limit``."""

    provider: str
    limit: int


@dataclass(frozen=True)
class Withdraw:
    """The provider went offline or drains: it no longer counts for the limit."""

    provider: str


@dataclass(frozen=True)
class TryHold:
    """Ask: take a slot for ``run_id`` if one is free. Replies True or False."""

    run_id: str


@dataclass(frozen=True)
class Free:
    run_id: str


@dataclass(frozen=True)
class Adopt:
    """A fresh ledger learns the runs that already hold its slots."""

    run_ids: tuple[str, ...]



class LedgerActor(Actor):
    def __init__(self, physical_id: str) -> None:
        super().__init__(f"ledgers/{physical_id}")
        self.physical_id = physical_id
        self._providers: dict[str, int] = {}
        self._holders: set[str] = set()

    @property
    def _limit(self) -> int:
        # No provider online: nothing can start here until one attaches.
        return min(self._providers.values()) if self._providers else 0

    async def receive(self, message: Any) -> Any:
        match message:
            case Offer(provider, limit):
                self._providers[provider] = limit
            case Withdraw(provider):
                self._providers.pop(provider, None)
            case TryHold(run_id):
                if run_id in self._holders:
                    return True
                if len(self._holders) >= self._limit:
                    return False
                self._holders.add(run_id)
                return True
            case Free(run_id):
                self._holders.discard(run_id)
            case Adopt(run_ids):
                self._holders |= set(run_ids)
            case Snapshot():
                return {"physical_id": self.physical_id, "limit": self._limit, "providers": dict(self._providers),
                        "holders": sorted(self._holders)}
            case _:
                raise TypeError(f"{self.name} got an unknown message {message!r}")
        return None
