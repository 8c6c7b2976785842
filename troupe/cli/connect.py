"""Which server a command talks to, and with which token: the one named by
``--host``/``--port``; else as ``troupe.Client`` finds one (troupe/client/_config.py):
``TROUPE_URL`` and ``TROUPE_TOKEN``, the running server of this TROUPE_HOME, or the one
``troupe login`` chose.

Apart from ``troupe.cli.main`` so that the commands it registers (``troupe.cli.terminal``) reach the
server the same way without importing the app back. What it needs is imported when a
command connects, so that ``troupe --help`` stays fast.
"""

from __future__ import annotations

import urllib.parse
from typing import Any


def client(host: str | None, port: int | None) -> Any:
    """The running server of this TROUPE_HOME (or the one named), with its session token."""
    from troupe.cli.client import Client
    from troupe.cli.config import load_settings
    from troupe.cli.session import read_session
    from troupe.client._config import locate

    settings = load_settings()
    session = read_session(settings.home) or {}
    if host or port:
        # The part not given is the last `troupe start`'s (its port is often picked at
        # random), else the settings'.
        scheme, last_host, last_port = _parts(session.get("url"))
        host = host or last_host or settings.host
        port = port or last_port or settings.port
        return Client(f"{scheme or settings.scheme}://{_bracketed(host)}:{port}", session.get("token"),
                      ca=session.get("ca"))
    # As troupe.Client finds one: TROUPE_URL (and TROUPE_TOKEN), this home's running
    # server, `troupe login`'s server on another machine; else the settings' address.
    place = locate()
    if place.found_by == "default":
        return Client(settings.url, None)
    return Client(place.url, place.token, ca=place.ca)


def _parts(url: Any) -> tuple[str | None, str | None, int | None]:
    """(scheme, host, port) of the last start's address; Nones for one that is not a URL
    (a session.json edited by hand): the settings' then."""
    try:
        found = urllib.parse.urlsplit(url) if isinstance(url, str) else None
        return (found.scheme, found.hostname, found.port) if found is not None else (None, None, None)
    except ValueError:
        return None, None, None


def _bracketed(host: str) -> str:
    """An IPv6 address as a URL writes it (``[::1]``); the session's URL gives it bare."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
