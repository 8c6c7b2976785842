"""Login links and the sessions they open, kept hashed so that a restart logs nobody out
and a copy of the database logs nobody in. Called only from the store's thread.

A link is good for ``uses`` browsers (or terminals) until it expires; each use opens a
session of the link's kind: ``teacher`` (everything), ``class`` (runs, sweeps and
studies, and every read) or ``read`` (reads only)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from actors.store.table import Session, Table
from protocol import events as ev

KINDS = ("teacher", "class", "read")

# Messages ----------------------------------------------------------------------


@dataclass(frozen=True)
class AddLoginLink:
    token_hash: str
    kind: str
    uses: int
    expires_at: float  # epoch seconds


@dataclass(frozen=True)
class UseLoginLink:
    """Spends one use of the link and opens a session; replies the session row, or None
    for a link that is unknown, used up or expired."""

    token_hash: str
    session_hash: str
    session_id: str
    label: str


@dataclass(frozen=True)
class ListSessions:
    pass


@dataclass(frozen=True)
class RevokeSession:
    """Replies whether there was such a session."""

    session_id: str


@dataclass(frozen=True)
class SeenSessions:
    """When sessions were last seen (session id -> ISO time), written now and then."""

    seen: tuple[tuple[str, str], ...]


# SQL ---------------------------------------------------------------------------

_COLUMNS = ("id", "secret_hash", "kind", "label", "created_at", "last_seen_at", "revoked")


def _add_link(s: Session, op: AddLoginLink) -> None:
    s.conn.execute("INSERT INTO login_links(token_hash, kind, uses_left, expires_at, created_at) "
                   "VALUES (?, ?, ?, ?, ?)", (op.token_hash, op.kind, op.uses, op.expires_at, ev.utc_now()))


def _use_link(s: Session, op: UseLoginLink) -> dict[str, Any] | None:
    found = s.conn.execute("SELECT kind, uses_left, expires_at FROM login_links WHERE token_hash = ?",
                           (op.token_hash,)).fetchall()
    if not found:
        return None
    kind, uses_left, expires_at = found[0]
    if int(str(uses_left)) <= 0 or float(str(expires_at)) < time.time():
        return None
    s.conn.execute("UPDATE login_links SET uses_left = uses_left - 1 WHERE token_hash = ?", (op.token_hash,))
    now = ev.utc_now()
    s.conn.execute("INSERT INTO sessions(id, secret_hash, kind, label, created_at, last_seen_at, revoked) "
                   "VALUES (?, ?, ?, ?, ?, ?, 0)", (op.session_id, op.session_hash, kind, op.label[:200], now, now))
    return {"id": op.session_id, "secret_hash": op.session_hash, "kind": str(kind), "label": op.label[:200],
            "created_at": now, "last_seen_at": now, "revoked": False}


def list_sessions(s: Session, _: ListSessions) -> list[dict[str, Any]]:
    rows = s.conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM sessions ORDER BY created_at").fetchall()
    return [{**dict(zip(_COLUMNS, row, strict=True)), "revoked": bool(row[-1])} for row in rows]


def _revoke(s: Session, op: RevokeSession) -> bool:
    s.conn.execute("UPDATE sessions SET revoked = 1 WHERE id = ?", (op.session_id,))
    return s.conn.changes() > 0


def _seen(s: Session, op: SeenSessions) -> None:
    s.conn.executemany("UPDATE sessions SET last_seen_at = ? WHERE id = ?", [(at, sid) for sid, at in op.seen])


WRITES: Table = {AddLoginLink: _add_link, UseLoginLink: _use_link, RevokeSession: _revoke, SeenSessions: _seen}
READS: Table = {ListSessions: list_sessions}
