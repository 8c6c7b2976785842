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
import shutil
import tarfile
import tempfile
from pathlib import Path

from subprocess_runner.errors import PackArchiveRefused

MAX_ARCHIVE_BYTES = 64 * 2**20  # a pack is code, not data: larger is refused both ways
# What the archive may unpack to, all its files together: a small gzip of zeros, or a
# sparse member, would otherwise fill the worker's disk or memory before the digest check.
MAX_UNPACKED_BYTES = 256 * 2**20


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
        relative = file.relative_to(path.parent)
        # A link is not the pack's file: it may point anywhere on this machine.
        if not _not_the_pack(relative.as_posix()) and file.is_file() and not file.is_symlink():
            found.append((relative.as_posix(), file))
    return found


def _not_the_pack(name: str) -> bool:
    """Byte code and hidden files are not the pack (not in its digest), so an archive
    that holds them is refused: a ``__pycache__`` beside the checked source would be
    imported instead of it."""
    parts = name.split("/")
    return any(part.startswith(".") or part == "__pycache__" for part in parts) or name.endswith(".pyc")


def digest_of(path: Path) -> str:
    digest = hashlib.sha256()
    for name, file in pack_files(path):
        data = file.read_bytes()
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def archive(path: Path) -> bytes:
    """A gzip'd tar of the pack's files, the same bytes for the same files."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, file in pack_files(path):
            data = file.read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


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
                members = tar.getmembers()
                for member in members:
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
