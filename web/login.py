"""Logging a browser in, as users know it from Jupyter: ``troupe start`` prints the URL
with a one-time login token (``http://127.0.0.1:8765/?token=...``); opening it sets an
HttpOnly, SameSite=Strict cookie and drops the token from the address bar. The page's
mutations carry that cookie plus ``X-Troupe-Request``, a header a cross-site form cannot
send. The page served without the cookie is read-only and says how to log in. The
session token itself never reaches a page: on a shared classroom machine any local
account could read it from there.

The CLI keeps using the session token of ``session.json``; ``POST /api/login-links``
(session token only) makes a fresh link, which ``troupe open`` uses.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass, field

from aiohttp import web

REQUEST_HEADER = "X-Troupe-Request"


@dataclass
class LoginBook:
    """One-time login tokens not yet used, and the cookies of logged-in browsers. Both
    live only as long as the server: a restart logs every browser out."""

    port: int = 0
    _links: set[str] = field(default_factory=set)
    _cookies: set[str] = field(default_factory=set)

    @property
    def cookie_name(self) -> str:
        # Cookies are not scoped by port: two servers on one host must not share one.
        return f"troupe_session_{self.port}"

    def new_link(self, base_url: str) -> str:
        token = secrets.token_urlsafe(24)
        self._links.add(token)
        return f"{base_url.rstrip('/')}/?token={token}"

    def redeem(self, token: str) -> str | None:
        """A fresh cookie value for a login token, which is used up; None if unknown."""
        match = next((t for t in self._links if hmac.compare_digest(t.encode(), token.encode(errors="replace"))), None)
        if match is None:
            return None
        self._links.discard(match)
        cookie = secrets.token_urlsafe(32)
        self._cookies.add(cookie)
        return cookie

    def logged_in(self, request: web.Request) -> bool:
        value = request.cookies.get(self.cookie_name, "")
        return bool(value) and any(hmac.compare_digest(c.encode(), value.encode(errors="replace"))
                                   for c in self._cookies)

    def may_mutate(self, request: web.Request) -> bool:
        """A logged-in page's request: the cookie and the header a form cannot send."""
        return bool(request.headers.get(REQUEST_HEADER)) and self.logged_in(request)

    def set_cookie(self, response: web.StreamResponse, value: str) -> None:
        response.set_cookie(self.cookie_name, value, httponly=True, samesite="Strict", path="/")
