"""Runs: their rows, their place in line, and what a restart does to them (retention:
``retention.py``).

Called only from the store's thread. A run's log (events, metrics, outputs, artifacts)
is ``events.py``.
"""

from __future__ import annotations

import json
import shutil
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import apsw

from troupe.actors.errors import CheckpointGone, RunNeeded, RunNotFound, RunStillActive
from troupe.actors.store.artifacts import artifacts
from troupe.actors.store.events import EventRow, append_events, event_rows
from troupe.actors.store.logged import logged_of
from troupe.actors.store.run_index import forget_runs, index_run
from troupe.actors.store.studies import insert_attempt
from troupe.actors.store.table import Session, Table
from troupe.protocol import events as ev
from troupe.protocol import jsonsafe
from troupe.protocol.api import held_devices
from troupe.protocol.run_record import RunRecord
from troupe.subprocess_runner.sweeps import with_params

# Messages: writes --------------------------------------------------------------


@dataclass(frozen=True)
class InsertRun:
    """Answers the new run's queue position, read in the same transaction. A study's
    run comes with its ``attempt`` row, written in the same transaction."""

    record: RunRecord
    attempt: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class UpdateRun:
    run_id: str
    fields: Mapping[str, Any]


@dataclass(frozen=True)
class DeleteRun:
    run_id: str


@dataclass(frozen=True)
class Recover:
    """At start: what the last server left unfinished. Returns ``{"interrupted": [run
    ids], "adopted": [rows of worker runs still executing], "queued": [rows kept]}``;
    see ``recover``."""

    keep_queued: bool = False
    reason: str = "server_restart"


@dataclass(frozen=True)
class KeepQueuedForNextStart:
    """A stop that leaves worker runs executing keeps the queued runs for the next start."""


# Messages: reads ---------------------------------------------------------------


@dataclass(frozen=True)
class GetRun:
    run_id: str


@dataclass(frozen=True)
class ReadStream:
    """What a run's stream sends first, read together: None when there is no such run,
    else a page of its events after ``after`` (capped; rows as stored), the ``after`` to
    read on from when the cap cut the page, the run's queue position, and whether its log
    ended at or before ``after`` (a reader that has it all: its stream ends at once)."""

    run_id: str
    after: int = 0
    cap_bytes: int = 0


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


# SQL ---------------------------------------------------------------------------

RUN_COLUMNS = (
    "id", "name", "status", "device", "queue_key", "lane", "editor_session", "seed", "deterministic",
    "record_outputs", "graph", "options", "warnings", "enqueue_seq", "created_at", "started_at",
    "finished_at", "error", "error_detail", "sweep_id", "sweep_variant", "study_id", "worker",
    "holds", "worker_counter", "graph_digest", "memory_budget_mib", "memory_budget_source", "peak_memory_mib",
    "peak_memory_exact", "out_of_memory", "one_shot", "duration_s", "execution_facts", "graph_base", "rerun_of",
    "resumed_from", "progress", "note", "submitted_by",
)
_JSON_COLUMNS = ("graph", "options", "warnings", "holds", "execution_facts", "resumed_from", "progress")
UPDATABLE = frozenset(RUN_COLUMNS) - {"id", "enqueue_seq", "created_at", "graph", "graph_base"}

TERMINAL_SQL = "('succeeded', 'failed', 'cancelled', 'interrupted')"

