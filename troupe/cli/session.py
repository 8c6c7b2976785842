"""The session file and the instance lock of one ``TROUPE_HOME``.

``troupe start`` holds an exclusive ``flock`` on ``troupe.lock`` and on the home folder for
its lifetime (the kernel drops them if the process dies, so a crash leaves no stale lock),
writes its pid into ``troupe.lock`` as it takes it, and once it serves writes
``session.json`` (mode 0600) with the URL, token and pid the CLI uses.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO

from troupe.cli.errors import AlreadyRunning, CliError
from troupe.client._config import SESSION_FILE, read_session

LOCK_FILE = "troupe.lock"


def write_session(home: Path, url: str, token: str, login_url: str | None = None, ca: str | None = None) -> None:
    """``login_url``: the one-time link that logs a browser in, as printed at start;
    ``ca``: the certificate an https server serves, which its own terminal trusts."""
    path = home / SESSION_FILE
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump({"url": url, "token": token, "pid": os.getpid(), "login_url": login_url, "ca": ca}, handle)
    os.replace(tmp, path)


def remove_session(home: Path) -> None:
    (home / SESSION_FILE).unlink(missing_ok=True)


class HomeLock:
    """The server's hold on its home: ``troupe.lock`` (which names the holder's pid from
    the moment it is taken) and the home folder itself, which a hand that deletes
    ``troupe.lock`` cannot take from under a running server."""

    def __init__(self, handle: IO[str], folder: int) -> None:
        self._handle, self._folder = handle, folder

    def close(self) -> None:
        self._handle.close()
        os.close(self._folder)


def acquire_lock(home: Path) -> HomeLock:
    """Returns the held lock; raises ``AlreadyRunning`` naming the other server. A
    ``session.json`` found then is a dead server's: it goes, so that nothing reads its
    pid or address while this server starts."""
    try:
        home.mkdir(parents=True, exist_ok=True)
        handle = open(home / LOCK_FILE, "a+")  # noqa: SIM115 - held for the process lifetime
        folder = os.open(home, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:  # a file of that name, a folder this user may not write
        raise CliError(f"TROUPE_HOME {home} cannot hold the server's files: {exc.strerror or exc}") from None
    try:
        fcntl.flock(folder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        os.close(folder)
        session = read_session(home) or {}
        raise AlreadyRunning(
            f"a troupe server already runs on {home} (pid {holder_pid(home) or session.get('pid', '?')}, "
            f"{session.get('url', 'still starting')}); stop it with `troupe stop` or use another TROUPE_HOME"
        ) from None
    remove_session(home)
    handle.truncate(0)
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return HomeLock(handle, folder)


def holder_pid(home: Path) -> int | None:
    """The pid the lock's holder wrote when it took it (None: none written)."""
    try:
        text = (home / LOCK_FILE).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isascii() and text.isdigit() and 0 < int(text) < 2**31 else None


def lock_is_held(home: Path) -> bool:
    return _held(lambda: os.open(home, os.O_RDONLY | os.O_DIRECTORY)) or \
        _held(lambda: os.open(home / LOCK_FILE, os.O_RDONLY | os.O_CREAT, 0o644))


def _held(opened: Callable[[], int]) -> bool:
    try:
        fd = opened()
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
