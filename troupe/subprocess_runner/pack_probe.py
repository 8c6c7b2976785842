"""A folder pack is imported first in a short-lived interpreter of its own, under a time
limit and an address-space limit, before the process that wants it (the control plane,
an agent, ``troupe exec``) imports it in-process.

Why: importing a pack runs its code, and a long-lived process cannot take an import
back. A pack that sleeps (or waits on the network) at import kept ``troupe start`` from
ever binding its port; one that allocates gigabytes at import left the server holding
them. Checked in a child first, such a pack is listed broken with the reason, and the
process starts without it; a pack that passes is then imported in-process as before.

Nothing the import starts outlives the check: the child is a child subreaper
(``reaper.hold``, as a command's reaper is) and forks the import below it, so a process
the pack starts in a new session, or by a double fork, is still its descendant, and it
ends them all (``reaper.watch``) once the import has answered or the time is up. A
signal to the child's process group, as before, missed a process in a session of its
own: it ran on under init after every start.

The check costs one interpreter start per pack, a few at a time (docs/packs.md has the
figures: a tenth of a second or so for one pack). A run's own
process (a worker run's child) loads its packs without this check: it is itself a
process its agent ends at a cancel or a timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from troupe.subprocess_runner import reaper

# How many packs are checked at once: each is an interpreter starting and importing.
PARALLEL = 8
# The probe only imports, so the numeric libraries a pack may import get one thread
# each: OpenBLAS reserves buffers per thread, which would count against the limit by
# the machine's core count rather than by what the pack does.
_ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")
_REASON_MAX = 2000  # characters of a pack's error kept: it is listed and sent in a 400
_ANSWER_MAX = 16 * 1024  # the child's JSON answer at most (ASCII, so 6 bytes a character at worst)
_MEMORY_SIGNS = ("MemoryError", "Cannot allocate memory", "failed to map segment", "std::bad_alloc")
_STOP_MARGIN_S = 5.0  # how long the child may take to end what the import started, once stopped


@dataclass(frozen=True)
class ImportLimits:
    """How long a pack's import may take (``TROUPE_PACK_IMPORT_TIMEOUT_S``; 0: not checked
    in a child at all) and how much address space it may reach
    (``TROUPE_PACK_IMPORT_MEMORY_MIB``; 0: no limit)."""

    timeout_s: float = 10.0
    memory_mib: int = 2048

    @property
    def checked(self) -> bool:
        return self.timeout_s > 0


def check(paths: Sequence[Path], limits: ImportLimits) -> dict[Path, str]:
    """The packs of ``paths`` whose import in a child failed, hung or grew past the
    limits, each with why; the others are safe to import here."""
    if not paths or not limits.checked:
        return {}
    with ThreadPoolExecutor(min(PARALLEL, len(paths)), thread_name_prefix="pack-check") as pool:
        answers = pool.map(lambda path: _check_one(path, limits), paths)
        return {path: why for path, why in zip(paths, answers, strict=True) if why is not None}


def _check_one(path: Path, limits: ImportLimits) -> str | None:
    """Imports the pack at ``path`` in a fresh interpreter; None when it loaded there.
    Its answer comes on a pipe of its own: what the pack prints is not read."""
    try:
        read_end, write_end = os.pipe()
        status_read, status_write = os.pipe()
    except OSError as exc:
        return f"its import could not be checked in a process of its own: {exc.strerror or exc}"
    args = {"pack": str(path), "fd": write_end, "status_fd": status_write, "memory_bytes": limits.memory_mib * 2**20,
            "path": list(sys.path), "loader": __name__, "parent": os.getpid()}
    code = "import json, sys; a = json.loads(sys.argv[1]); sys.path[:] = a['path']; " \
           "__import__(a['loader'], fromlist=['main']).main(a)"
    try:  # its own session: out of the server's terminal and group
        child = subprocess.Popen([sys.executable, "-c", code, json.dumps(args)], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 pass_fds=(write_end, status_write), start_new_session=True)
    except OSError as exc:  # no process to spare: not imported here unchecked either
        os.close(read_end)
        os.close(status_read)
        return f"its import could not be checked in a process of its own: {exc.strerror or exc}"
    finally:
        os.close(write_end)
        os.close(status_write)
    try:
        child.wait(limits.timeout_s)
    except subprocess.TimeoutExpired:
        _stop(child)
        os.close(read_end)
        return f"its import took longer than {limits.timeout_s:g} s (TROUPE_PACK_IMPORT_TIMEOUT_S)"
    finally:
        status = _exit_code(status_read)
    answer = _answer(read_end)
    if answer is None:  # the import ended its process: a crash, os._exit, a kill
        how = "it was killed" if status is None else \
            f"signal {_signal_name(-status)}" if status < 0 else f"exit status {status}"
        why = f"its import ended the process that imported it ({how})"
        # A library that cannot map what it needs may crash so.
        if status is not None and status < 0 and limits.memory_mib:
            why += f"; if it needs more than {limits.memory_mib} MiB of address space, raise " \
                   "TROUPE_PACK_IMPORT_MEMORY_MIB"
        return why
    if answer.get("ok"):
        return None
    error = str(answer.get("error"))[:_REASON_MAX]
    return _memory_said(error, limits) if limits.memory_mib and any(s in error for s in _MEMORY_SIGNS) else error


def _answer(read_end: int) -> dict[str, Any] | None:
    """What the child wrote before it exited; never waits (something the pack started
    may still hold the pipe open)."""
    try:
        os.set_blocking(read_end, False)
        return dict(json.loads(os.read(read_end, _ANSWER_MAX)))
    except (OSError, ValueError, TypeError):
        return None
    finally:
        os.close(read_end)


def _memory_said(error: str, limits: ImportLimits) -> str:
    return f"its import went past the {limits.memory_mib} MiB of address space a pack's import may take " \
           f"(TROUPE_PACK_IMPORT_MEMORY_MIB): {error.rstrip(': ')}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _exit_code(status_read: int) -> int | None:
    """The import's exit code as the child told it (``reaper.watch``'s ``exit`` line;
    negative: the signal that ended it); None when it could not say."""
    try:
        os.set_blocking(status_read, False)
        lines = os.read(status_read, _ANSWER_MAX).decode().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        os.close(status_read)
    for line in lines:
        with contextlib.suppress(ValueError, TypeError):
            told = json.loads(line)
            if isinstance(told, dict) and isinstance(told.get("exit"), int):
                return int(told["exit"])
    return None


def _stop(child: subprocess.Popen[bytes]) -> None:
    """An import past its time: SIGTERM to the child, which ends the import and every
    process below it (``reaper.watch``), then exits. A child not gone well after that is
    killed with its group (what it held of the pack's processes then runs on)."""
    with contextlib.suppress(ProcessLookupError):
        child.send_signal(signal.SIGTERM)
    try:
        child.wait(_STOP_MARGIN_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def _end_with_parent(parent: int) -> None:
    """A child killed while the import runs leaves no import behind (Linux's
    PR_SET_PDEATHSIG); a server or agent killed meanwhile is the child's to see."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before that took hold
        os._exit(1)


def main(args: dict[str, Any]) -> None:
    """The child's side: a child subreaper that forks the import below it and, once the
    import has ended (or at SIGTERM, or when its parent is gone), ends every process
    below it, wherever they moved, then exits. It tells the import's exit on the status
    pipe, as a command's reaper does."""
    parent, status_fd = args["parent"], args["status_fd"]
    reaper.hold()
    keeper = os.getpid()
    importer = os.fork()
    if importer == 0:
        try:
            os.close(status_fd)
            signal.pthread_sigmask(signal.SIG_SETMASK, ())  # the import (and what it starts) blocks nothing
            _import(args, keeper)
        finally:
            os._exit(1)
    os.close(args["fd"])  # only the import answers
    try:
        reaper.watch(importer, status_fd, 0.0, lambda: os.getppid() != parent)
    finally:
        os._exit(0)


def _import(args: dict[str, Any], keeper: int) -> None:
    """The import's side: the limits first, then the import, then its answer as JSON on
    the pipe it was given; it exits at once, so a thread the pack started cannot hold it."""
    import resource

    from troupe.subprocess_runner import pack_loader

    _end_with_parent(keeper)
    if args["memory_bytes"]:  # the hard limit too: the pack's code cannot raise it again
        with contextlib.suppress(ValueError, OSError):  # a system that has no such limit: the time limit holds
            resource.setrlimit(resource.RLIMIT_AS, (args["memory_bytes"], args["memory_bytes"]))
    for name in _ONE_THREAD:
        os.environ[name] = "1"
    try:
        pack_loader.load(Path(args["pack"]))
        answer: dict[str, Any] = {"ok": True}
    except BaseException as exc:  # PackBroken, or a MemoryError outside the import itself
        error = str(exc) if isinstance(exc, pack_loader.PackBroken) else f"{type(exc).__name__}: {exc}"
        answer = {"ok": False, "error": error[:_REASON_MAX]}
    try:
        os.write(args["fd"], json.dumps(answer).encode())  # within a pipe's buffer: it never waits
    finally:
        os._exit(0)