# queue_position: 1 + the queued-lane runs still queued ahead on the same key.
_POSITION = """
    CASE WHEN r.status = 'queued' AND r.lane = 'queued' THEN 1 + (
        SELECT COUNT(*) FROM runs a
        WHERE a.queue_key = r.queue_key AND a.status = 'queued' AND a.lane = 'queued'
          AND a.enqueue_seq < r.enqueue_seq)
    END
"""
# final_loss: the last val_loss, else the last train_loss.
# The last val_loss point, else the last train_loss point, as [value, non_finite]. Each
# read by the (run_id, series, seq) index, whatever the planner's statistics say: a walk
# of the run's primary-key range instead reads every point of a run without that series
# (a million for a long Ticker run, at each read of its row).
_FINAL_LOSS = """
    COALESCE(
        (SELECT json_array(value, non_finite) FROM metrics m INDEXED BY metrics_series
         WHERE m.run_id = r.id AND m.series = 'val_loss' ORDER BY m.seq DESC LIMIT 1),
        (SELECT json_array(value, non_finite) FROM metrics m INDEXED BY metrics_series
         WHERE m.run_id = r.id AND m.series = 'train_loss' ORDER BY m.seq DESC LIMIT 1))
"""
# submitted_label: the name its submitter's session goes by now (a student may name
# themselves after submitting); the server's own token has no session row.
_SUBMITTER = "CASE WHEN r.submitted_by = 'server' THEN 'server token' ELSE " \
    "(SELECT s.label FROM sessions s WHERE s.id = r.submitted_by) END"
SELECT_RUNS = (f"SELECT {', '.join('r.' + c for c in RUN_COLUMNS)}, {_POSITION}, {_FINAL_LOSS}, {_SUBMITTER} "
               "FROM runs r")
# What a row of the Runs list never shows: its graph (a sweep's runs share a base of many
# MB), the warnings and the facts of its execution. Left in the database, they cost a list
# read nothing: decoding them was a third of a page's server CPU (2.2 ms for 50 runs).
UNLISTED = ("graph", "graph_base", "warnings", "holds", "execution_facts", "resumed_from")
SELECT_LISTED = (f"SELECT {', '.join('NULL' if c in UNLISTED else 'r.' + c for c in RUN_COLUMNS)}, {_POSITION}, "
                 f"{_FINAL_LOSS}, {_SUBMITTER} FROM runs r")


class _Bases:
    """Decoded base graphs by digest, a few at a time (a sweep's runs are read together)."""

    def __init__(self, size: int = 8) -> None:
        self._found: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._size = size

    def get(self, conn: apsw.Connection, digest: str) -> dict[str, Any]:
        found = self._found.get(digest)
        if found is None:
            text = conn.execute("SELECT graph FROM graph_bases WHERE digest = ?", (digest,)).fetchall()
            found = json.loads(str(text[0][0])) if text else {"nodes": [], "edges": []}
            self._found[digest] = found
            if len(self._found) > self._size:
                self._found.popitem(last=False)
        self._found.move_to_end(digest)
        return found


_BASES = _Bases()


def whole_graph(conn: apsw.Connection, row: dict[str, Any]) -> dict[str, Any]:
    """A run of a sweep or a study stores its params over a shared base graph."""
    if row.get("graph_base"):
        row["graph"] = with_params(_BASES.get(conn, row["graph_base"]), row["graph"] or {})
    return row


def run_row(values: tuple[Any, ...]) -> dict[str, Any]:
    row = dict(zip(RUN_COLUMNS, values[: len(RUN_COLUMNS)], strict=True))
    row["queue_position"], final, row["submitted_label"] = values[len(RUN_COLUMNS):]
    # A diverged loss is null with what it was: "nan", "inf" or "-inf".
    row["final_loss"], row["final_loss_non_finite"] = json.loads(str(final)) if final is not None else (None, None)
    row["deterministic"] = bool(row["deterministic"])
    row["record_outputs"] = bool(row["record_outputs"])
    row["out_of_memory"] = bool(row["out_of_memory"])
    row["one_shot"] = bool(row["one_shot"])
    if row["peak_memory_exact"] is not None:
        row["peak_memory_exact"] = bool(row["peak_memory_exact"])
    for key in _JSON_COLUMNS:
        row[key] = json.loads(row[key]) if row[key] is not None else None
    row["devices"] = held_devices(row["options"], row["device"])
    return row


