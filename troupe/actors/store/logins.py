"""Login links and the sessions they open, kept hashed so that a restart logs nobody out
and a copy of the database logs nobody in. Called only from the store's thread.

A link is good for ``uses`` browsers (or terminals) until it expires or is revoked; each
use opens a session of the link's kind: ``teacher`` (everything), ``class`` (runs, sweeps
and studies, and every read) or ``read`` (reads only), which lives no longer than the link
(nor than the server's maximum) and ends with it when the link is revoked. A link's id
is the head of its token's hash: it names the link in lists without giving it away."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from troupe.actors.store.table import Session, Table
from troupe.protocol import events as ev

KINDS = ("teacher", "class", "read")

# Messages ----------------------------------------------------------------------


@dataclass(frozen=True)
class AddLoginLink:
    token_hash: str
    kind: str
    uses: int
    expires_at: float  # epoch seconds
    quotas: Mapping[str, int] | None = None  # limits of the sessions it opens (max_running, ...)
    # The link ``troupe start`` prints: the one the last start printed is revoked, unless
    # a session was opened with it (revoking it would end that session).
    printed_at_start: bool = False


@dataclass(frozen=True)
class UseLoginLink:
    """Spends one use of the link and opens a session; replies the session row, or None
    for a link that is unknown, used up or expired."""

    token_hash: str
    session_hash: str
    session_id: str
    label: str
    max_s: float  # the longest a session may live, whatever its link says


@dataclass(frozen=True)
class ListLoginLinks:
    pass


@dataclass(frozen=True)
class RevokeLoginLink:
    """Revokes the link and the sessions it opened; replies the ids of those sessions,
    or None for no such link."""

    link_id: str


@dataclass(frozen=True)
class ListSessions:
    pass


@dataclass(frozen=True)
class RevokeSession:
    """Replies whether there was such a session."""

    session_id: str


@dataclass(frozen=True)
class NameSession:
    """The name a session goes by in "who is connected" (a student's own)."""

    session_id: str
    label: str


@dataclass(frozen=True)
class SeenSessions:
    """When sessions were last seen (session id -> ISO time), written now and then."""

    seen: tuple[tuple[str, str], ...]


# SQL ---------------------------------------------------------------------------

_COLUMNS = ("id", "secret_hash", "kind", "label", "created_at", "last_seen_at", "revoked", "expires_at", "link_id",
            "quotas")
_LINK_COLUMNS = ("kind", "uses_left", "expires_at", "created_at", "revoked", "quotas")
LINK_ID_CHARS = 16


def _link_id(token_hash: str) -> str:
    return token_hash[:LINK_ID_CHARS]


def _add_link(s: Session, op: AddLoginLink) -> None:
    s.conn.execute("INSERT INTO login_links(token_hash, kind, uses_left, expires_at, created_at, quotas) "
                   "VALUES (?, ?, ?, ?, ?, ?)", (op.token_hash, op.kind, op.uses, op.expires_at, ev.utc_now(),
                                                 json.dumps(dict(op.quotas)) if op.quotas else None))
    if op.printed_at_start:
        _retire_start_link(s)
        s.conn.execute("INSERT OR REPLACE INTO server_state(key, value) VALUES (?, ?)",
                       (_START_LINK, op.token_hash))


_START_LINK = "start_login_link"  # server_state: the token hash of the link the last start printed


def _retire_start_link(s: Session) -> None:
    """Revokes the link the last ``troupe start`` printed, if no session came of it: an
    unused teacher link stays valid for a week, readable in a terminal's scrollback."""
    found = s.conn.execute("SELECT value FROM server_state WHERE key = ?", (_START_LINK,)).fetchall()
    if found:
        last = str(found[0][0])
        s.conn.execute("UPDATE login_links SET revoked = 1 WHERE token_hash = ? AND NOT EXISTS "
                       "(SELECT 1 FROM sessions WHERE sessions.link_id = ?)", (last, _link_id(last)))


def _use_link(s: Session, op: UseLoginLink) -> dict[str, Any] | None:
    found = s.conn.execute("SELECT kind, uses_left, expires_at, revoked, quotas FROM login_links "
                           "WHERE token_hash = ?", (op.token_hash,)).fetchall()
    if not found:
        return None
    kind, uses_left, link_expires, revoked, quotas = found[0]
    now_s = time.time()
    if int(str(uses_left)) <= 0 or float(str(link_expires)) < now_s or revoked:
        return None
    s.conn.execute("UPDATE login_links SET uses_left = uses_left - 1 WHERE token_hash = ?", (op.token_hash,))
    now, expires_at = ev.utc_now(), min(float(str(link_expires)), now_s + op.max_s)
    link_id = _link_id(op.token_hash)
    s.conn.execute("INSERT INTO sessions(id, secret_hash, kind, label, created_at, last_seen_at, revoked, expires_at, "
                   "link_id, quotas) VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?, ?)",
                   (op.session_id, op.session_hash, kind, op.label[:200], now, now, expires_at, link_id, quotas))
    return {"id": op.session_id, "secret_hash": op.session_hash, "kind": str(kind), "label": op.label[:200],
            "created_at": now, "last_seen_at": now, "revoked": False, "expires_at": expires_at, "link_id": link_id,
            "quotas": _quotas(quotas)}


def _quotas(text: Any) -> dict[str, int] | None:
    return json.loads(str(text)) if text else None


def list_sessions(s: Session, _: ListSessions) -> list[dict[str, Any]]:
    rows = s.conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM sessions ORDER BY created_at").fetchall()
    return [{**dict(zip(_COLUMNS, row, strict=True)), "revoked": bool(row[6]), "quotas": _quotas(row[9])}
            for row in rows]


def _list_links(s: Session, _: ListLoginLinks) -> list[dict[str, Any]]:
    rows = s.conn.execute(f"SELECT token_hash, {', '.join(_LINK_COLUMNS)}, (SELECT COUNT(*) FROM sessions "
                          "WHERE sessions.link_id = substr(login_links.token_hash, 1, ?)) FROM login_links "
                          "ORDER BY created_at", (LINK_ID_CHARS,)).fetchall()
    return [{"id": _link_id(str(row[0])), **dict(zip(_LINK_COLUMNS, row[1:7], strict=True)), "revoked": bool(row[5]),
             "quotas": _quotas(row[6]), "sessions": row[7]} for row in rows]


def _revoke_link(s: Session, op: RevokeLoginLink) -> list[str] | None:
    if len(op.link_id) != LINK_ID_CHARS:
        return None
    s.conn.execute("UPDATE login_links SET revoked = 1 WHERE substr(token_hash, 1, ?) = ?",
                   (LINK_ID_CHARS, op.link_id))
    if s.conn.changes() == 0:
        return None
    ended = [str(sid) for sid, in s.conn.execute("SELECT id FROM sessions WHERE link_id = ? AND revoked = 0",
                                                   (op.link_id,))]
    s.conn.execute("UPDATE sessions SET revoked = 1 WHERE link_id = ?", (op.link_id,))
    return ended


def _revoke(s: Session, op: RevokeSession) -> bool:
    s.conn.execute("UPDATE sessions SET revoked = 1 WHERE id = ?", (op.session_id,))
    return s.conn.changes() > 0


def _name(s: Session, op: NameSession) -> None:
    s.conn.execute("UPDATE sessions SET label = ? WHERE id = ?", (op.label[:200], op.session_id))


def _seen(s: Session, op: SeenSessions) -> None:
    s.conn.executemany("UPDATE sessions SET last_seen_at = ? WHERE id = ?", [(at, sid) for sid, at in op.seen])


WRITES: Table = {AddLoginLink: _add_link, UseLoginLink: _use_link, RevokeSession: _revoke, SeenSessions: _seen,
                 RevokeLoginLink: _revoke_link, NameSession: _name}
READS: Table = {ListSessions: list_sessions, ListLoginLinks: _list_links}
