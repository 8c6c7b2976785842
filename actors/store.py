"""The Store: one pykka thread actor owning the one apsw connection, the only writer of
the database. Its asyncio face, which batches writes, is ``actors.store_client``.

A ``Commit`` batch is one ``BEGIN IMMEDIATE`` transaction, each op in its own savepoint
so a bad op fails alone.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw
import apsw.bestpractice

from actors import store_queries as q
from actors import store_studies as st
from actors import store_sweeps as sw
from actors import store_workers as wk
from actors.errors import ActorDeadError
from actors.store_schema import MIGRATIONS, SCHEMA_VERSION
from actors.threaded import ThreadActor
from protocol import events as ev
from protocol.errors import TroupeError

log = logging.getLogger("troupe.store")

# Applied once per process, before the first connection (apsw's own advice).
apsw.bestpractice.apply(apsw.bestpractice.recommended)



# Messages: writes --------------------------------------------------------------


@dataclass(frozen=True)
class InsertRun:
    """Answers the new run's queue position, read in the same transaction. A study's
    run comes with its ``attempt`` row, written in the same transaction."""

    row: Mapping[str, Any]
    attempt: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class UpdateRun:
    run_id: str
    fields: Mapping[str, Any]


@dataclass(frozen=True)
class AppendEvents:
    """Events already numbered by their RunActor; ``metric`` events also become
    metric rows. Appending a seq twice is a no-op, so a retried write is harmless."""

    run_id: str
    events: tuple[Mapping[str, Any], ...]
    # A worker run: the highest frame counter these events apply (replay dedup).
    counter: int | None = None


@dataclass(frozen=True)
class RecordOutputs:
    """One node's outputs, as summaries. Only the newest ``keep_runs`` runs keep theirs:
    older runs' recorded outputs are evicted."""

    run_id: str
    node_id: str
    outputs: Mapping[str, Any]
    keep_runs: int = 20


@dataclass(frozen=True)
class RecordArtifact:
    run_id: str
    node_id: str | None
    kind: str
    path: str


@dataclass(frozen=True)
class DeleteRun:
    run_id: str


@dataclass(frozen=True)
class Recover:
    """At start: what the last server left unfinished. Returns ``{"interrupted": [run
    ids], "adopted": [rows of worker runs still executing], "queued": [rows kept]}``;
    see ``store_queries.recover``."""

    keep_queued: bool = False
    reason: str = "server_restart"


@dataclass(frozen=True)
class KeepQueuedForNextStart:
    """A stop that leaves worker runs executing keeps the queued runs for the next start."""


@dataclass(frozen=True)
class Prune:
    """Retention: keeps the newest ``keep_last`` runs (active ones count but are never
    removed). Returns the pruned run ids."""

    keep_last: int


@dataclass(frozen=True)
class CreateSweep:
    """A sweep, its variants and all its runs, in one transaction: no partial sweep."""

    sweep: Mapping[str, Any]
    variants: tuple[Mapping[str, Any], ...]
    runs: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True)
class SetSweepState:
    sweep_id: str
    state: str


@dataclass(frozen=True)
class CreateStudy:
    study: Mapping[str, Any]


@dataclass(frozen=True)
class CreatePluginJob:
    """Creates the job and its study in one transaction, unless the plugin already has a
    job under this key: then answers that job (the caller compares the digest)."""

    job: Mapping[str, Any]
    study: Mapping[str, Any]


@dataclass(frozen=True)
class GetPluginJobs:
    plugin_id: str
    job_id: str | None = None


@dataclass(frozen=True)
class UpdateStudy:
    """Fields of the study row: state, halt_reason, budget, active_seconds."""

    study_id: str
    fields: Mapping[str, Any]


@dataclass(frozen=True)
class SetAttemptStatus:
    """A study's own verdict on an attempt (``over_budget``), kept over the run's."""

    study_id: str
    attempt: int
    status: str


@dataclass(frozen=True)
class CreateEnrollment:
    """Answers the token's expiry (epoch seconds)."""

    token: str
    name: str | None
    ttl_s: float
    uses: int


@dataclass(frozen=True)
class RedeemEnrollment:
    """Spends a use of the token on the worker's credential; answers the worker's name."""

    token: str
    name: str | None
    machine_id: str
    credential: str


@dataclass(frozen=True)
class RevokeWorker:
    name: str


@dataclass(frozen=True)
class Commit:
    ops: tuple[Any, ...]


# Messages: reads ---------------------------------------------------------------


@dataclass(frozen=True)
class GetRun:
    run_id: str


@dataclass(frozen=True)
class ListRuns:
    status: str | None = None
    sweep_id: str | None = None
    study_id: str | None = None
    limit: int = 50
    before_seq: int | None = None