def listed_row(values: tuple[Any, ...]) -> dict[str, Any]:
    """A row read by ``SELECT_LISTED``: without the columns it left out, so that a reader
    who needs one of them fails loudly rather than reading a null."""
    row = run_row(values)
    for key in UNLISTED:
        del row[key]
    return row


def _encode(key: str, value: Any) -> Any:
    if key in _JSON_COLUMNS:
        return jsonsafe.dumps_stored(value)
    if isinstance(value, bool):
        return int(value)
    return value


def insert_run(conn: apsw.Connection, record: RunRecord) -> None:
    """A variant's run (``shared_graph``): the base is stored once for every run that
    names it, and the run's graph column holds its params."""
    values = record.columns()
    shared = record.shared_graph
    if shared is not None:
        conn.execute("INSERT OR IGNORE INTO graph_bases(digest, graph) VALUES (?, ?)", (shared.digest, shared.text))
        values.update(graph=dict(shared.params), graph_base=shared.digest)
    conn.execute(
        f"INSERT OR IGNORE INTO runs({', '.join(values)}) VALUES ({', '.join('?' for _ in values)})",
        tuple(_encode(k, v) for k, v in values.items()),
    )
    if conn.changes():  # a repeated insert (an ask that timed out, sent again) is indexed once
        index_run(conn, record.enqueue_seq, record.graph, record.secret_params)


def update_run(conn: apsw.Connection, run_id: str, fields: Mapping[str, Any]) -> None:
    unknown = set(fields) - UPDATABLE
    if unknown:
        raise ValueError(f"cannot update run columns {sorted(unknown)}")
    if not fields:
        return
    assignments = ", ".join(f"{k} = ?" for k in fields)
    conn.execute(
        f"UPDATE runs SET {assignments} WHERE id = ?", (*(_encode(k, v) for k, v in fields.items()), run_id)
    )


def tags_of(conn: apsw.Connection, run_ids: list[str]) -> dict[str, list[str]]:
    """Each run's tags, sorted."""
    found: dict[str, list[str]] = {run_id: [] for run_id in run_ids}
    for start in range(0, len(run_ids), 500):
        chunk = run_ids[start:start + 500]
        for run_id, tag in conn.execute(f"SELECT run_id, tag FROM run_tags WHERE run_id IN "
                                        f"({', '.join('?' for _ in chunk)}) ORDER BY tag", chunk):
            found[str(run_id)].append(str(tag))
    return found


def get_run(conn: apsw.Connection, run_id: str) -> dict[str, Any] | None:
    found = conn.execute(f"{SELECT_RUNS} WHERE r.id = ?", (run_id,)).fetchall()
    if not found:
        return None
    row = whole_graph(conn, run_row(found[0]))
    row["artifacts"] = artifacts(conn, run_id)
    row["tags"] = tags_of(conn, [run_id])[run_id]
    row.update(logged_of(conn, run_id))  # logged_params, logged_tags
    row["reruns"] = [str(r) for (r,) in conn.execute("SELECT id FROM runs WHERE rerun_of = ? ORDER BY enqueue_seq",
                                                     (run_id,))]
    return row


def queued_runs(conn: apsw.Connection, queue_key: str) -> list[tuple[Any, ...]]:
    """The queued runs of a key in FIFO order, with the devices each asks for when it
    names several (``target.devices``), its memory budget and its expected length."""
    found = []
    for run_id, seq, seed, options, budget, duration, submitter in conn.execute(
        "SELECT id, enqueue_seq, seed, options, memory_budget_mib, duration_s, submitted_by FROM runs "
        "WHERE queue_key = ? AND status = 'queued' AND lane = 'queued' ORDER BY enqueue_seq",
        (queue_key,),
    ):
        devices = held_devices(json.loads(str(options or "{}")), "")
        found.append((str(run_id), int(seq), seed is not None, tuple(devices) if len(devices) > 1 else (),
                      int(budget) if budget is not None else None,
                      float(duration) if duration is not None else None, str(submitter or "")))
    return found


