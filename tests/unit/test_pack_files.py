"""A worker unpacks only what the digest checks: a folder pack's archive as the control
plane makes it is unpacked; one that adds byte code beside the checked source, or whose
members unpack past the cap (a gzip of zeros, a sparse file), is refused and nothing of
it stays in the cache."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from troupe.subprocess_runner import pack_files
from troupe.subprocess_runner.errors import PackArchiveRefused, PackUnsendable


@pytest.fixture
def labpack(tmp_path: Path) -> Path:
    folder = tmp_path / "src" / "labpack"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("FACTOR = 2\n")
    (folder / "nodes.py").write_text("def scale(x):\n    return x * 2\n")
    return folder


def _with(archive: bytes, name: str, data: bytes) -> bytes:
    """The archive with one member more."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as source, \
            tarfile.open(fileobj=out, mode="w:gz", format=tarfile.PAX_FORMAT) as target:
        for member in source.getmembers():
            target.addfile(member, source.extractfile(member))
        info = tarfile.TarInfo(name)
        info.size = len(data)
        target.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _refused(data: bytes, digest: str, cache: Path, words: str) -> None:
    with pytest.raises(PackArchiveRefused, match=words):
        pack_files.unpack(data, "labpack", digest, cache)
    assert list(cache.iterdir()) == []  # no staging folder, no pack


def test_the_archive_the_control_plane_makes_unpacks_to_the_same_files(labpack, tmp_path):
    digest = pack_files.digest_of(labpack)
    entry = pack_files.unpack(pack_files.archive(labpack), "labpack", digest, tmp_path / "cache")
    assert (entry / "nodes.py").read_text() == (labpack / "nodes.py").read_text()
    assert pack_files.digest_of(entry) == digest


def test_byte_code_beside_the_checked_source_is_refused(labpack, tmp_path):
    digest = pack_files.digest_of(labpack)
    cache = tmp_path / "cache"
    cache.mkdir()
    # Python would import it instead of the source its header claims to match.
    data = _with(pack_files.archive(labpack), "labpack/__pycache__/__init__.cpython-311.pyc", b"\0" * 16)
    _refused(data, digest, cache, "__pycache__")


def test_an_archive_that_unpacks_past_the_cap_is_refused_before_a_byte_is_written(labpack, tmp_path, monkeypatch):
    digest = pack_files.digest_of(labpack)
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setattr(pack_files, "MAX_UNPACKED_BYTES", 64 * 1024)  # zeros compress a thousandfold
    _refused(_with(pack_files.archive(labpack), "labpack/zeros.py", b"\0" * 128 * 1024), digest, cache, "MiB")


def test_a_sparse_member_is_refused(labpack, tmp_path):
    hole = labpack / "hole.py"
    with hole.open("wb") as out:
        out.truncate(20 * 2**30)  # 20 GiB that take no disk: read back, they fill the memory
    archive = tmp_path / "sparse.tar.gz"
    subprocess.run(["tar", "--sparse", "--format=pax", "-czf", str(archive), "-C", str(labpack.parent), "labpack"],
                   check=True)
    assert archive.stat().st_size < 64 * 1024
    cache = tmp_path / "cache"
    cache.mkdir()
    _refused(archive.read_bytes(), "0" * 64, cache, "hole.py")


def test_an_archive_of_more_files_than_an_agent_takes_is_refused_before_all_are_read(labpack, tmp_path, monkeypatch):
    for i in range(8):
        (labpack / f"empty{i}.py").write_text("")
    digest = pack_files.digest_of(labpack)
    data = pack_files.archive(labpack)  # ten files: empty members cost nothing against the byte caps
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setattr(pack_files, "MAX_FILES", 9)
    _refused(data, digest, cache, "more than 9 files")


def test_the_control_plane_refuses_to_send_what_an_agent_would_refuse(labpack, monkeypatch):
    with (labpack / "weights.bin").open("wb") as out:
        out.truncate(300 * 2**20)  # sparse: refused from its size alone, before a byte is read
    with pytest.raises(PackUnsendable, match="over 256 MiB"):
        pack_files.archive(labpack)
    (labpack / "weights.bin").unlink()
    monkeypatch.setattr(pack_files, "MAX_FILES", 1)
    with pytest.raises(PackUnsendable, match="2 files, more than the 1"):
        pack_files.archive(labpack)
    monkeypatch.setattr(pack_files, "MAX_FILES", 10)
    monkeypatch.setattr(pack_files, "MAX_ARCHIVE_BYTES", 16)
    with pytest.raises(PackUnsendable, match="archive is over"):
        pack_files.archive(labpack)


def test_a_file_name_that_is_not_utf8_is_named_not_a_crash(labpack):
    (labpack / os.fsdecode(b"caf\xe9.txt")).write_text("data")
    with pytest.raises(PackUnsendable, match="is not UTF-8"):
        pack_files.digest_of(labpack)


def test_the_digest_read_in_chunks_is_the_digest_of_the_files_whole(labpack, monkeypatch):
    (labpack / "big.py").write_bytes(bytes(range(256)) * 40)
    monkeypatch.setattr(pack_files, "_CHUNK", 1000)  # several chunks, the last one short
    whole = hashlib.sha256()
    for name in ("labpack/__init__.py", "labpack/big.py", "labpack/nodes.py"):
        data = (labpack.parent / name).read_bytes()
        whole.update(f"{name}\0{len(data)}\0".encode() + data)
    assert pack_files.digest_of(labpack) == whole.hexdigest()
