"""The sha256 of a file, and a copy that hashes what it writes: one read of the bytes
for both, as checkpoints can be large."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def copy_hashing(source: Path, dest: Path) -> tuple[int, str]:
    """Copies ``source`` to ``dest`` whole or not at all (a rename at the end); returns
    the size and sha256 of what was copied."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest, size = hashlib.sha256(), 0
    handle, temporary = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    try:
        with os.fdopen(handle, "wb") as out, source.open("rb") as into:
            while block := into.read(CHUNK):
                digest.update(block)
                size += len(block)
                out.write(block)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, dest)
    finally:
        Path(temporary).unlink(missing_ok=True)
    return size, digest.hexdigest()
