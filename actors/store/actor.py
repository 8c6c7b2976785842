"""The Store: one pykka thread actor owning the one apsw connection, the only writer of
the database. Its asyncio face, which batches writes, is ``actors.store.client``.

A ``Commit`` batch is one ``BEGIN IMMEDIATE`` transaction in which a bad op fails alone.
The messages and their SQL live in one module per concern; this module only dispatches
them from the merged tables.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw
import apsw.bestpractice

import actors.store.artifacts as artifacts
import actors.store.events as events
import actors.store.files as files
import actors.store.flavors as flavors
import actors.store.logins as logins
import actors.store.memory as memory
import actors.store.run_list as run_list
import actors.store.runs as runs
import actors.store.studies as studies
import actors.store.sweeps as sweeps
import actors.store.workers as workers
from actors.errors import ActorDeadError
from actors.store.schema import open_database
from actors.store.table import Session, Table
from actors.threaded import ThreadActor
from protocol.errors import DiskFull, TroupeError

log = logging.getLogger("troupe.store")
FULL_LOG_S = 30.0

# Applied once per process, before the first connection (apsw's own advice).
apsw.bestpractice.apply(apsw.bestpractice.recommended)

_CONCERNS = (runs, run_list, events, artifacts, sweeps, studies, workers, memory, flavors, files, logins)
_WRITES: Table = {kind: handler for module in _CONCERNS for kind, handler in module.WRITES.items()}
_READS: Table = {kind: handler for module in _CONCERNS for kind, handler in module.READS.items()}
# What outlives a run copies its result from it when it ends or before it is deleted:
# each harvest, with the run column that says a run is one of its own.
_HARVESTS = ((sweeps.harvest, "sweep_id"), (studies.harvest, "study_id"))


@dataclass(frozen=True)
class Commit:
    """Writes in one transaction; answers one outcome per op (a result or the
    exception that op raised alone)."""

    ops: tuple[Any, ...]


class StoreActor(ThreadActor):
    def __init__(self, name: str, loop: Any, on_exit: Any, db_path: Path, runs_dir: Path) -> None:
        super().__init__(name, loop, on_exit)
        self._db_path = db_path
        self._db_file = str(db_path)
        self._runs_dir = runs_dir
        self._conn: apsw.Connection | None = None
        self._session: Session | None = None
        self._inode: int | None = None
        self._full_said = -FULL_LOG_S
        self._full_unsaid = 0

    def on_start(self) -> None:
        try:
            self._conn = open_database(self._db_path)
            self._inode = os.stat(self._db_file).st_ino
            self._session = Session(self._conn, self._runs_dir, self._runs_ended)
        except Exception as exc:  # pykka would only log it and keep the actor running
            log.error("cannot open the database %s: %s", self._db_path, exc)
            self.mark_broken(exc)

    def on_stop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
            self._session = None
        super().on_stop()

    def is_broken(self, error: Exception) -> bool:
        return isinstance(error, apsw.CantOpenError | apsw.IOError | apsw.CorruptError | apsw.NotADBError)

    @property
    def session(self) -> Session:
        if self._session is None:
            raise ActorDeadError("the store is closed")
        return self._session

    def handle(self, message: Any) -> Any:
        if isinstance(message, Commit):
            return self._commit(message.ops)
        read = _READS.get(type(message))
        if read is not None:
            return read(self.session, message)
        # A lone write is a batch of one.
        outcome = self._commit((message,))[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def _runs_ended(self, run_ids: Sequence[str]) -> None:
        # One look at the rows picks the runs each harvest has to read (most runs belong
        # to neither a sweep nor a study).
        conn = self.session.conn
        columns = ", ".join(f"{column} IS NOT NULL" for _, column in _HARVESTS)
        owned: list[tuple[str, list[Any]]] = []
        for start in range(0, len(run_ids), 500):  # far below SQLite's limit of bound values
            chunk = tuple(run_ids[start:start + 500])
            marks = ",".join("?" for _ in chunk)
            owned += [(str(run_id), flags) for run_id, *flags in conn.execute(
                f"SELECT id, {columns} FROM runs WHERE id IN ({marks})", chunk)]
        for index, (harvest, _) in enumerate(_HARVESTS):
            mine = [run_id for run_id, flags in owned if flags[index]]
            if mine:
                harvest(conn, mine)

    def _check_file(self) -> None:
        # SQLite keeps writing to an unlinked file without a word; every write would be
        # lost at the next start. Treat a removed or replaced file as a broken store.
        try:
            inode: int | None = os.stat(self._db_file).st_ino
        except OSError:
            inode = None
        if inode != self._inode:
            raise apsw.CantOpenError(f"the database file {self._db_path} was removed or replaced")

    def _commit(self, ops: tuple[Any, ...]) -> list[Any]:
        """Applies the batch straight through; only when an op fails is the batch rolled
        back and applied again with a savepoint per op, so that op fails alone. Ops are
        deterministic on the database, so the second pass does what the first would
        have done, minus the failing op. A full disk (where SQLite may drop the whole
        transaction itself) applies each op in its own transaction instead: what fits
        is kept, and each op that did not fit fails alone with ``DiskFull``."""
        self._check_file()
        session = self.session
        handlers = [self._write_handler(op) for op in ops]
        conn = session.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                results = [handler(session, op) for handler, op in zip(handlers, ops, strict=True)]
            except Exception as exc:
                if self.is_broken(exc) or isinstance(exc, apsw.FullError):
                    raise
                self._rollback()
                conn.execute("BEGIN IMMEDIATE")
                results = [self._apply_alone(session, handler, op) for handler, op in zip(handlers, ops, strict=True)]
            conn.execute("COMMIT")
        except apsw.FullError:
            self._rollback()
            return [self._apply_in_own_transaction(session, handler, op)
                    for handler, op in zip(handlers, ops, strict=True)]
        except BaseException:
            self._rollback()
            raise
        return results

    def _rollback(self) -> None:
        # SQLite may have rolled the transaction back itself (a full disk does): then
        # there is nothing to roll back, and saying so would hide the real error.
        conn = self.session.conn
        if not conn.getautocommit():
            conn.execute("ROLLBACK")

    def _apply_alone(self, session: Session, handler: Any, op: Any) -> Any:
        try:
            with session.conn:  # a savepoint: one bad op rolls back alone
                return handler(session, op)
        except Exception as exc:  # whatever one op raises, the others commit
            if self.is_broken(exc) or isinstance(exc, apsw.FullError):
                raise
            if not isinstance(exc, TroupeError):
                log.error("store op %s failed alone: %s: %s", type(op).__name__, type(exc).__name__, exc)
            return exc

    def _apply_in_own_transaction(self, session: Session, handler: Any, op: Any) -> Any:
        conn = session.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            result = handler(session, op)
            conn.execute("COMMIT")
            return result
        except Exception as exc:
            self._rollback()
            if self.is_broken(exc):
                raise
            if isinstance(exc, apsw.FullError):
                self._say_full(type(op).__name__)
                return DiskFull(f"the disk under the database ({self._db_path.parent}) is full; this change was not "
                                "saved. Free some space (delete finished runs or files in TROUPE_HOME)")
            if not isinstance(exc, TroupeError):
                log.error("store op %s failed alone: %s: %s", type(op).__name__, type(exc).__name__, exc)
            return exc

    def _say_full(self, op_name: str) -> None:
        """One line per ``FULL_LOG_S`` however many writes a full disk refuses."""
        now = time.monotonic()
        if now - self._full_said < FULL_LOG_S:
            self._full_unsaid += 1
            return
        log.warning("the disk under %s is full: %s and %d more writes since the last such line were not saved; "
                    "they are tried again once there is room", self._db_path, op_name, self._full_unsaid)
        self._full_said, self._full_unsaid = now, 0

    @staticmethod
    def _write_handler(op: Any) -> Any:
        return _WRITES.get(type(op), _no_such_write)


def _no_such_write(session: Session, op: Any) -> Any:
    raise TypeError(f"the store has no write {type(op).__name__}")
