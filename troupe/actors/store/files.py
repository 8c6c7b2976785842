"""Uploaded files: their rows. The bytes live under ``TROUPE_HOME/files``, named by id,
written by the upload route before the row; a file still named by a run that is queued or
executing cannot be deleted. Called only from the store's thread, which orders a row's
writing and its deletion: a row is written only while its bytes are there.

A row records who uploaded it (``uploaded_by``: a session's id, or ``server``; none for a
file stored before the column, the teacher's), which decides who may delete it
(``troupe/web/change_rights.py``). The same content uploaded again by someone else stays its
first uploader's, name and all, unless the teacher's upload takes it over: otherwise a
student could make the teacher's dataset theirs (and delete it) by uploading its bytes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import apsw

from troupe.actors.errors import FileInUse, FileNotFound, UploadDeleted
from troupe.actors.store.table import Session, Table
from troupe.protocol import events as ev

_COLUMNS = ("id", "name", "size", "sha256", "created_at", "uploaded_by")

# Messages ----------------------------------------------------------------------


@dataclass(frozen=True)
class AddFile:
    """The same content uploaded again is the same file (its id is its hash's head).
    ``uploaded_by``: the uploader (None: a request without a session); ``takes_over``:
    whether this upload makes an existing row its uploader's (the teacher's does)."""

    file: Mapping[str, Any]
    uploaded_by: str | None = None
    takes_over: bool = False


@dataclass(frozen=True)
class DeleteFile:
    file_id: str


@dataclass(frozen=True)
class ListFiles:
    file_id: str | None = None  # one file's row (none: a list without it), or every file


# SQL ---------------------------------------------------------------------------


def add(session: Session, op: AddFile) -> dict[str, Any]:
    file = op.file
    if not (session.runs_dir.parent / "files" / file["id"]).is_file():
        # The same content's DELETE came between the bytes' arrival and this row.
        raise UploadDeleted(f"file {file['id']} was deleted while it was uploaded; nothing was kept, send it again")
    conn = session.conn
    held = list_files(conn, file["id"])
    if held and not op.takes_over and held[0]["uploaded_by"] != op.uploaded_by:
        return held[0]  # another's upload of the same bytes: theirs it stays
    conn.execute("INSERT OR REPLACE INTO files(id, name, size, sha256, created_at, uploaded_by) "
                 "VALUES (?, ?, ?, ?, ?, ?)",
                 (file["id"], file["name"], file["size"], file["sha256"], ev.utc_now(), op.uploaded_by))
    return list_files(conn, file["id"])[0]


def list_files(conn: apsw.Connection, file_id: str | None = None) -> list[dict[str, Any]]:
    query = f"SELECT {', '.join(_COLUMNS)} FROM files" + (" WHERE id = ?" if file_id else "") + " ORDER BY created_at"
    return [dict(zip(_COLUMNS, row, strict=True)) for row in conn.execute(query, (file_id,) if file_id else ())]


def delete(session: Session, file_id: str) -> None:
    if not list_files(session.conn, file_id):
        raise FileNotFound(f"no uploaded file {file_id}")
    users = [run_id for (run_id,) in session.conn.execute(
        "SELECT id FROM runs WHERE status IN ('queued', 'running', 'disconnected') AND graph LIKE ?",
        (f'%"upload:{file_id}"%',))]
    if users:
        raise FileInUse(f"file {file_id} is read by run(s) {', '.join(users[:10])}, which are not over; delete it "
                        "once they are")
    session.conn.execute("DELETE FROM files WHERE id = ?", (file_id,))
    (session.runs_dir.parent / "files" / file_id).unlink(missing_ok=True)


WRITES: Table = {
    AddFile: add,
    DeleteFile: lambda s, op: delete(s, op.file_id),
}
READS: Table = {
    ListFiles: lambda s, m: list_files(s.conn, m.file_id),
}
