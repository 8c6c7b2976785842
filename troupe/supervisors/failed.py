"""The workers the root gave up on, with why: a record only the root changes.

Readers (``GET /api/workers``) get an immutable snapshot, replaced at every change, so
nothing outside the supervisors holds the record itself and a read takes no lock.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType


class FailedWorkers:
    def __init__(self) -> None:
        self._now: Mapping[str, str] = MappingProxyType({})

    def snapshot(self) -> Mapping[str, str]:
        """The record as it is now; it never changes under its reader."""
        return self._now

    def record(self, name: str, reason: str) -> None:
        self._now = MappingProxyType({**self._now, name: reason})

    def forget(self, name: str) -> str | None:
        """A fresh connection, or a removed worker, gets a fresh chance: the reason it had."""
        if name not in self._now:
            return None
        kept = dict(self._now)
        reason = kept.pop(name)
        self._now = MappingProxyType(kept)
        return reason
