"""The code a command ran, recorded where it runs, just before it starts: each argv item
that names a file (in its cwd, a storage label or a data root), with the file's sha256,
and, where the file lies in a git work tree, the tree's commit, branch, whether it was
dirty and its uncommitted diff (the first ``DIFF_CAP`` bytes, with the sha256 and size
of the whole). Two runs of a ``train.py`` edited in between then differ in their
fingerprints by the file's sha256 and by the diff, as MLflow and W&B record a run's
commit and patch.

git is run as a program, read-only (``GIT_OPTIONAL_LOCKS=0``: ``status`` does not
rewrite the index), each call under ``GIT_TIMEOUT_S``; a machine without git, a tree
git refuses (another user's: "dubious ownership") or a call that times out records the
files without their git facts and says why.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

DIFF_CAP = 64 * 1024  # bytes of a tree's uncommitted diff kept in the record
DIFF_READ_MAX = 256 * 2**20  # past this much diff the rest is not read (its digest then says so)
HASH_MAX = 256 * 2**20  # a file named in argv larger than this is listed by size, not hashed
FILES_MAX = 16  # argv items recorded at most (a data list of 10,000 files is not code)
GIT_TIMEOUT_S = 5.0
_CHUNK = 1 << 16
# What would point git elsewhere than the file's own tree.
_GIT_VARS = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_CEILING_DIRECTORIES",
             "GIT_COMMON_DIR", "GIT_NAMESPACE")


def take(argv: Sequence[str], cwd: Path, roots: Iterable[str] = ()) -> dict[str, Any]:
    """``{"files": [...], "repos": [...]}`` for the files ``argv`` names. A file counts
    when it lies in ``cwd`` or under one of ``roots`` (the run's labels and data roots):
    the interpreter in ``argv[0]`` or a system file is not the lab's code."""
    places = [cwd.resolve(), *(Path(root).resolve() for root in roots)]
    files: list[dict[str, Any]] = []
    repos: dict[str, dict[str, Any]] = {}
    seen: set[Path] = set()
    for item in argv:
        path = _named_file(item, cwd, places)
        if path is None or path in seen:
            continue
        seen.add(path)
        entry = _file(item, path)
        top = _repo_of(path, repos)
        if top is not None:
            entry["repo"] = top
            entry["tracked"] = _git(path.parent, "ls-files", "--error-unmatch", "--", path.name)[0] == 0
        files.append(entry)
        if len(files) == FILES_MAX:
            break
    return {"files": files, "repos": list(repos.values())}


def _named_file(item: str, cwd: Path, places: list[Path]) -> Path | None:
    """The file an argv item names (``train.py``, ``--config=cfg.yaml``'s value), if it
    is a regular file in one of ``places``."""
    for text in (item, item.partition("=")[2] if item.startswith("-") else ""):
        if not text or "\0" in text or len(text) > 4096:
            continue
        try:
            path = (cwd / text).resolve()
            if path.is_file() and any(path.is_relative_to(place) for place in places):
                return path
        except (OSError, ValueError, RuntimeError):  # a name too long, a loop of links
            continue
    return None


def _file(item: str, path: Path) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": item.partition("=")[2] if item.startswith("-") and "=" in item else item,
                             "path": str(path)}
    try:
        size = path.stat().st_size
        entry["size"] = size
        if size > HASH_MAX:
            entry["sha256"] = None
            entry["note"] = f"not hashed: larger than {HASH_MAX // 2**20} MiB"
            return entry
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
        entry["sha256"] = digest.hexdigest()
    except OSError as exc:
        entry["sha256"] = None
        entry["note"] = f"not read: {exc.strerror or exc}"
    return entry


def _repo_of(path: Path, repos: dict[str, dict[str, Any]]) -> str | None:
    """The work tree ``path`` lies in (its facts taken once per tree), or None."""
    code, out = _git(path.parent, "rev-parse", "--show-toplevel")
    if code != 0 or not out.strip():
        return None
    top = out.strip()
    if top not in repos:
        repos[top] = _tree_facts(Path(top))
    return top


def _tree_facts(top: Path) -> dict[str, Any]:
    facts: dict[str, Any] = {"name": str(top)}
    code, out = _git(top, "rev-parse", "--verify", "-q", "HEAD")
    facts["commit"] = out.strip() if code == 0 and out.strip() else None
    code, out = _git(top, "symbolic-ref", "-q", "--short", "HEAD")
    facts["branch"] = out.strip() if code == 0 and out.strip() else None  # None: a detached HEAD
    code, out = _git(top, "status", "--porcelain", "--untracked-files=no")
    if code != 0:
        facts["dirty"] = None
        facts["note"] = f"git status failed: {out.strip()[:300]}"
        return facts
    facts["dirty"] = bool(out.strip())
    if facts["commit"] is not None:
        facts.update(_diff(top))
    return facts


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _GIT_VARS}
    env.update(GIT_OPTIONAL_LOCKS="0", LC_ALL="C", GIT_TERMINAL_PROMPT="0")
    return env


def _git(where: Path, *args: str) -> tuple[int, str]:
    """``git -C where args``: its exit status and output (stderr when it failed); 127
    where git is not installed, 124 when it ran past ``GIT_TIMEOUT_S``."""
    try:
        done = subprocess.run(["git", "-C", str(where), *args], capture_output=True, timeout=GIT_TIMEOUT_S,
                              env=_environment(), stdin=subprocess.DEVNULL, check=False)
    except FileNotFoundError:
        return 127, "git is not installed here"
    except subprocess.TimeoutExpired:
        return 124, f"git {args[0]} took longer than {GIT_TIMEOUT_S:g} s"
    except OSError as exc:
        return 126, str(exc)
    text = (done.stdout if done.returncode == 0 else done.stderr).decode("utf-8", "replace")
    return done.returncode, text


def _diff(top: Path) -> dict[str, Any]:
    """``git diff HEAD`` of the tree: its first ``DIFF_CAP`` bytes as text, and the
    sha256 and size of all of it (read as it streams, never held whole)."""
    try:
        process = subprocess.Popen(["git", "-C", str(top), "diff", "HEAD", "--no-color", "--no-ext-diff"],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                   env=_environment())
    except OSError as exc:
        return {"diff": None, "note": f"git diff could not start: {exc.strerror or exc}"}
    stopped = threading.Event()  # killed: past the time limit, or past what is read

    def stop() -> None:
        stopped.set()
        with contextlib.suppress(OSError):
            process.kill()

    timer = threading.Timer(GIT_TIMEOUT_S, stop)
    timer.start()
    digest, kept, size = hashlib.sha256(), bytearray(), 0
    try:
        assert process.stdout is not None
        while chunk := process.stdout.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
            if len(kept) < DIFF_CAP:
                kept += chunk[:DIFF_CAP - len(kept)]
            if size >= DIFF_READ_MAX:
                stop()
                break
    finally:
        timer.cancel()
        if process.stdout is not None:
            process.stdout.close()
        code = process.wait()
    if code != 0 and not stopped.is_set():
        return {"diff": None, "note": f"git diff failed (status {code})"}
    found: dict[str, Any] = {"diff": kept.decode("utf-8", "replace"), "diff_sha256": digest.hexdigest(),
                             "diff_bytes": size, "diff_cut": size > DIFF_CAP}
    if stopped.is_set():
        found["note"] = (f"the diff was not read whole (past {GIT_TIMEOUT_S:g} s or {DIFF_READ_MAX // 2**20} MiB): "
                         "its sha256 and size are of what was read")
    return found