def queue_position(conn: apsw.Connection, run_id: str) -> int | None:
    found = conn.execute(f"SELECT {_POSITION} FROM runs r WHERE r.id = ?", (run_id,)).fetchall()
    return int(found[0][0]) if found and found[0][0] is not None else None


def read_stream(conn: apsw.Connection, query: ReadStream
                ) -> tuple[list[EventRow], int | None, int | None, bool] | None:
    found = conn.execute(f"SELECT {_POSITION} FROM runs r WHERE r.id = ?", (query.run_id,)).fetchall()
    if not found:
        return None
    rows, next_after = event_rows(conn, query.run_id, query.after, None, query.cap_bytes)
    # Seqs start at 1: a reader that has none has nothing that could have ended.
    ended = query.after > 0 and bool(conn.execute(
        "SELECT 1 FROM events WHERE run_id = ? AND type = ? AND seq <= ? LIMIT 1",
        (query.run_id, ev.RUN_FINISHED, query.after)).fetchall())
    return rows, next_after, int(found[0][0]) if found[0][0] is not None else None, ended


def status_counts(conn: apsw.Connection) -> dict[str, int]:
    rows = conn.execute("SELECT status, COUNT(*) FROM runs GROUP BY status")
    return {str(status): int(count) for status, count in rows}


def max_enqueue_seq(conn: apsw.Connection) -> int:
    return int(conn.execute("SELECT COALESCE(MAX(enqueue_seq), 0) FROM runs").fetchall()[0][0])  # type: ignore[arg-type]  # apsw types a cell as any SQLite value; MAX/COUNT give an integer


def check_deletable(conn: apsw.Connection, run_id: str) -> None:
    found = conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchall()
    if not found:
        raise RunNotFound(f"no run {run_id}")
    if found[0][0] not in ev.TERMINAL_STATES:
        raise RunStillActive(f"run {run_id} is {found[0][0]}; cancel it before deleting it")
    for (resume,) in conn.execute("SELECT id FROM runs WHERE rerun_of = ? AND resumed_from IS NOT NULL AND status "
                                  "IN ('queued', 'running', 'disconnected') LIMIT 1", (run_id,)):
        raise RunNeeded(f"run {resume} resumes from run {run_id}'s checkpoint and has not ended; delete {run_id} "
                        "once it has (or cancel it)")


def recover(conn: apsw.Connection, reason: str, now: str, keep_queued: bool) -> dict[str, list[Any]]:
    """What the last server left unfinished. Worker runs still executing are adopted
    (returned with the next seq of their log); queued runs are kept when asked (the
    setting, or a stop that left them for this start); everything else becomes
    interrupted, with a terminal event so a watcher of its stream ends. ``ran_here``:
    the interrupted runs that were running in the last server's process."""
    marker = conn.execute("SELECT value FROM server_state WHERE key = 'queued_kept'").fetchall()
    keep_queued = keep_queued or bool(marker)
    conn.execute("DELETE FROM server_state WHERE key = 'queued_kept'")
    found: dict[str, list[Any]] = {"interrupted": [], "adopted": [], "queued": [], "ran_here": []}
    stale = conn.execute("SELECT id, status, worker FROM runs WHERE status IN ('queued', 'running', 'disconnected') "
                         "ORDER BY enqueue_seq").fetchall()
    for stale_id, status, worker in stale:
        run_id = str(stale_id)
        next_seq = int(conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE run_id = ?",
                                    (run_id,)).fetchall()[0][0])  # type: ignore[arg-type]  # apsw types a cell as any SQLite value; MAX/COUNT give an integer
        if status != ev.QUEUED and worker is not None:
            found["adopted"].append({**(get_run(conn, run_id) or {}), "adopting": True, "next_seq": next_seq})
            continue
        if status == ev.QUEUED and keep_queued:
            found["queued"].append({**(get_run(conn, run_id) or {}), "next_seq": next_seq})
            continue
        message = "the server stopped before this run finished; submit it again to rerun it"
        conn.execute(
            "UPDATE runs SET status = 'interrupted', finished_at = ?, error = ? WHERE id = ?",
            (now, message, run_id),
        )
        payload = {"status": ev.INTERRUPTED, "error": message, "reason": reason}
        append_events(conn, run_id, [{"seq": next_seq, "type": ev.RUN_FINISHED, "ts": now, "payload": payload}])
        found["interrupted"].append(run_id)
        if status != ev.QUEUED and worker is None:  # its processes may outlive the server that was killed
            found["ran_here"].append(run_id)
    return found


