"""The queue key, parsed in one place.

A run waits on a queue key: ``<device>`` for this server's own devices (``cpu``,
``cuda:0``), ``<worker>/<device>`` for a named worker's, ``any/<device>`` for the first
free worker, ``one-shot/<device>`` for the one-shot pool (batch jobs' agents). The key is
stored and sent as its string; code that needs its parts parses it here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

ANY_POOL = "any"
ONE_SHOT_POOL = "one-shot"
POOLS = (ANY_POOL, ONE_SHOT_POOL)


@dataclass(frozen=True, slots=True)
class QueueKey:
    """``provider``: a worker's name, a pool (``any``, ``one-shot``), or None for this
    server; ``device``: ``cpu``, ``cuda:N``, ``mps:0``, or ``auto`` in a pool."""

    provider: str | None
    device: str

    @classmethod
    def parse(cls, key: str) -> QueueKey:
        # A worker's name has no "/" (troupe.protocol.api's name pattern), a device never does.
        provider, slash, device = key.partition("/")
        return cls(provider, device) if slash else cls(None, key)

    @property
    def pooled(self) -> bool:
        """A pool's key: the placer picks the worker, which counts the slots."""
        return self.provider in POOLS

    @property
    def one_shot(self) -> bool:
        return self.provider == ONE_SHOT_POOL

    def __str__(self) -> str:
        return self.device if self.provider is None else f"{self.provider}/{self.device}"
