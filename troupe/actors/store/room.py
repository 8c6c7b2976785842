"""Whether the disk under the database has room, as the store's writes last found it.

A write a full disk refused (``DiskFull``) makes the store full; the first write stored
after that makes it not full again, whatever wrote it (a submission, a probe, a run's
retry), and at that moment everyone waiting for room is told, at once: the runs whose
writes were refused try them again then, not after a pause of their own (a run that
ended while the disk was full stayed ``running`` up to 30 s after there was room, the
last step of its own growing pause).

While someone waits and nothing else writes, a probe (a write that needs a page of the
log and leaves nothing behind) is tried every ``PROBE_S``: the first that fits is the
write that says there is room again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import apsw

from troupe.actors.store.table import Table
from troupe.protocol.errors import DiskFull

PROBE_S = 0.5
_PROBE_TEXT = "x" * 3000  # most of a page: the probe writes one to the log, as any small write does


@dataclass(frozen=True)
class ProbeRoom:
    """A write that needs room in the log and stores nothing (its row goes in the same
    transaction that adds it)."""


def probe_room(conn: apsw.Connection) -> None:
    conn.execute("INSERT OR REPLACE INTO server_state(key, value) VALUES ('room_probe', ?)", (_PROBE_TEXT,))
    conn.execute("DELETE FROM server_state WHERE key = 'room_probe'")


class Room:
    """Owned by the store's client, on the loop; ``write`` is the client's own."""

    def __init__(self, write: Callable[[Any], asyncio.Future[Any]], alive: Callable[[], bool]) -> None:
        self._write = write
        self._alive = alive
        self.full = False
        self._waiting: list[Callable[[], None]] = []
        self._probing = False

    def saw(self, outcomes: Sequence[Any], stored: bool) -> None:
        """A batch's outcomes: a refusal for a full disk makes the store full; any write
        stored in a batch with no such refusal makes it not full, and wakes the waiting."""
        if any(isinstance(outcome, DiskFull) for outcome in outcomes):
            self.full = True
        elif stored and self.full:
            self.full = False
            waiting, self._waiting = self._waiting, []
            for wake in waiting:
                wake()

    def when_room(self, wake: Callable[[], None]) -> None:
        """Calls ``wake`` once a write is stored after the last refusal (soon, when none
        has been refused since)."""
        if not self.full:
            asyncio.get_running_loop().call_soon(wake)
            return
        self._waiting.append(wake)
        self._probe_soon()

    def _probe_soon(self) -> None:
        if not self._probing:
            self._probing = True
            asyncio.get_running_loop().call_later(PROBE_S, self._probe)

    def _probe(self) -> None:
        self._probing = False
        if self.full and self._waiting and self._alive():
            self._write(ProbeRoom()).add_done_callback(lambda _: self._probe_soon() if self.full and self._waiting
                                                        else None)


WRITES: Table = {ProbeRoom: lambda s, op: probe_room(s.conn)}
READS: Table = {}
