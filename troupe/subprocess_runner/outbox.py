"""The artifact outbox: files a worker run wrote, kept on the worker's disk until the
control plane has confirmed its copy. (Not the agent's frame outbox, which keeps run
events in memory until they are acknowledged.)

One folder per artifact under ``<outbox>/<run id>/``: the file itself (``data``, a hard
link to the run's file, or a copy where a link cannot be made) and ``entry.json``, its
index. Both are made in a folder whose name starts with a dot, which is then renamed to
its own: an entry is whole or is not there, and the agent, which reads the outbox while
children write to it, never sees one half made. The run child puts; the agent's
``ArtifactOutbox`` actor uploads and removes. A worker never writes SQLite: this folder
is all it keeps.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from troupe.subprocess_runner.digest import copy_hashing, file_sha256

INDEX = "entry.json"
DATA = "data"
STALE_S = 3600.0  # a folder still being made this long after its start was left by a crash


class OutboxFull(OSError):
    """Raised when an artifact would take the outbox past its size: it is not kept (and
    never is a stored one dropped to make room)."""


@dataclass(frozen=True)
class Entry:
    run_id: str
    path: str  # relative to the run's folder, as the control plane lists it
    kind: str
    node_id: str | None
    size: int
    sha256: str
    folder: str  # where the entry lives (not part of what is sent)

    @property
    def data(self) -> Path:
        return Path(self.folder) / DATA


def put(outbox: Path, run_id: str, source: Path, relative: str, kind: str, node_id: str | None,
        limit_bytes: int) -> Entry:
    """Keeps ``source`` (a complete file) in the outbox; raises ``OutboxFull`` past the limit."""
    size = source.stat().st_size
    used = usage(outbox)
    if used + size > limit_bytes:
        raise OutboxFull(f"the artifact outbox holds {used / 2**20:.0f} MiB of {limit_bytes / 2**30:g} GiB "
                         "(TROUPE_AGENT_ARTIFACT_OUTBOX_GIB) and has no room for this file")
    name = uuid.uuid4().hex
    making, folder = outbox / run_id / f".{name}", outbox / run_id / name
    for _ in range(5):  # the agent removes a run's folder once it is empty: make it again
        try:
            making.mkdir(parents=True)
            break
        except FileNotFoundError:
            continue
    try:
        try:
            os.link(source, making / DATA)  # the same bytes, no copy; the run may delete its own name
            sha256 = file_sha256(making / DATA)
        except OSError:  # another file system, or links refused
            size, sha256 = copy_hashing(source, making / DATA)
        entry = Entry(run_id, relative, kind, node_id, size, sha256, str(folder))
        (making / INDEX).write_text(json.dumps({k: v for k, v in asdict(entry).items() if k != "folder"}))
        making.rename(folder)
    except BaseException:
        shutil.rmtree(making, ignore_errors=True)
        raise
    return entry


def entries(outbox: Path) -> list[Entry]:
    """Every whole entry, oldest first; a folder left half-made by a crash is removed."""
    found: list[tuple[float, Entry]] = []
    if not outbox.is_dir():
        return []
    now = time.time()
    for run_folder in outbox.iterdir():
        for folder in (run_folder.iterdir() if run_folder.is_dir() else ()):
            if folder.name.startswith("."):  # being made by a run's child (or left by a crash)
                with contextlib.suppress(OSError):
                    if now - folder.stat().st_mtime > STALE_S:
                        shutil.rmtree(folder, ignore_errors=True)
                continue
            index = folder / INDEX
            try:
                fields = json.loads(index.read_text())
                found.append((index.stat().st_mtime, Entry(**fields, folder=str(folder))))
            except (OSError, ValueError, TypeError):
                shutil.rmtree(folder, ignore_errors=True)  # damaged: nothing could send it
        with contextlib.suppress(OSError):
            run_folder.rmdir()  # empty once its entries are gone (a child making one keeps it)
    return [entry for _, entry in sorted(found, key=lambda pair: pair[0])]


def drop(outbox: Path, run_id: str, relative: str) -> int:
    """Removes the run's entries of ``relative`` that wait in the outbox (a checkpoint its
    run let go before it was uploaded); how many. One being uploaded now goes on from
    its open file, and the control plane refuses it (its row says removed)."""
    dropped = 0
    for index in (outbox / run_id).glob(f"*/{INDEX}"):
        if index.parent.name.startswith("."):
            continue
        try:
            if json.loads(index.read_text()).get("path") != relative:
                continue
        except (OSError, ValueError):
            continue
        shutil.rmtree(index.parent, ignore_errors=True)
        dropped += 1
    return dropped


def remove(entry: Entry) -> None:
    folder = Path(entry.folder)
    shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):
        folder.parent.rmdir()


def usage(outbox: Path) -> int:
    """Bytes the outbox's entries hold."""
    total = 0
    if outbox.is_dir():
        for data in outbox.glob(f"*/*/{DATA}"):  # (the dotted folders being made count too)
            with contextlib.suppress(OSError):
                total += data.stat().st_size
    return total