@dataclass(frozen=True)
class GetEvents:
    run_id: str
    after: int = 0
    tail: int | None = None
    cap_bytes: int = 0


@dataclass(frozen=True)
class GetMetrics:
    run_id: str


@dataclass(frozen=True)
class GetOutputs:
    """Recorded outputs by node id; one node's when ``node_id`` is given."""

    run_id: str
    node_id: str | None = None


@dataclass(frozen=True)
class GetStudy:
    """The study row and its attempts, each with its run's live status."""

    study_id: str


@dataclass(frozen=True)
class ListStudies:
    state: str | None = None
    plugin_id: str | None = None


@dataclass(frozen=True)
class WorkerForCredential:
    credential: str


@dataclass(frozen=True)
class ListWorkers:
    pass


@dataclass(frozen=True)
class GetSweep:
    sweep_id: str


@dataclass(frozen=True)
class ListSweeps:
    pass


@dataclass(frozen=True)
class QueuedRuns:
    queue_key: str


@dataclass(frozen=True)
class QueuePosition:
    run_id: str


@dataclass(frozen=True)
class StatusCounts:
    pass


@dataclass(frozen=True)
class MaxEnqueueSeq:
    pass


# The actor ---------------------------------------------------------------------


class StoreActor(ThreadActor):
    def __init__(self, name: str, loop: Any, on_exit: Any, db_path: Path, runs_dir: Path) -> None:
        super().__init__(name, loop, on_exit)
        self._db_path = db_path
        self._runs_dir = runs_dir
        self._conn: apsw.Connection | None = None
        self._inode: int | None = None

    def on_start(self) -> None:
        try:
            self._conn = open_database(self._db_path)
            self._inode = self._db_path.stat().st_ino
        except Exception as exc:  # pykka would only log it and keep the actor running
            log.error("cannot open the database %s: %s", self._db_path, exc)
            self.mark_broken(exc)

    def on_stop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        super().on_stop()

    def is_broken(self, error: Exception) -> bool:
        return isinstance(error, apsw.CantOpenError | apsw.IOError | apsw.CorruptError | apsw.NotADBError)

    @property
    def conn(self) -> apsw.Connection:
        if self._conn is None:
            raise ActorDeadError("the store is closed")
        return self._conn

    def handle(self, message: Any) -> Any:
        match message:
            case Commit(ops):
                return self._commit(ops)
            case GetRun(run_id):
                return q.get_run(self.conn, run_id)
            case ListRuns():
                return q.list_runs(self.conn, message)
            case GetEvents():
                return q.get_events(self.conn, message.run_id, message.after, message.tail, message.cap_bytes)
            case GetMetrics(run_id):
                return q.get_metrics(self.conn, run_id)
            case GetOutputs(run_id, node_id):
                return q.get_outputs(self.conn, run_id, node_id)
            case GetStudy(study_id):
                return st.get_study(self.conn, study_id)
            case ListStudies(state, plugin_id):
                return st.list_studies(self.conn, state, plugin_id)
            case GetPluginJobs(plugin_id, job_id):
                return st.plugin_jobs(self.conn, plugin_id, job_id)
            case WorkerForCredential(credential):
                return wk.worker_for(self.conn, credential)
            case ListWorkers():
                return wk.list_workers(self.conn)
            case GetSweep(sweep_id):
                return sw.get_sweep(self.conn, sweep_id)
            case ListSweeps():
                return sw.list_sweeps(self.conn)
            case QueuedRuns(queue_key):
                return q.queued_runs(self.conn, queue_key)
            case QueuePosition(run_id):
                return q.queue_position(self.conn, run_id)
            case StatusCounts():
                return q.status_counts(self.conn)
            case MaxEnqueueSeq():
                return q.max_enqueue_seq(self.conn)
            case _:
                # A lone write is a batch of one.
                outcome = self._commit((message,))[0]
                if isinstance(outcome, Exception):
                    raise outcome
                return outcome

    def _check_file(self) -> None:
        # SQLite keeps writing to an unlinked file without a word; every write would be
        # lost at the next start. Treat a removed or replaced file as a broken store.
        try:
            inode = self._db_path.stat().st_ino
        except OSError:
            inode = None
        if inode != self._inode:
            raise apsw.CantOpenError(f"the database file {self._db_path} was removed or replaced")

    def _commit(self, ops: tuple[Any, ...]) -> list[Any]:
        self._check_file()
        conn = self.conn
        results: list[Any] = []
        conn.execute("BEGIN IMMEDIATE")
        try:
            for op in ops:
                try:
                    with conn:  # a savepoint: one bad op rolls back alone
                        results.append(self._apply(op))
                except Exception as exc:  # whatever one op raises, the others commit
                    if self.is_broken(exc):
                        raise
                    if not isinstance(exc, TroupeError):
                        log.error("store op %s failed alone: %s: %s", type(op).__name__, type(exc).__name__, exc)
                    results.append(exc)
            conn.execute("COMMIT")
        except BaseException:
            if not conn.getautocommit():
                conn.execute("ROLLBACK")
            raise
        return results

    def _apply(self, op: Any) -> Any:
        conn = self.conn
        match op:
            case InsertRun(row, attempt):
                q.insert_run(conn, row)
                if attempt is not None:
                    st.insert_attempt(conn, attempt)
                return q.queue_position(conn, row["id"])
            case UpdateRun(run_id, fields):
                q.update_run(conn, run_id, fields)
                if fields.get("status") in ev.TERMINAL_STATES:
                    sw.harvest(conn, [run_id])
                    st.harvest(conn, [run_id])
            case AppendEvents(run_id, events, counter):
                q.append_events(conn, run_id, events, counter)
            case KeepQueuedForNextStart():
                q.keep_queued_for_next_start(conn)
            case RecordOutputs(run_id, node_id, outputs, keep_runs):
                q.record_outputs(conn, run_id, node_id, outputs, keep_runs)
            case RecordArtifact(run_id, node_id, kind, path):
                conn.execute(
                    "INSERT INTO artifacts(run_id, node_id, kind, path, created_at) VALUES (?, ?, ?, ?, ?)",
                    (run_id, node_id, kind, path, ev.utc_now()),
                )
            case DeleteRun(run_id):
                q.check_deletable(conn, run_id)
                self._delete_runs([run_id])
            case Recover(keep_queued, reason):
                found = q.recover(conn, reason, ev.utc_now(), keep_queued)
                sw.harvest(conn, sw.sweep_run_ids(conn, found["interrupted"]))
                st.harvest(conn, found["interrupted"])
                return found
            case Prune(keep_last):
                pruned = q.prunable(conn, keep_last)
                self._delete_runs([run_id for run_id, _ in pruned])
                for run_id, status in pruned:
                    self._remove_run_dirs(run_id, keep_checkpoints=status == ev.INTERRUPTED)
                return [run_id for run_id, _ in pruned]
            case CreateSweep(sweep, variants, runs):
                sw.create_sweep(conn, sweep, variants, runs)
            case SetSweepState(sweep_id, state):
                sw.set_state(conn, sweep_id, state)
            case CreateEnrollment(token, name, ttl_s, uses):
                return wk.create_enrollment(conn, token, name, ttl_s, uses, ev.utc_now())
            case RedeemEnrollment(token, name, machine_id, credential):
                return wk.redeem(conn, token, name, machine_id, credential, ev.utc_now())
            case RevokeWorker(name):
                return wk.revoke(conn, name)
            case CreateStudy(study):
                st.create_study(conn, study)
            case CreatePluginJob(job, study):
                return st.create_plugin_job(conn, job, study)
            case UpdateStudy(study_id, fields):
                st.update_study(conn, study_id, fields)
            case SetAttemptStatus(study_id, attempt, status):
                st.set_attempt_status(conn, study_id, attempt, status)
            case _:
                raise TypeError(f"the store has no write {type(op).__name__}")
        return None

    def _delete_runs(self, run_ids: list[str]) -> None:
        # Sweep and study results are harvested first: their tables outlive their runs.
        sw.harvest(self.conn, sw.sweep_run_ids(self.conn, run_ids))
        st.harvest(self.conn, run_ids)
        for run_id in run_ids:
            self.conn.execute("DELETE FROM runs WHERE id = ?", (run_id,))

    def _remove_run_dirs(self, run_id: str, keep_checkpoints: bool) -> None:
        # Retention, unlike a user's delete, also removes what a run wrote on its own;
        # an interrupted run keeps its checkpoints, its resume point after a crash.
        run_dir = self._runs_dir / run_id
        if not run_dir.is_dir():
            return
        for child in run_dir.iterdir():
            if keep_checkpoints and child.name == "checkpoints":
                continue
            if child.is_dir():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
        if not any(run_dir.iterdir()):
            run_dir.rmdir()


def open_database(path: Path) -> apsw.Connection:
    """Opens (creating if needed) and migrates the database."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = apsw.Connection(str(path))
    conn.execute("PRAGMA synchronous=NORMAL")
    version = int(conn.execute("PRAGMA user_version").fetchall()[0][0])  # type: ignore[arg-type]
    if version > SCHEMA_VERSION:
        raise RuntimeError(f"{path} has schema version {version}; this troupe knows up to {SCHEMA_VERSION}")
    for number in range(version, SCHEMA_VERSION):
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(MIGRATIONS[number])
            conn.execute(f"PRAGMA user_version={number + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        log.info("migrated %s to schema version %d", path, number + 1)
    return conn