def keep_queued_for_next_start(conn: apsw.Connection) -> None:
    conn.execute("INSERT OR REPLACE INTO server_state(key, value) VALUES ('queued_kept', '1')")


# Handlers ----------------------------------------------------------------------


def _insert(s: Session, op: InsertRun) -> int | None:
    record = op.record
    # Checked in the write itself: a prune (which keeps a run a stored resume needs) or a
    # delete that came first leaves no checkpoint to resume from.
    if record.resumed_from is not None and record.rerun_of is not None and not s.conn.execute(
            "SELECT 1 FROM runs WHERE id = ?", (record.rerun_of,)).fetchall():
        raise CheckpointGone(f"run {record.rerun_of} was removed while its resume was being queued; its checkpoint "
                             "cannot be resumed from")
    insert_run(s.conn, op.record)
    if op.attempt is not None:
        insert_attempt(s.conn, op.attempt)
    return queue_position(s.conn, op.record.id)


def _update(s: Session, op: UpdateRun) -> None:
    update_run(s.conn, op.run_id, op.fields)
    if op.fields.get("status") in ev.TERMINAL_STATES:
        s.runs_ended([op.run_id])


def _recover(s: Session, op: Recover) -> dict[str, list[Any]]:
    found = recover(s.conn, op.reason, ev.utc_now(), op.keep_queued)
    s.runs_ended(found["interrupted"])
    return found


def _delete(s: Session, op: DeleteRun) -> None:
    check_deletable(s.conn, op.run_id)
    delete_runs(s, [op.run_id])
    # A delete keeps the run's checkpoints (weights someone may still load), but not its
    # TensorBoard files: they only chart the metrics the delete removed.
    shutil.rmtree(s.runs_dir / op.run_id / "tensorboard", ignore_errors=True)


def delete_runs(s: Session, run_ids: list[str]) -> None:
    if not run_ids:  # retention after most runs: nothing to prune, no scan of the bases
        return
    # Sweep and study results are harvested first: their tables outlive their runs.
    s.runs_ended(run_ids)
    forget_runs(s.conn, run_ids)
    s.conn.executemany("DELETE FROM runs WHERE id = ?", [(run_id,) for run_id in run_ids])
    s.conn.execute("DELETE FROM graph_bases WHERE NOT EXISTS "
                   "(SELECT 1 FROM runs WHERE runs.graph_base = graph_bases.digest)")


WRITES: Table = {
    InsertRun: _insert,
    UpdateRun: _update,
    DeleteRun: _delete,
    Recover: _recover,
    KeepQueuedForNextStart: lambda s, op: keep_queued_for_next_start(s.conn),
}
READS: Table = {
    GetRun: lambda s, m: get_run(s.conn, m.run_id),
    QueuedRuns: lambda s, m: queued_runs(s.conn, m.queue_key),
    QueuePosition: lambda s, m: queue_position(s.conn, m.run_id),
    ReadStream: lambda s, m: read_stream(s.conn, m),
    StatusCounts: lambda s, m: status_counts(s.conn),
    MaxEnqueueSeq: lambda s, m: max_enqueue_seq(s.conn),
}
