"""Which server a client talks to, found the way the CLI finds it, first match wins:

1. the address (and token) given to ``Client(url, token=...)``;
2. ``TROUPE_URL`` (and ``TROUPE_TOKEN``) in the environment;
3. the server ``troupe start`` runs on this ``TROUPE_HOME`` (its ``session.json``);
4. the server ``troupe login`` chose last (``logins.json`` in the user's config folder);
5. ``http://127.0.0.1:8765`` with no token (reads work; changes are refused).

An address given without a token (to ``Client`` or in ``TROUPE_URL``) takes the token
this machine holds for it (the running server's, or the login's), so
``Client("http://127.0.0.1:8765")`` can submit to the server started here."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import platformdirs

SESSION_FILE = "session.json"
LOGINS_FILE = "logins.json"
DEFAULT_URL = "http://127.0.0.1:8765"


@dataclass(frozen=True)
class Place:
    """Where a server is and how to be let in: ``found_by`` says which rule found it."""

    url: str
    token: str | None
    ca: str | None = None
    found_by: str = "given"


def home(environ: Mapping[str, str] = os.environ) -> Path:
    """``TROUPE_HOME``, or the user's data folder for troupe (as the server's settings)."""
    return Path(environ.get("TROUPE_HOME") or platformdirs.user_data_dir("troupe")).expanduser()


def logins_path() -> Path:
    return Path(platformdirs.user_config_dir("troupe")) / LOGINS_FILE


def read_session(folder: Path) -> dict[str, Any] | None:
    """The running server's session as its start wrote it, or None: a file another hand
    changed (a field missing or of another type) is no session, never half of one."""
    try:
        data = json.loads((folder / SESSION_FILE).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("url"), str):
        return None
    pid = data.get("pid")
    if not all(isinstance(data.get(key), str | None) for key in ("token", "login_url", "ca")) or not (
            pid is None or (isinstance(pid, int) and not isinstance(pid, bool) and pid > 0)):
        return None
    return data


def read_logins() -> dict[str, Any]:
    """The logins kept, without what no login writes (a file changed by another hand):
    a server's entry without a text secret is not one, and is dropped at the next write."""
    try:
        found = json.loads(logins_path().read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(found, dict):
        return {}
    servers = found.get("servers")
    kept = {} if not isinstance(servers, dict) else {url: entry for url, entry in servers.items()
            if isinstance(entry, dict) and isinstance(entry.get("secret"), str)
            and isinstance(entry.get("ca"), str | None)}
    current = found.get("current")
    return {**found, "servers": kept, "current": current if isinstance(current, str) and current in kept else None}


def locate(url: str | None = None, token: str | None = None,
           environ: Mapping[str, str] = os.environ) -> Place:
    """The server to talk to, by the rules of this module's docstring."""
    if url:
        return Place(url.rstrip("/"), token if token is not None else _token_for(url.rstrip("/"), environ))
    if environ.get("TROUPE_URL"):
        named = environ["TROUPE_URL"].rstrip("/")
        return Place(named, token or environ.get("TROUPE_TOKEN") or _token_for(named, environ),
                     found_by="TROUPE_URL")
    session = read_session(home(environ))
    if session:
        return Place(session["url"], token or session.get("token"), session.get("ca"), "troupe start")
    logins = read_logins()
    entry = logins["servers"].get(logins["current"]) if logins.get("current") else None
    if entry:
        return Place(str(logins["current"]), token or entry["secret"], entry.get("ca"), "troupe login")
    return Place(DEFAULT_URL, token, found_by="default")


def _token_for(url: str, environ: Mapping[str, str]) -> str | None:
    if environ.get("TROUPE_URL", "").rstrip("/") == url and environ.get("TROUPE_TOKEN"):
        return environ["TROUPE_TOKEN"]
    session = read_session(home(environ))
    if session and session["url"].rstrip("/") == url:
        return session.get("token")
    entry = read_logins().get("servers", {}).get(url)
    return entry["secret"] if entry else None
