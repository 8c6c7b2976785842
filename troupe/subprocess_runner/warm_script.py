"""A warm script: a ``script.Command`` with ``warm: true`` whose Python script runs in a
process forked from the agent's zygote, where torch is imported already, instead of a
fresh interpreter that spends a second or two importing it.

Why the zygote, and not the run child that executes the node: a run child has threads
(its pipe's sender, its console's readers, the engine's pool) and a fork copies only the
calling thread, with whatever lock another one held; the zygote is single-threaded, so
a fork of it is as safe as the run children it forks. Each run child the zygote forks
gets a channel back to it (a socket pair made at that fork; ``attach``), and asks over
it for its scripts: ``ForkScript`` and four descriptors (the script's stdout and stderr
pipes, the status pipe of ``troupe.subprocess_runner.reaper``, and a lifeline whose other end
only the run child holds). The zygote forks the script's reaper
(``troupe.subprocess_runner.warm_exec``) and answers ``ScriptForked(pid)`` with a pidfd of it,
or ``ScriptRefused(problem)``. A run child with no channel (started fresh, or on the
control plane) keeps why, and its warm scripts start cold, saying so (``cold_reason``).

The run child's side imports nothing but the standard library; the zygote's side runs
in the zygote's single thread between its forks.
"""

from __future__ import annotations

import array
import contextlib
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

REPLY_S = 10.0  # how long a run child waits for its zygote's answer before it starts the script cold
FDS = 4  # stdout, stderr, status, lifeline


@dataclass(frozen=True, slots=True)
class ForkScript:
    """Fork a reaper and below it the script; ``spec``: ``argv`` (its ``{python}`` first),
    ``cwd``, ``env``, ``grace_s``. The four descriptors follow in one message."""

    spec: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ScriptForked:
    """The reaper's pid; a pidfd of it follows (the run child is not its parent)."""

    pid: int


@dataclass(frozen=True, slots=True)
class ScriptRefused:
    problem: str


# The run child's side ------------------------------------------------------------

_channel: list[Connection] = []  # the zygote's channel, in a child it forked
_cold: list[str] = ["this run executes in the server's own process, which keeps no zygote"]
_asking = threading.Lock()  # one request at a time: two script nodes may start together


def attach(channel: Connection) -> None:
    """In a run child the zygote forked: its channel to the zygote."""
    _channel[:] = [channel]


def started_cold(reason: str | None) -> None:
    """In a run child started as a fresh interpreter: why, in the agent's words."""
    _channel.clear()
    _cold[:] = [reason or "this run's process was started fresh, not forked from the agent's zygote"]


def cold_reason() -> str | None:
    """Why a warm script cannot be forked here, or None (this process has a zygote)."""
    return None if _channel else _cold[0]


def fork(spec: dict[str, Any], fds: tuple[int, int, int, int]) -> tuple[int, int]:
    """Asks the zygote for the script's reaper: its pid and a pidfd of it. OSError with
    the reason when the zygote refuses, is gone or does not answer (the channel is then
    dropped: the run's next script starts cold at once)."""
    with _asking:
        if not _channel:
            raise OSError(_cold[0])
        channel = _channel[0]
        try:
            channel.send(ForkScript(spec))
            _send_fds(channel, fds)
            if not channel.poll(REPLY_S):
                raise TimeoutError(f"it did not answer within {REPLY_S:g} s")
            answer = channel.recv()
            if isinstance(answer, ScriptForked):
                return answer.pid, _recv_fds(channel, 1)[0]
        except (OSError, EOFError) as exc:
            _lost(channel, f"the agent's zygote is gone ({type(exc).__name__}: {exc})")
            raise OSError(_cold[0]) from None
        problem = answer.problem if isinstance(answer, ScriptRefused) else f"it answered {answer!r}"
        raise OSError(f"the agent's zygote could not fork the script: {problem}")


def _lost(channel: Connection, reason: str) -> None:
    _channel.clear()
    _cold[:] = [reason]
    with contextlib.suppress(OSError):
        channel.close()


# The zygote's side ---------------------------------------------------------------


def answer(channel: Connection, in_child: Callable[[], None]) -> bool:
    """One request of a run child, in the zygote: forks the reaper, which never returns
    here. ``in_child``: closes what is the zygote's, in the fork. False once the run
    child is gone (its channel is then closed by the caller)."""
    try:
        request = channel.recv()
        fds = _recv_fds(channel, FDS)
    except (EOFError, OSError, RuntimeError):
        return False
    try:
        if not isinstance(request, ForkScript):
            channel.send(ScriptRefused(f"the zygote got an unknown request {type(request).__name__}"))
            return True
        from troupe.subprocess_runner import warm_exec

        warm_exec.ahead()
        try:
            pid = os.fork()
        except OSError as exc:  # no memory, or a process limit: the run starts it cold
            channel.send(ScriptRefused(f"fork failed: {exc.strerror or exc}"))
            return True
        if pid == 0:
            warm_exec.reaper(request.spec, fds, in_child)  # never returns
        pidfd = os.pidfd_open(pid)  # before anything can reap it: the pid is this reaper's
        try:
            channel.send(ScriptForked(pid))
            _send_fds(channel, (pidfd,))
        finally:
            os.close(pidfd)
    except OSError:  # the run child went away meanwhile: the reaper sees its lifeline closed
        return False
    finally:
        for fd in fds:
            os.close(fd)
    return True


def _send_fds(channel: Connection, fds: tuple[int, ...]) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=os.dup(channel.fileno())) as sock:
        sock.sendmsg([bytes([len(fds)])], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])


def _recv_fds(channel: Connection, count: int) -> list[int]:
    """``count`` descriptors sent with ``_send_fds``; RuntimeError for anything else (the
    descriptors that did come are closed)."""
    fds = array.array("i")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=os.dup(channel.fileno())) as sock:
        message, ancillary, _, _ = sock.recvmsg(1, socket.CMSG_SPACE(count * fds.itemsize))
    if not message and not ancillary:
        raise EOFError
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    if len(fds) != count or message != bytes([count]):
        for fd in fds:
            os.close(fd)
        raise RuntimeError(f"expected {count} descriptors, got {len(fds)}")
    return list(fds)
