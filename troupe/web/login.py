"""Logging in, as users know it from Jupyter, for one user or a classroom.

``troupe start`` prints the URL with a login token (``http://host:8765/?token=...``);
opening it sets an HttpOnly, SameSite=Strict cookie and drops the token from the
address bar. A teacher's ``troupe open --uses 30 --expires 2h`` makes one link good for
thirty browsers; ``--read-only`` one for a projector or a guest. Each use opens a
session of the link's kind:

* ``teacher``: everything (the server's session token is one too);
* ``class``: runs, sweeps, studies, uploads and every read; not workers, flavors,
  plugins, links or sessions;
* ``read``: reads only.

Links and sessions are stored by the sha256 of their secrets, so a restart mid-lesson
logs nobody out and a copy of the database logs nobody in. A session ends when its link
said the link would (or after ``TROUPE_SESSION_MAX_S``), when its holder logs out
(``POST /api/logout``), or when the teacher revokes it or the link that opened it.
Opening a link's address spends none of its uses: the page spends one by a ``POST``
(a chat app's preview of the link fetches the page and runs no script). The page's mutations carry
the cookie plus ``X-Troupe-Request``, a header a cross-site form cannot send. A
terminal logs in with ``troupe login URL`` and then sends its session secret as a
bearer token. The session token itself never reaches a page.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aiohttp import web

from troupe.actors.store.logins import (
    AddLoginLink,
    ListSessions,
    NameSession,
    RevokeLoginLink,
    RevokeSession,
    SeenSessions,
    UseLoginLink,
)

REQUEST_HEADER = "X-Troupe-Request"
LOGOUT_PATH = "/api/logout"
OWN_NAME_PATH = "/api/sessions/me"
TEACHER, CLASS, READ = "teacher", "class", "read"
SERVER_SUBMITTER = "server"
# What a class session may change: its own work. Everything else is the teacher's.
CLASS_ROUTES = ("/api/runs", "/api/sweeps", "/api/studies", "/api/files", "/api/export", "/api/estimates",
                "/api/editor-sessions")
_SEEN_WRITE_S = 60.0  # how often a session's last-seen time is written


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


@dataclass(frozen=True)
class Who:
    """Who a request comes from: a session's kind and id (None: the session token), and
    whether it came by the page's cookie (then a mutation needs the request header)."""

    kind: str
    session_id: str | None = None
    by_cookie: bool = False
    label: str = ""  # the name "who is connected" shows for it
    quotas: Mapping[str, int] | None = None  # what its class link limits it to (``quotas.py``)

    def may_change(self, path: str) -> bool:
        if self.kind == TEACHER or path in (LOGOUT_PATH, OWN_NAME_PATH):  # every session may end and name itself
            return True
        return self.kind == CLASS and any(path == p or path.startswith(p + "/") for p in CLASS_ROUTES)


def submitter_of(who: Who) -> str:
    """What a run records as its submitter: the session's id, or ``server`` for the
    server's own token (the teacher at the machine)."""
    return who.session_id or SERVER_SUBMITTER


def _who(row: Mapping[str, Any], by_cookie: bool) -> Who:
    return Who(row["kind"], row["id"], by_cookie, row["label"], row.get("quotas"))


