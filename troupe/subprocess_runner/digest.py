"""The sha256 of a file, and writes that hash what they write: one read of the bytes
for both, as checkpoints and uploads can be large."""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from collections.abc import AsyncIterable, Iterable
from pathlib import Path
from typing import BinaryIO

CHUNK = 1 << 20


def pour(chunks: Iterable[bytes], out: BinaryIO) -> tuple[int, str]:
    """Writes ``chunks`` to ``out``; the size and sha256 of what was written."""
    digest, size = hashlib.sha256(), 0
    for chunk in chunks:
        digest.update(chunk)
        size += len(chunk)
        out.write(chunk)
    return size, digest.hexdigest()


async def pour_async(chunks: AsyncIterable[bytes], out: BinaryIO, limit: int) -> tuple[int, str]:
    """``pour`` from a stream that may be longer than ``limit`` bytes: it stops at the
    first chunk past it, unwritten, and the size it answers is then over ``limit``."""
    digest, size = hashlib.sha256(), 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            break
        digest.update(chunk)
        out.write(chunk)
    return size, digest.hexdigest()


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
    handle, temporary = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    try:
        with os.fdopen(handle, "wb") as out, source.open("rb") as into:
            size, sha256 = pour(iter(functools.partial(into.read, CHUNK), b""), out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, dest)
    finally:
        Path(temporary).unlink(missing_ok=True)
    return size, sha256
