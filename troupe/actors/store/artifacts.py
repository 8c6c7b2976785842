"""A run's artifacts: the files it wrote (checkpoints, saved models), each row saying
where the bytes live (``local``/``transfer``: under the run's folder here; ``mount``: a
storage label's folder; ``s3``: the bucket), its path relative to there, size and
sha256, and its state: ``stored`` once its file is whole where it lives (only then can
it be read), ``pending`` while a worker's outbox still holds it, ``failed`` with the
reason when it could not be kept, ``removed`` once its run let it go (a checkpoint past
its node's ``keep_checkpoints``: the row stays, so a copy that arrives late is refused
rather than stored again). Called only from the store's thread."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import apsw

from troupe.actors.errors import ArtifactNotFound, RunNotFound
from troupe.actors.store.events import append_events
from troupe.actors.store.table import Session, Table
from troupe.protocol import events as ev

_COLUMNS = ("id", "node_id", "kind", "path", "backend", "label", "size", "sha256", "created_at", "state", "reason")
STORED, PENDING, FAILED, REMOVED = "stored", "pending", "failed", "removed"

# Messages ----------------------------------------------------------------------


@dataclass(frozen=True)
class RecordArtifact:
    run_id: str
    node_id: str | None
    kind: str
    path: str
    backend: str
    label: str | None
    size: int | None
    sha256: str | None
    state: str = STORED
    reason: str | None = None


@dataclass(frozen=True)
class RecordLateArtifact:
    """A worker's file that arrived after its run ended (kept in its outbox while the
    control plane was away): the row is stored and the run's ``artifact`` event written
    with the next seq, here, since no RunActor holds the run any more. Replies the event."""

    artifact: RecordArtifact


@dataclass(frozen=True)
class RemoveArtifact:
    """A file the run let go of (its ``artifact_removed`` event): the row says ``removed``,
    and the copy this server holds in the run's folder (one a worker sent) is deleted;
    the run's own process deleted its copy, the outbox's, and the label's or the
    bucket's."""

    run_id: str
    path: str


@dataclass(frozen=True)
class GetArtifact:
    """The row, or None."""

    run_id: str
    artifact_id: int


# SQL ---------------------------------------------------------------------------


def artifacts(conn: apsw.Connection, run_id: str, artifact_id: int | None = None) -> list[dict[str, Any]]:
    query = f"SELECT {', '.join(_COLUMNS)} FROM artifacts WHERE run_id = ?"
    args: tuple[Any, ...] = (run_id,)
    if artifact_id is not None:
        query, args = query + " AND id = ?", (run_id, artifact_id)
    return [dict(zip(_COLUMNS, row, strict=True)) for row in conn.execute(query + " ORDER BY id", args)]


def _record(s: Session, op: RecordArtifact) -> int:
    """One row per file of a run: the same file recorded twice (a transfer retried after
    its answer was lost) is one row, and a pending or failed one becomes what it is now.
    A run deleted or pruned while its file arrived is said so (a 404: the worker drops
    the file), never a broken foreign key."""
    if not s.conn.execute("SELECT 1 FROM runs WHERE id = ?", (op.run_id,)).fetchall():
        raise RunNotFound(f"no run {op.run_id} (it was removed while its file {op.path} arrived)")
    for found, state in s.conn.execute("SELECT id, state FROM artifacts WHERE run_id = ? AND path = ? "
                                       "ORDER BY id DESC LIMIT 1", (op.run_id, op.path)):
        if state == REMOVED and op.state != REMOVED:  # a worker's copy that arrived after its run let it go
            raise ArtifactNotFound(f"run {op.run_id} removed {op.path} (past its node's keep_checkpoints)",
                                   code="artifact_removed")
        if state != STORED or op.state == STORED:
            s.conn.execute("UPDATE artifacts SET node_id = ?, kind = ?, backend = ?, label = ?, size = ?, sha256 = ?, "
                           "state = ?, reason = ? WHERE id = ?",
                           (op.node_id, op.kind, op.backend, op.label, op.size, op.sha256, op.state, op.reason, found))
        return int(found)
    s.conn.execute(
        "INSERT INTO artifacts(run_id, node_id, kind, path, backend, label, size, sha256, created_at, state, reason) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (op.run_id, op.node_id, op.kind, op.path, op.backend, op.label, op.size, op.sha256, ev.utc_now(), op.state,
         op.reason),
    )
    return int(s.conn.last_insert_rowid())


def _record_late(s: Session, op: RecordLateArtifact) -> dict[str, Any]:
    row = op.artifact
    _record(s, row)
    (last,), = s.conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events WHERE run_id = ?", (row.run_id,))
    payload = {"kind": row.kind, "path": row.path, "backend": row.backend, "label": row.label, "size": row.size,
               "sha256": row.sha256, "late": True}
    event = ev.make_event(int(last) + 1, ev.ARTIFACT, row.node_id, payload, 0)
    append_events(s.conn, row.run_id, (event,))
    return event


def _remove(s: Session, op: RemoveArtifact) -> None:
    rows = s.conn.execute("SELECT id, backend FROM artifacts WHERE run_id = ? AND path = ?",
                          (op.run_id, op.path)).fetchall()
    s.conn.execute("UPDATE artifacts SET state = ?, reason = NULL WHERE run_id = ? AND path = ?",
                   (REMOVED, op.run_id, op.path))
    if any(backend in ("local", "transfer") for _, backend in rows) and ev.outside_run_dir(op.path) is None:
        run_dir = s.runs_dir / op.run_id
        where = run_dir / op.path
        with contextlib.suppress(OSError):
            if where.resolve().is_relative_to(run_dir.resolve()) and not where.is_symlink():
                where.unlink(missing_ok=True)


def _get(s: Session, m: GetArtifact) -> dict[str, Any] | None:
    found = artifacts(s.conn, m.run_id, m.artifact_id)
    return found[0] if found else None


WRITES: Table = {RecordArtifact: _record, RecordLateArtifact: _record_late, RemoveArtifact: _remove}
READS: Table = {GetArtifact: _get}