@dataclass
class LoginBook:
    """The sessions of this server, held in memory for every request to check, written
    through to the store. ``token``: the server's own session token (the teacher's)."""

    port: int = 0
    token: str = ""
    session_max_s: float = 30 * 86400
    store: Any = None
    _sessions: dict[str, dict[str, Any]] = field(default_factory=dict)  # secret hash -> row
    _seen: dict[str, float] = field(default_factory=dict)  # session id -> last written (monotonic)
    _quota_turns: dict[str, asyncio.Lock] = field(default_factory=dict)  # session id -> its submissions' turn
    _naming: list[str] = field(default_factory=list)  # names chosen by sessions being opened now
    _submitted: dict[str, deque[float]] = field(default_factory=dict)  # session id -> its last minute's submits

    @property
    def cookie_name(self) -> str:
        # Cookies are not scoped by port: two servers on one host must not share one.
        return f"troupe_session_{self.port}"

    async def load(self, store: Any) -> None:
        """The sessions the database holds (a restart keeps them)."""
        self.store = store
        for row in await store.read(ListSessions()):
            if not row["revoked"]:
                if row["expires_at"] is None:  # opened before sessions ended: the maximum from its start
                    started = datetime.fromisoformat(str(row["created_at"]).replace("Z", "+00:00"))
                    row["expires_at"] = started.timestamp() + self.session_max_s
                self._sessions[row["secret_hash"]] = row

    async def new_link(self, base_url: str, kind: str = TEACHER, uses: int = 1, expires_s: float = 7 * 86400,
                       quotas: Mapping[str, int] | None = None, printed_at_start: bool = False) -> str:
        """``printed_at_start``: the link ``troupe start`` prints, which revokes the one the
        last start printed if nobody used it (five restarts leave one live link, not five)."""
        token = secrets.token_urlsafe(24)
        await self.store.write(AddLoginLink(digest(token), kind, uses, time.time() + expires_s, quotas or None,
                                            printed_at_start))
        return f"{base_url.rstrip('/')}/?token={token}"

    async def redeem(self, token: str, label: str, named: bool = False) -> tuple[str, dict[str, Any]] | None:
        """A fresh session secret for a link token, one of its uses spent; None for a link
        that is unknown, used up or expired. ``named``: ``label`` is a name its holder
        chose, held for it (``labels``) while the link is spent."""
        secret = secrets.token_urlsafe(32)
        if named:
            self._naming.append(label)
        try:
            row = await self.store.write(UseLoginLink(digest(token), digest(secret), uuid.uuid4().hex[:16], label,
                                                      self.session_max_s))
        finally:
            if named:
                self._naming.remove(label)
        if row is None:
            return None
        self._sessions[row["secret_hash"]] = row
        return secret, row

    def labels(self, but: str | None = None) -> list[str]:
        """The names the live sessions go by (but session ``but``), and those being given
        to sessions opening now: what another session may not call itself (``names.py``)."""
        now = time.time()
        return [*(row["label"] for row in self._sessions.values() if row["id"] != but
                  and (row["expires_at"] is None or float(row["expires_at"]) >= now)), *self._naming]

    async def name(self, session_id: str, label: str) -> None:
        """What the session is called in "who is connected", here at once (a name checked
        against ``labels`` is taken before anything else is awaited) and in the store."""
        for row in self._sessions.values():
            if row["id"] == session_id:
                row["label"] = label
        await self.store.write(NameSession(session_id, label))

    def session_who(self, session_id: str) -> Who | None:
        """The live session ``session_id`` as a request of its own would be; None when it
        ended (or is the server's token)."""
        for row in self._sessions.values():
            if row["id"] == session_id:
                return _who(row, False)
        return None

    def quota_lock(self, session_id: str) -> asyncio.Lock:
        """One session's submissions are checked against its quotas one at a time."""
        return self._quota_turns.setdefault(session_id, asyncio.Lock())

    def submitted(self, session_id: str) -> deque[float]:
        """When (``time.monotonic()``) the session submitted its runs of the last minute,
        one entry a run, oldest first; ``quotas.py`` counts and trims them."""
        return self._submitted.setdefault(session_id, deque())

    async def revoke(self, session_id: str) -> bool:
        self._forget({session_id})
        return bool(await self.store.write(RevokeSession(session_id)))

    async def revoke_link(self, link_id: str) -> list[str] | None:
        """Revokes a link and ends the sessions it opened; None: no such link."""
        ended: list[str] | None = await self.store.write(RevokeLoginLink(link_id))
        if ended is not None:
            self._forget(set(ended))
        return ended

    def _forget(self, session_ids: set[str]) -> None:
        for hashed, row in list(self._sessions.items()):
            if row["id"] in session_ids:
                del self._sessions[hashed]
        for session_id in session_ids:
            self._submitted.pop(session_id, None)

    def who(self, request: web.Request) -> Who | None:
        """The session a request comes with, by bearer token or by cookie; None: none."""
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        given = given.strip()
        if scheme.lower() == "bearer" and given:
            if self.token and hmac.compare_digest(given.encode("utf-8", "surrogateescape"), self.token.encode()):
                return Who(TEACHER)
            row = self._live(digest(given))
            return _who(row, False) if row is not None and self._touch(row) else None
        value = request.cookies.get(self.cookie_name, "")
        row = self._live(digest(value)) if value else None
        return _who(row, True) if row is not None and self._touch(row) else None

    def _live(self, hashed: str) -> dict[str, Any] | None:
        """The session of that secret, unless it has ended with its time."""
        row = self._sessions.get(hashed)
        if row is not None and row["expires_at"] is not None and float(row["expires_at"]) < time.time():
            del self._sessions[hashed]
            return None
        return row

    def logged_in(self, request: web.Request) -> str | None:
        """The kind of session the page's cookie opened, or None."""
        who = self.who(request)
        return who.kind if who is not None and who.by_cookie else None

    def _touch(self, row: dict[str, Any]) -> bool:
        now = time.monotonic()
        if self.store is not None and now - self._seen.get(row["id"], -_SEEN_WRITE_S) >= _SEEN_WRITE_S:
            self._seen[row["id"]] = now
            row["last_seen_at"] = _utc_now()
            self.store.write(SeenSessions(((row["id"], row["last_seen_at"]),)))
        return True

    def set_cookie(self, response: web.StreamResponse, value: str, expires_at: float, secure: bool = False) -> None:
        """The cookie lives as long as its session (a browser drops it when that ends)."""
        response.set_cookie(self.cookie_name, value, httponly=True, samesite="Strict", path="/", secure=secure,
                            max_age=max(1, int(expires_at - time.time())))

    def clear_cookie(self, response: web.StreamResponse) -> None:
        response.del_cookie(self.cookie_name, path="/")


def _utc_now() -> str:
    from troupe.protocol.events import utc_now

    return utc_now()
