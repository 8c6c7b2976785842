"""Whether a folder pack this process loaded has changed on disk since.

A process loads each folder pack once (its catalog is built at start), so a pack edited
while the server runs would otherwise run as two versions at once: an in-process run
quietly took the code the server imported, while a worker run failed at its start when
the agent asked for the archive (``pack_changed``). troupe takes one rule everywhere
(docs/packs.md): a run that needs a folder pack whose files are no longer the ones the
server loaded is refused, at submission (``409 pack_changed``) and, for a run queued
before the edit, when it would start (it fails ``pack_changed``), in-process and on a
worker alike, until the server is restarted and loads the new version.

The check is cheap: each file's size and modification time are compared with the last
look (a ``stat`` per file: about 8 us for a one-file pack; a pack of more than
``FILES_EACH_TIME`` files is looked at once per ``LOOK_S``), and the pack's files are
hashed again only when those changed, so a file saved with the same bytes is no change,
and a pack put back as it was runs again.

Also where a pack's version is found from its digest, for the fingerprint.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from troupe.protocol.errors import TroupeError
from troupe.subprocess_runner.pack_files import digest_of, pack_files

LOOK_S = 0.5  # a large pack's files are looked at again after this long, not at every submission
FILES_EACH_TIME = 64  # a pack of at most this many files is looked at on every check


@dataclass
class _Watched:
    name: str
    path: Path
    digest: str
    version: str
    marks: tuple[tuple[str, int, int], ...] | None = None  # (name, size, mtime) of each file, when last looked
    looked: float = 0.0
    changed: bool = False


_loaded: dict[str, _Watched] = {}  # digest -> the pack this process loaded with it
_lock = threading.Lock()


def remember(name: str, path: Path, digest: str, version: str) -> None:
    """A folder pack this process loaded (``catalog.with_folder_packs``)."""
    with _lock:
        if digest not in _loaded:
            _loaded[digest] = _Watched(name, path, digest, version, _marks(path), time.monotonic())


def version_of(digest: str) -> str | None:
    found = _loaded.get(digest)
    return found.version if found is not None else None


def changed(packs: tuple[tuple[str, str], ...]) -> str | None:
    """Why a run that uses ``packs`` ((name, digest) of each folder pack) may not run
    now, or None: one of them changed on disk after this process loaded it."""
    for name, digest in packs:
        watched = _loaded.get(digest)
        if watched is not None and _has_changed(watched):
            return (f"pack {name}'s files changed after this server loaded them (it runs the version of digest "
                    f"{digest[:12]}); restart the server (troupe stop, troupe start) to load the new version")
    return None


def _has_changed(watched: _Watched) -> bool:
    with _lock:
        now = time.monotonic()
        large = watched.marks is None or len(watched.marks) > FILES_EACH_TIME
        if large and now - watched.looked < LOOK_S:
            return watched.changed
        marks = _marks(watched.path)
        watched.looked = now
        if marks == watched.marks:
            return watched.changed
        try:
            same = digest_of(watched.path) == watched.digest
        except (OSError, TroupeError):  # removed, or unreadable now
            same = False
        watched.marks = marks
        watched.changed = not same
        return watched.changed


def _marks(path: Path) -> tuple[tuple[str, int, int], ...] | None:
    try:
        return tuple((name, (stat := file.stat()).st_size, stat.st_mtime_ns) for name, file in pack_files(path))
    except (OSError, TroupeError):
        return None
