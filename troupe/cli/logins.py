"""``troupe login`` / ``troupe logout``: a terminal on another machine (a student's
laptop) keeps the server it logged in to and its session secret in the user's config
folder (``logins.json``, mode 0600), and every command uses them when no server runs
in this ``TROUPE_HOME``."""

from __future__ import annotations

import json
import os
import re
import urllib.parse
from typing import Any

from troupe.cli.client import Client
from troupe.cli.errors import EXIT_OK, BadOption, CliError, NoServer
from troupe.client._config import logins_path, read_logins


def _write(logins: dict[str, Any]) -> None:
    path = logins_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(logins, out)
    os.replace(temporary, path)


def login(url: str, token: str | None, ca: str | None = None, name: str | None = None) -> int:
    """With a login link (``http://host:8765/?token=...``) one of its uses becomes this
    terminal's session; with ``--token`` (a teacher's session token) that is kept.
    ``ca``: the certificate of a server serving https with a self-signed one. ``name``:
    what the session goes by (the server checks it before it spends the link)."""
    if name is not None and token:
        raise BadOption("--name names a session a login link opens; a teacher's token is the server's, with no name")
    try:
        parts: urllib.parse.SplitResult | None = urllib.parse.urlsplit(url)
        _ = parts.port if parts else None  # read for its check: a port that is no number, or past 65535
    except ValueError:  # "http://[::1": no address at all
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        raise CliError(f"{url!r} is not a server's address (http://host:port, or the login link you were given)")
    base = f"{parts.scheme}://{parts.netloc}"
    link_token = urllib.parse.parse_qs(parts.query).get("token", [None])[0]
    if token:
        secret, kind = token, "teacher"
        status, body = Client(base, secret, ca=ca).request("GET", "/api/sessions")
        if status != 200:
            raise CliError(f"{base} did not take that token ({status}); a teacher's token is in its session.json")
    elif link_token:
        asked = {"token": link_token, **({"name": name} if name is not None else {})}
        status, body = Client(base, None, ca=ca).request("POST", "/api/login", asked)
        if status != 201:
            error = body.get("error", {}) if isinstance(body, dict) else {}
            refused = "the name" if str(error.get("pointer")) == "/name" else "the link"
            raise CliError(f"{base} refused {refused} ({status}): {error.get('message', body)}")
        secret, kind = body["session"], body["kind"]
    else:
        raise CliError("give the login link you were given (it ends in ?token=...), or --token with a teacher's "
                       "session token")
    logins = read_logins()
    logins.setdefault("servers", {})[base] = {"secret": secret, "kind": kind, "ca": ca}
    logins["current"] = base
    _write(logins)
    named = f" as {name.strip()}" if name is not None else ""
    print(f"logged in to {base}{named} ({kind} session); `troupe ls` and the rest now use it")
    return EXIT_OK


def logout(url: str | None) -> int:
    """Ends the session on the server (its secret opens nothing from then on), then
    forgets it here. A server that cannot be told is said so (exit 1): the session then
    lives until it expires or the teacher revokes it."""
    logins = read_logins()
    base = url.rstrip("/") if url else logins.get("current")
    if not base or base not in (logins.get("servers") or {}):
        raise CliError("this terminal is not logged in" + (f" to {base}" if base else ""))
    entry = logins["servers"][base]
    try:
        status, body = Client(base, str(entry["secret"]), ca=entry.get("ca")).request("POST", "/api/logout")
        told = status in (200, 401, 409)  # 401: it had ended already; 409: a teacher's token, not a session
        problem = "" if told else f"it answered {status}: {body}"
    except NoServer as exc:
        told, problem = False, str(exc)
    del logins["servers"][base]
    if logins.get("current") == base:
        logins["current"] = next(iter(logins["servers"]), None)
    _write(logins)
    if not told:
        raise CliError(f"forgot the session of {base} here, but the server was not told ({problem}): it stays "
                       "valid until it expires or the teacher revokes it (troupe links, or DELETE /api/sessions/ID)")
    print(f"logged out of {base}")
    return EXIT_OK


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def seconds(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``2h``, ``1d``."""
    found = _DURATION.match(text)
    if found is None or float(found[1]) <= 0:
        raise CliError(f"{text!r} is not a duration (90s, 30m, 2h, 1d)")
    return float(found[1]) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[found[2]]
