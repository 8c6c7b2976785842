"""The artifact outbox: files a worker run wrote, kept on the worker's disk until the
control plane has confirmed its copy. (Not the agent's frame outbox, which keeps run
events in memory until they are acknowledged.)

One folder per artifact under ``<outbox>/<run id>/``: the file itself (``data``, a hard
link to the run's file, or a copy where a link cannot be made) and ``entry.json``, its
index, written last under a temporary name and renamed, so an entry is whole or is not
there. The run child puts; the agent's ``ArtifactOutbox`` actor uploads and removes. A
worker never writes SQLite: this folder is all it keeps.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from subprocess_runner.digest import copy_hashing, file_sha256

INDEX = "entry.json"
DATA = "data"


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
    folder = outbox / run_id / uuid.uuid4().hex
    folder.mkdir(parents=True)
    try:
        try:
            os.link(source, folder / DATA)  # the same bytes, no copy; the run may delete its own name
            sha256 = file_sha256(folder / DATA)
        except OSError:  # another file system, or links refused
            size, sha256 = copy_hashing(source, folder / DATA)
        entry = Entry(run_id, relative, kind, node_id, size, sha256, str(folder))
        partial = folder / f".{INDEX}.partial"
        partial.write_text(json.dumps({k: v for k, v in asdict(entry).items() if k != "folder"}))
        partial.replace(folder / INDEX)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return entry


def entries(outbox: Path) -> list[Entry]:
    """Every whole entry, oldest first; a folder left half-made by a crash is removed."""
    found: list[tuple[float, Entry]] = []
    if not outbox.is_dir():
        return []
    for run_folder in outbox.iterdir():
        for folder in (run_folder.iterdir() if run_folder.is_dir() else ()):
            index = folder / INDEX
            try:
                fields = json.loads(index.read_text())
                found.append((index.stat().st_mtime, Entry(**fields, folder=str(folder))))
            except (OSError, ValueError, TypeError):
                shutil.rmtree(folder, ignore_errors=True)  # never finished: its put failed
        with contextlib.suppress(OSError):
            run_folder.rmdir()  # empty once its entries are gone
    return [entry for _, entry in sorted(found, key=lambda pair: pair[0])]


def remove(entry: Entry) -> None:
    folder = Path(entry.folder)
    shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):
        folder.parent.rmdir()


def usage(outbox: Path) -> int:
    """Bytes the outbox's entries hold."""
    total = 0
    if outbox.is_dir():
        for data in outbox.glob(f"*/*/{DATA}"):
            with contextlib.suppress(OSError):
                total += data.stat().st_size
    return total
