"""The fork server of a worker agent (``troupe agent start --warm N``, on Linux).

A fresh interpreter spends about a second and a half importing torch and the engine
before a run's first node. The agent starts one interpreter, the zygote, that imported
all of it (torch, the engine, the built-in packs, the node catalog) and started no
thread and no accelerator context; each run child is then forked from it in a few
milliseconds and sets what is per run itself (its cards before anything touches CUDA,
its nodes' thread counts, its memory cap, its console capture, its seed). A forked
child takes one run and exits, like a spawned one: one process per run.

Both ends of the protocol live here: ``Zygote`` in the agent (starts the zygote, asks it
for children, learns when they exit) and ``serve`` in the zygote. Their channel is a
socket pair: down, ``Fork`` followed by the child's end of its own run pipe, passed as a
descriptor, or ``Dismiss`` (the pool closes); up, ``Ready``/``Unfit`` once, then
``Forked(pid)`` for each fork and ``Exited(pid, code)`` when a child ends (the zygote is
its parent and reaps it, woken by SIGCHLD). Each child it forks also gets a channel back
to it, over which the child's warm scripts are forked (``troupe.subprocess_runner.warm_script``).

What needs a fresh interpreter still gets one (``troupe.actors.run_process``): a run that sets
environment variables of its own (read at import), and every run where fork is not
offered. Folder packs are never imported in the zygote: a run loads its own, at the
digest it was sent, after the fork.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import multiprocessing
import os
import queue
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import reduction
from multiprocessing.connection import Connection, wait
from typing import Any

from troupe.protocol import pipe
from troupe.subprocess_runner import warm_script

log = logging.getLogger("troupe.agent")
FORK_REPLY_S = 10.0  # how long a fork may take before the zygote counts as lost
FORKS = sys.platform == "linux"  # where a process that imported torch may be forked safely


@dataclass(frozen=True, slots=True)
class Fork:
    """Fork a child for the run pipe whose end follows as a descriptor; ``prime``: it
    primes itself before it reads the pipe (not when a run already waits for it)."""

    prime: bool = True


@dataclass(frozen=True, slots=True)
class Forked:
    pid: int


@dataclass(frozen=True, slots=True)
class Exited:
    """A forked child ended: its exit code, or minus the signal that ended it."""

    pid: int
    code: int


# The agent's end ---------------------------------------------------------------


class ForkedChild:
    """A run child the zygote forked, with what ``multiprocessing.Process`` offers for a
    spawned one (``pid``, ``is_alive``, ``join``, ``kill``, ``exitcode``); the agent is
    not its parent, so its end is learned from the zygote."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.exitcode: int | None = None
        self._exited = threading.Event()

    def is_alive(self) -> bool:
        return not self._exited.is_set()

    def join(self, timeout: float | None = None) -> None:
        self._exited.wait(timeout)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def ended(self, code: int | None) -> None:
        self.exitcode = code
        self._exited.set()


class Zygote:
    """The agent's handle on one zygote. ``start`` and ``fork`` block (a thread's work);
    ``on_lost(zygote)`` is called once, from the reader thread, when the zygote is gone."""

    def __init__(self, on_lost: Callable[[Zygote], None]) -> None:
        self._on_lost = on_lost
        self._conn: Connection | None = None
        self._process: Any = None
        self._children: dict[int, ForkedChild] = {}
        self._forked: queue.Queue[ForkedChild | None] = queue.Queue()
        self._lock = threading.Lock()  # one fork at a time: its reply is the next Forked
        self.refusal: str | None = None  # the zygote's own words when it would not fork (pipe.Unfit)

    def start(self, closed: threading.Event) -> bool:
        """Starts the zygote and waits until it has imported everything (or ``closed``)."""
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe(duplex=True)
        # daemon: the agent's exit takes it along; the runs it forked are not its to end.
        self._process = context.Process(target=serve, args=(theirs,), name="troupe-zygote", daemon=True)
        self._process.start()
        theirs.close()
        said: Any = None
        with contextlib.suppress(EOFError, OSError):
            while not closed.is_set() and said is None:
                if ours.poll(0.2):
                    said = ours.recv()
        if not isinstance(said, pipe.Ready) or closed.is_set():
            if isinstance(said, pipe.Unfit):
                log.warning("the zygote cannot fork run children: %s", said.problem)
                self.refusal = said.problem
            ours.close()
            if closed.is_set() and self._process.is_alive():  # the agent stops: no wait for its imports
                self._process.kill()
            self._stop_process()
            return False
        self._conn = ours
        threading.Thread(target=self._listen, name="zygote-reader", daemon=True).start()
        return True

    def fork(self, prime: bool = True) -> tuple[ForkedChild, Connection] | None:
        """A child forked for a run, with the agent's end of its pipe; None: the zygote is gone."""
        parent, child_end = multiprocessing.get_context("spawn").Pipe()
        try:
            with self._lock:
                if self._conn is None:
                    return None
                self._conn.send(Fork(prime))
                reduction.send_handle(self._conn, child_end.fileno(), self._process.pid)
                child = self._forked.get(timeout=FORK_REPLY_S)
        except (OSError, queue.Empty):
            # A zygote that does not answer is ended (its reader then sees it lost): a late
            # reply must not become the next fork's.
            child = None
            self._process.kill()
        finally:
            child_end.close()
        if child is None:
            parent.close()
            return None
        return child, parent

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.send(pipe.Dismiss())
            conn.close()
        self._stop_process()

    def _stop_process(self) -> None:
        if self._process is not None:
            self._process.join(5)
            if self._process.is_alive():
                self._process.kill()

    def _listen(self) -> None:
        conn = self._conn
        assert conn is not None
        try:
            while True:
                match conn.recv():
                    case Forked(pid):
                        self._children[pid] = child = ForkedChild(pid)
                        self._forked.put(child)
                    case Exited(pid, code):
                        ended = self._children.pop(pid, None)
                        if ended is not None:
                            ended.ended(code)
        except (EOFError, OSError):
            pass
        self._forked.put(None)  # a fork waiting for its reply learns now
        with self._lock:
            lost = self._conn is not None
            self._conn = None
        for child in list(self._children.values()):  # orphans now: their end is watched here
            threading.Thread(target=_watch_orphan, args=(child,), daemon=True).start()
        if lost:
            self._on_lost(self)


