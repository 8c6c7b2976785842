"""Which server a command talks to, and with which token: the running server of this
TROUPE_HOME, the one named by ``--host``/``--port``, or the one ``troupe login`` chose.

Apart from ``cli.main`` so that the commands it registers (``cli.terminal``) reach the
server the same way without importing the app back. What it needs is imported when a
command connects, so that ``troupe --help`` stays fast.
"""

from __future__ import annotations

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
        return Client(f"{settings.scheme}://{host or settings.host}:{port or settings.port}", session.get("token"),
                      ca=session.get("ca"))
    if session:
        return Client(session["url"], session.get("token"), ca=session.get("ca"))
    remote = current()  # `troupe login`: a server on another machine
    return remote or Client(settings.url, None)
