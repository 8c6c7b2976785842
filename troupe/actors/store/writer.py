"""How a batch of writes becomes one transaction on a connection: the one place that
writes SQLite (DESIGN section 3).

The store's thread applies batches with a ``Writer`` on its own connection. The store's
asyncio face keeps a second ``Writer`` on a connection of its own and applies small
batches of the hot writes (a run's row, its events) on the loop: handing a batch to the
thread and its answer back costs two thread wake-ups, about 100 us of CPU on a VM, more
than SQLite takes to commit it. WAL lets both connections live side by side; the client
sends one batch at a time, whichever applies it, so writes keep their order and the two
never wait for each other's lock.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import apsw

import troupe.actors.store.artifacts as artifacts
import troupe.actors.store.events as events
import troupe.actors.store.files as files
import troupe.actors.store.flavors as flavors
import troupe.actors.store.logged as logged
import troupe.actors.store.logins as logins
import troupe.actors.store.memory as memory
import troupe.actors.store.metric_pages as metric_pages
import troupe.actors.store.retention as retention
import troupe.actors.store.room as room
import troupe.actors.store.run_list as run_list
import troupe.actors.store.runs as runs
import troupe.actors.store.studies as studies
import troupe.actors.store.submitters as submitters
import troupe.actors.store.sweeps as sweeps
import troupe.actors.store.workers as workers
from troupe.actors.store.schema import open_database
from troupe.actors.store.table import Session, Table
from troupe.protocol.errors import DatabaseDamaged, DiskFull, TroupeError

log = logging.getLogger("troupe.store")
FULL_LOG_S = 30.0
_FULL_SAID: dict[str, list[float]] = {}  # database path -> [when the last line was, writes since]

CONCERNS = (runs, retention, run_list, events, metric_pages, artifacts, sweeps, studies, workers, memory, flavors,
            files, logins, submitters, logged, room)
_WRITES: Table = {kind: handler for module in CONCERNS for kind, handler in module.WRITES.items()}
_READS: Table = {kind: handler for module in CONCERNS for kind, handler in module.READS.items()}
# What outlives a run copies its result from it when it ends or before it is deleted:
# each harvest, with the run column that says a run is one of its own.
_HARVESTS = ((sweeps.harvest, "sweep_id"), (studies.harvest, "study_id"))


def is_broken(error: BaseException) -> bool:
    """Whether ``error`` means the database itself is gone (the store restarts). A damaged
    page is not: it fails what touches it (``DatabaseDamaged``), and a restart would meet
    it again on the next read of it, until the supervisor gave the whole server up."""
    return isinstance(error, apsw.CantOpenError | apsw.IOError | apsw.NotADBError)


def damaged(db_path: Path, error: apsw.CorruptError) -> DatabaseDamaged:
    log.error("the database %s is damaged where a request read or wrote: %s", db_path, error)
    return DatabaseDamaged(f"this part of the database ({db_path}) is damaged: {error}. The rest still serves; stop "
                           "the server and recover the file (sqlite3 troupe.db .recover) from a copy")


class Writer:
    """One connection's writes: a batch is one ``BEGIN IMMEDIATE`` transaction in which a
    bad op fails alone."""

    def __init__(self, conn: apsw.Connection, db_path: Path, runs_dir: Path) -> None:
        self.conn = conn
        self.session = Session(conn, runs_dir, self._runs_ended)
        self._db_path = db_path
        self._db_file = str(db_path)
        self._inode = os.stat(self._db_file).st_ino
        # One line per FULL_LOG_S for the whole store: the thread's writer and the loop's
        # share it (both meet the same full disk).
        self._full = _FULL_SAID.setdefault(str(db_path), [-FULL_LOG_S, 0])

    @classmethod
    def open(cls, db_path: Path, runs_dir: Path) -> Writer:
        return cls(open_database(db_path), db_path, runs_dir)

    def close(self) -> None:
        self.conn.close()

    def commit(self, ops: Sequence[Any]) -> list[Any]:
        """Applies the batch straight through; only when an op fails is the batch rolled
        back and applied again with a savepoint per op, so that op fails alone. Ops are
        deterministic on the database, so the second pass does what the first would
        have done, minus the failing op. A full disk (where SQLite may drop the whole
        transaction itself) applies each op in its own transaction instead: what fits
        is kept, and each op that did not fit fails alone with ``DiskFull``."""
        self._check_file()
        session = self.session
        handlers = [_WRITES.get(type(op), _no_such_write) for op in ops]
        conn = self.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                results = [handler(session, op) for handler, op in zip(handlers, ops, strict=True)]
            except Exception as exc:
                if is_broken(exc) or isinstance(exc, apsw.FullError):
                    raise
                self._rollback()
                conn.execute("BEGIN IMMEDIATE")
                results = [self._apply_alone(handler, op) for handler, op in zip(handlers, ops, strict=True)]
            conn.execute("COMMIT")
        except apsw.FullError:
            self._rollback()
            results, full = [], False
            for handler, op in zip(handlers, ops, strict=True):
                results.append(self._apply_in_own_transaction(handler, op, full))
                full = full or isinstance(results[-1], DiskFull)
            return results
        except apsw.CorruptError as exc:
            self._rollback()
            raise damaged(self._db_path, exc) from exc
        except BaseException:
            self._rollback()
            raise
        return results

    @staticmethod
    def reads(message: Any) -> bool:
        """Whether ``message`` is a read (any other message is a write)."""
        return type(message) in _READS

    def read(self, message: Any) -> Any:
        try:
            return _READS[type(message)](self.session, message)
        except apsw.CorruptError as exc:
            raise damaged(self._db_path, exc) from exc

    def _runs_ended(self, run_ids: Sequence[str]) -> None:
        # One look at the rows picks the runs each harvest has to read (most runs belong
        # to neither a sweep nor a study).
        conn = self.conn
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

    def _rollback(self) -> None:
        # SQLite may have rolled the transaction back itself (a full disk does): then
        # there is nothing to roll back, and saying so would hide the real error.
        if not self.conn.getautocommit():
            self.conn.execute("ROLLBACK")

    def _apply_alone(self, handler: Any, op: Any) -> Any:
        try:
            with self.conn:  # a savepoint: one bad op rolls back alone
                return handler(self.session, op)
        except Exception as exc:  # whatever one op raises, the others commit
            if is_broken(exc) or isinstance(exc, apsw.FullError):
                raise
            if isinstance(exc, apsw.CorruptError):
                return damaged(self._db_path, exc)
            if not isinstance(exc, TroupeError):
                log.error("store op %s failed alone: %s: %s", type(op).__name__, type(exc).__name__, exc)
            return exc

    def _apply_in_own_transaction(self, handler: Any, op: Any, after_full: bool = False) -> Any:
        """``after_full``: an op before it in the batch did not fit, so its failing is most
        likely that one's consequence (a run's events whose row was not saved): it is
        counted with the full disk's writes, not logged as a fault of its own."""
        conn = self.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            result = handler(self.session, op)
            conn.execute("COMMIT")
            return result
        except Exception as exc:
            self._rollback()
            if is_broken(exc):
                raise
            if isinstance(exc, apsw.FullError) or (after_full and not isinstance(exc, TroupeError)):
                self._say_full(type(op).__name__)
                return DiskFull(f"the disk under the database ({self._db_path.parent}) is full; this change was not "
                                "saved. Free some space (delete finished runs or files in TROUPE_HOME)")
            if not isinstance(exc, TroupeError):
                log.error("store op %s failed alone: %s: %s", type(op).__name__, type(exc).__name__, exc)
            return exc

    def _say_full(self, op_name: str) -> None:
        """One line per ``FULL_LOG_S`` however many writes a full disk refuses."""
        now = time.monotonic()
        said, unsaid = self._full
        if now - said < FULL_LOG_S:
            self._full[1] = unsaid + 1
            return
        log.warning("the disk under %s is full: %s and %d more writes since the last such line were not saved; "
                    "they are tried again once there is room", self._db_path, op_name, unsaid)
        self._full[:] = [now, 0]


def _no_such_write(session: Session, op: Any) -> Any:
    raise TypeError(f"the store has no write {type(op).__name__}")