def _watch_orphan(child: ForkedChild) -> None:
    """A child whose zygote died: its exit code is out of reach, its end is not."""
    try:
        fd = os.pidfd_open(child.pid)
    except OSError:
        child.ended(None)
        return
    try:
        wait([fd])
    finally:
        os.close(fd)
    child.ended(None)


# The zygote's end --------------------------------------------------------------


def serve(conn: Connection) -> None:
    """The zygote: imports what runs need, says ``Ready``, and forks a child per ``Fork``
    until the agent dismisses it or goes away. It stays single-threaded: a fork copies
    only the thread that calls it, and a lock another thread held would stay held."""
    # A Ctrl+C in the agent's terminal reaches its whole group: the agent stops the pool
    # itself (a zygote that died of it would be restarted while the agent stops).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from troupe.subprocess_runner import child

    catalog = child.preload()
    problem = child.cuda_touched() or _threads_running()
    try:
        conn.send(pipe.Unfit(problem) if problem else pipe.Ready(os.getpid()))
    except OSError:  # the agent stopped while this imported: nothing to serve
        return
    if problem:
        return
    gc.freeze()  # what the zygote made stays out of every child's collections: no copy of its pages for them
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the wait below
    channels: list[Connection] = []  # each run child's, for its warm scripts (troupe.subprocess_runner.warm_script)

    def close_ours() -> None:  # in a fork: what is the zygote's is not the fork's
        for own in (wake_r, wake_w):
            os.close(own)
        for held in (conn, *channels):
            held.close()

    try:
        while True:
            ready = wait([conn, wake_r, *channels])
            if wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 512)
                _reap(conn)
            for channel in [c for c in channels if c in ready]:
                if not warm_script.answer(channel, close_ours):  # its run child is gone
                    channels.remove(channel)
                    channel.close()
            if conn in ready and not _answer(conn, catalog, close_ours, channels):
                return
    except (EOFError, OSError):  # the agent is gone: the zygote leaves, its children go on
        return


def _answer(conn: Connection, catalog: Any, close_ours: Callable[[], None], channels: list[Connection]) -> bool:
    match frame := conn.recv():
        case Fork(prime):
            fd = reduction.recv_handle(conn)
            ours, theirs = multiprocessing.Pipe()  # the child's channel back here, for its warm scripts
            pid = os.fork()
            if pid == 0:
                _child(fd, catalog, close_ours, prime, theirs)
            os.close(fd)
            theirs.close()
            channels.append(ours)
            conn.send(Forked(pid))
            return True
        case pipe.Dismiss():
            return False
        case _:
            raise TypeError(f"the zygote got an unknown frame {frame!r}")


def _child(fd: int, catalog: Any, close_ours: Callable[[], None], prime: bool, scripts: Connection) -> None:
    """In the forked child: drops what is the zygote's (the other children's channels
    too), runs its one run, and exits. ``scripts``: its own channel to the zygote."""
    code = 0
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setpgrp()  # out of the agent's terminal group, as a cold child (child.main): the agent ends its runs
        close_ours()
        warm_script.attach(scripts)
        # The zygote is a daemon (the agent's exit takes it along); a run is not, and may
        # start processes of its own (DDP ranks, a data loader's workers).
        multiprocessing.current_process().daemon = False
        from troupe.subprocess_runner import child

        child.forked(Connection(fd), catalog, prime)
    except BaseException:  # its run reported its own failure; this is the child's
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _reap(conn: Connection) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn.send(Exited(pid, os.waitstatus_to_exitcode(status)))


def _threads_running() -> str | None:
    count = threading.active_count()
    return f"{count - 1} threads started while importing; forking would copy only one" if count > 1 else None
