"""The Store: one pykka thread actor owning the store's own apsw connection. It answers
the reads its asyncio face (``troupe.actors.store.client``) does not answer on the loop (all
but a few small ones), and commits the batches the face hands it: the large ones, and
every write other than a run's row and events, which the face commits on the loop
(``troupe.actors.store.writer`` applies a batch either way).

A ``Commit`` batch is one ``BEGIN IMMEDIATE`` transaction in which a bad op fails alone.
The messages and their SQL live in one module per concern; this module only dispatches
the reads from the merged tables.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw.bestpractice

from troupe.actors.errors import ActorDeadError
from troupe.actors.store.table import Session
from troupe.actors.store.writer import Writer, is_broken
from troupe.actors.threaded import ThreadActor

log = logging.getLogger("troupe.store")

# Applied once per process, before the first connection (apsw's own advice).
apsw.bestpractice.apply(apsw.bestpractice.recommended)


@dataclass(frozen=True)
class Commit:
    """Writes in one transaction; answers one outcome per op (a result or the
    exception that op raised alone)."""

    ops: tuple[Any, ...]


@dataclass(frozen=True)
class Checkpoint:
    """Tell: copy the write-ahead log into the database file, off the loop (the loop's
    own connection never does it: the copy ends with an fsync)."""


class StoreActor(ThreadActor):
    def __init__(self, name: str, loop: Any, on_exit: Any, db_path: Path, runs_dir: Path) -> None:
        super().__init__(name, loop, on_exit)
        self._db_path = db_path
        self._runs_dir = runs_dir
        self._writer: Writer | None = None

    def on_start(self) -> None:
        try:
            self._writer = Writer.open(self._db_path, self._runs_dir)
        except Exception as exc:  # pykka would only log it and keep the actor running
            log.error("cannot open the database %s: %s", self._db_path, exc)
            self.mark_broken(exc)

    def on_stop(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        super().on_stop()

    def is_broken(self, error: Exception) -> bool:
        return is_broken(error)

    @property
    def writer(self) -> Writer:
        if self._writer is None:
            raise ActorDeadError("the store is closed")
        return self._writer

    @property
    def session(self) -> Session:
        return self.writer.session

    def handle(self, message: Any) -> Any:
        if isinstance(message, Commit):
            return self.writer.commit(message.ops)
        if isinstance(message, Checkpoint):
            # No room to copy the log into: it stays whole, and the next one copies it.
            with contextlib.suppress(apsw.FullError):
                self.writer.conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            return None
        if Writer.reads(message):
            return self.writer.read(message)
        # A lone write is a batch of one.
        outcome = self.writer.commit((message,))[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome
