"""A folder pack's files as one content-addressed thing: the digest (sha256 over its
files' names and bytes), the archive the control plane offers, and the checked unpacking
a worker does into its cache.

A pack is a ``.py`` file or a folder (a package with its ``__init__.py``). Caches of
byte code and hidden files are not the pack: two checkouts of the same code have the
same digest. The digest is over the files, not the archive's bytes, so a worker checks
what it unpacked, which is what it will import."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from troupe.subprocess_runner.errors import PackArchiveRefused, PackChanged, PackUnsendable

MAX_ARCHIVE_BYTES = 64 * 2**20  # a pack is code, not data: larger is refused both ways
# What the archive may unpack to, all its files together: a small gzip of zeros, or a
# sparse member, would otherwise fill the worker's disk or memory before the digest check.
MAX_UNPACKED_BYTES = 256 * 2**20
# Files in one archive: empty members cost nothing against the byte limits, and each is
# a header parsed and a file made on the worker.
MAX_FILES = 10_000
_CHUNK = 2**20


def pack_name(path: Path) -> str:
    """``labpack.py`` and ``labpack/`` are both the pack ``labpack``."""
    return path.stem if path.is_file() else path.name


def is_pack(path: Path) -> bool:
    if path.name.startswith((".", "_")):
        return False
    if path.is_file():
        return path.suffix == ".py"
    return path.is_dir() and (path / "__init__.py").is_file()


def pack_files(path: Path) -> list[tuple[str, Path]]:
    """The pack's files as (name inside the archive, path here), in a stable order."""
    if path.is_file():
        return [(path.name, path)]
    found = []
    for file in sorted(path.rglob("*")):
        relative = file.relative_to(path.parent).as_posix()
        # A link is not the pack's file: it may point anywhere on this machine.
        if not _not_the_pack(relative) and file.is_file() and not file.is_symlink():
            try:
                relative.encode()
            except UnicodeEncodeError:  # its digest and its archive name its files in UTF-8
                raise PackUnsendable(f"pack {path.name}: the file name {relative!r} is not UTF-8; rename it") from None
            found.append((relative, file))
    return found


def _not_the_pack(name: str) -> bool:
    """Byte code and hidden files are not the pack (not in its digest), so an archive
    that holds them is refused: a ``__pycache__`` beside the checked source would be
    imported instead of it."""
    parts = name.split("/")
    return any(part.startswith(".") or part == "__pycache__" for part in parts) or name.endswith(".pyc")


def digest_of(path: Path) -> str:
    """Read a chunk at a time: a pack folder may hold a large file by mistake."""
    digest = hashlib.sha256()
    for name, file in pack_files(path):
        with file.open("rb") as stream:
            size = os.fstat(stream.fileno()).st_size
            digest.update(f"{name}\0{size}\0".encode())
            read = 0
            while chunk := stream.read(_CHUNK):
                digest.update(chunk)
                read += len(chunk)
        if read != size:
            raise PackChanged(f"pack {path.name}: {name} changed while it was read")
    return digest.hexdigest()


def archive(path: Path) -> bytes:
    """A gzip'd tar of the pack's files, the same bytes for the same files; a pack an
    agent would refuse (too many files, too many bytes) is refused here first."""
    files = sendable(path)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, file in files:
            with file.open("rb") as stream:
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = os.fstat(stream.fileno()).st_size, 0o644, 0
                tar.addfile(info, stream)
            if buffer.tell() > MAX_ARCHIVE_BYTES:  # what gzip gave so far: it keeps its last block back
                raise _over_archive(path)
    if buffer.tell() > MAX_ARCHIVE_BYTES:
        raise _over_archive(path)
    return buffer.getvalue()


def _over_archive(path: Path) -> PackUnsendable:
    return PackUnsendable(f"pack {path.name}: its archive is over {MAX_ARCHIVE_BYTES / 2**20:g} MiB, more than an "
                          "agent accepts; a pack is code, not data")


def sendable(path: Path) -> list[tuple[str, Path]]:
    """``pack_files(path)``, or PackUnsendable when an agent would refuse them (checked
    from their sizes alone, before a byte is read)."""
    files = pack_files(path)
    if len(files) > MAX_FILES:
        raise PackUnsendable(f"pack {path.name}: {len(files)} files, more than the {MAX_FILES} an agent accepts")
    if sum(file.stat().st_size for _, file in files) > MAX_UNPACKED_BYTES:
        raise PackUnsendable(f"pack {path.name}: its files are over {MAX_UNPACKED_BYTES // 2**20} MiB, more than "
                             "an agent accepts; a pack is code, not data (data goes by path or upload)")
    return files


def unpack(data: bytes, name: str, digest: str, cache: Path) -> Path:
    """The pack ``name`` whose files must have ``digest``, unpacked into ``cache`` under
    its digest and returned; already there: returned as it is. Unpacked into a temporary
    folder, checked, then renamed into place: a refused archive (tampered, truncated,
    another pack's, a path that leaves its folder) leaves nothing behind."""
    final = cache / digest
    if (found := cached(cache, name, digest)) is not None:
        return found
    if len(data) > MAX_ARCHIVE_BYTES:
        raise PackArchiveRefused(f"pack {name}: the archive is over {MAX_ARCHIVE_BYTES // 2**20} MiB")
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache))
    try:
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
                members = []
                for member in tar:  # one header at a time: the count is refused before all are read
                    members.append(member)
                    if len(members) > MAX_FILES:
                        raise PackArchiveRefused(f"pack {name}: the archive holds more than {MAX_FILES} files")
                    top = member.name.split("/", 1)[0]
                    if (not (member.isfile() or member.isdir()) or member.issparse() or _not_the_pack(member.name)
                            or top not in (name, f"{name}.py")):
                        raise PackArchiveRefused(f"pack {name}: the archive holds {member.name!r}, which is not "
                                                 "a file of the pack")
                if sum(member.size for member in members) > MAX_UNPACKED_BYTES:
                    raise PackArchiveRefused(f"pack {name}: the archive unpacks to more than "
                                             f"{MAX_UNPACKED_BYTES // 2**20} MiB; a pack is code, not data")
                tar.extractall(staging, members=members, filter="data")
        except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
            raise PackArchiveRefused(f"pack {name}: the archive cannot be read ({type(exc).__name__}: {exc}); "
                                     "it is truncated or not a pack's") from None
        entry = _entry(staging, name)
        unpacked = digest_of(entry)
        if unpacked != digest:
            raise PackArchiveRefused(f"pack {name}: its files have sha256 {unpacked[:16]}..., not the {digest[:16]}... "
                                     "the control plane offers; it was refused and nothing of it is loaded")
        try:
            staging.rename(final)
        except OSError:  # another run unpacked the same digest meanwhile: theirs is as good
            if not final.exists():
                raise
        return _entry(final, name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def cached(cache: Path, name: str, digest: str) -> Path | None:
    """The pack as an earlier ``unpack`` left it (checked then), or None."""
    final = cache / digest
    return _entry(final, name) if (final / f"{name}.py").is_file() or (final / name).is_dir() else None


def _entry(folder: Path, name: str) -> Path:
    single = folder / f"{name}.py"
    return single if single.is_file() else folder / name
