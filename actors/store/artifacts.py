"""A run's artifacts: the files it wrote (checkpoints, saved models), each row saying
where the bytes live (``local``/``transfer``: under the run's folder here; ``mount``: a
storage label's folder; ``s3``: the bucket), its path relative to there, size and
sha256. A row is written only once its file is whole where it lives, so a listed
artifact can always be read in full. Called only from the store's thread."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import apsw

from actors.store.table import Session, Table
from protocol import events as ev

_COLUMNS = ("id", "node_id", "kind", "path", "backend", "label", "size", "sha256", "created_at")

# Messages ----------------------------------------------------------------------


@dataclass(frozen=True)
class RecordArtifact:
    run_id: str
    node_id: str | None
    kind: str
    path: str
    backend: str
    label: str | None
    size: int
    sha256: str


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
    """The same file recorded twice (a transfer retried after its answer was lost) is
    one row."""
    for (found,) in s.conn.execute("SELECT id FROM artifacts WHERE run_id = ? AND path = ? AND sha256 = ?",
                                   (op.run_id, op.path, op.sha256)):
        return int(found)
    s.conn.execute(
        "INSERT INTO artifacts(run_id, node_id, kind, path, backend, label, size, sha256, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (op.run_id, op.node_id, op.kind, op.path, op.backend, op.label, op.size, op.sha256, ev.utc_now()),
    )
    return int(s.conn.last_insert_rowid())


def _get(s: Session, m: GetArtifact) -> dict[str, Any] | None:
    found = artifacts(s.conn, m.run_id, m.artifact_id)
    return found[0] if found else None


WRITES: Table = {RecordArtifact: _record}
READS: Table = {GetArtifact: _get}
