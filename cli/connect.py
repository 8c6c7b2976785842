"""Which server a command talks to, and with which token: the running server of this
TROUPE_HOME, the one named by ``--host``/``--port``, or the one ``troupe login`` chose.

Apart from ``cli.main`` so that the commands it registers (``cli.terminal``) reach the
server the same way without importing the app back. What it needs is imported when a
command connects, so that ``troupe --help`` stays fast.
"""

from __future__ import annotations

import urllib.parse
from typing import Any


def client(host: str | None, port: int | None) -> Any:
    """The running server of this TROUPE_HOME (or the one named), with its session token."""
    from cli.client import Client
    from cli.config import load_settings
    from cli.logins import current
    from cli.session import read_session

    settings = load_settings()
    session = read_session(settings.home) or {}
    if host or port:
        # The part not given is the last `troupe start`'s (its port is often picked at
        # random), else the settings'.
        last = urllib.parse.urlsplit(session["url"]) if session.get("url") else None
        scheme = last.scheme if last is not None else settings.scheme
        host = host or (last.hostname if last is not None and last.hostname else settings.host)
        port = port or (last.port if last is not None and last.port else settings.port)
        return Client(f"{scheme}://{_bracketed(host)}:{port}", session.get("token"), ca=session.get("ca"))
    if session:
        return Client(session["url"], session.get("token"), ca=session.get("ca"))
    remote = current()  # `troupe login`: a server on another machine
    return remote or Client(settings.url, None)


def _bracketed(host: str) -> str:
    """An IPv6 address as a URL writes it (``[::1]``); the session's URL gives it bare."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
