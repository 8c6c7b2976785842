"""The small process between a run and its command: it starts the command and outlives
it, and nothing the command starts outlives the reaper.

A process that leaves its group (``setsid``, a daemon's double fork) escapes a signal
to the group, and one that clears its environment escapes a search for the run's mark.
On Linux this process is a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``): every
orphan below it is re-parented to it rather than to init, so the command's whole tree is
always its descendants. When the command ends, or when this process is asked to stop
(SIGTERM, SIGINT, SIGHUP) or its parent is gone, every descendant gets SIGTERM once,
then SIGKILL after the grace, until none is left; then it exits.

Why a process of its own rather than the server or the run child itself: the attribute
makes its holder the parent of every orphan below it, and the control plane (where
in-process commands start, from threads) or a run child with DDP ranks and data loader
workers would then reap processes that ``subprocess`` and ``multiprocessing`` wait for.
This process has no other child, so it reaps with ``waitpid(-1)``.

Started as ``python -I -S reaper.py STATUS_FD GRACE_S -- ARGV...`` in the command's
folder, environment and a new session; the command gets a process group of its own
(where there is no /proc, that group is what a stop reaches). It imports nothing of
troupe (``-S``: not even site), so it starts in a few milliseconds. What it tells its
parent goes, one JSON line at a time, to STATUS_FD: ``{"started": pid}`` or
``{"error": "..."}`` (the program cannot be started), then ``{"exit": code}`` (negative:
the signal that ended it), as soon as the command ends."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
_STOP = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
_WAKE_S = 0.5  # how often the parent is looked at while nothing happens
_KILL_S = 0.05  # between SIGKILL rounds: a process forking meanwhile gets one too


def main(args: list[str]) -> int:
    status_fd, grace_s, argv = int(args[0]), float(args[1]), args[3:]
    os.set_inheritable(status_fd, False)  # the command's tree never holds the parent's pipe open
    parent = os.getppid()
    hold()
    try:
        # The command, in a group of its own, gets no blocked signal and the default
        # action for SIGPIPE and SIGXFSZ, which Python ignores (as subprocess's
        # restore_signals gives them).
        command = os.posix_spawnp(argv[0], argv, dict(os.environ), setpgroup=0, setsigmask=(),
                                  setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
    except OSError as exc:
        tell(status_fd, "error", exc.strerror or str(exc))
        return 0
    tell(status_fd, "started", command)
    watch(command, status_fd, grace_s, lambda: os.getppid() != parent)
    return 0


def hold() -> None:
    """Makes this process the subreaper of what it starts next, its stop signals and
    SIGCHLD kept for ``watch`` (blocked: a process it forks unblocks them)."""
    _become_subreaper()
    for sig in (*_STOP, signal.SIGCHLD):  # whatever the parent ignored: an ignored SIGCHLD leaves no status to wait for
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP | {signal.SIGCHLD})


def watch(command: int, status_fd: int, grace_s: float, gone: Callable[[], bool]) -> None:
    """Until no child is left: tells the command's exit, and stops the whole tree once the
    command ended, a stop signal came or ``gone()`` says the run that waits is gone."""
    tree = _Tree(command, status_fd)
    stop_at: float | None = None  # when what is left gets SIGKILL
    while not tree.reaped():  # until no child is left: the command and all it started are gone
        if stop_at is None and (tree.ended or gone()):
            stop_at = tree.stop(grace_s)
        if stop_at is not None and time.monotonic() >= stop_at:
            tree.signal(signal.SIGKILL)
            timeout = _KILL_S
        else:
            timeout = _WAKE_S if stop_at is None else min(_WAKE_S, max(0.0, stop_at - time.monotonic()))
        received = signal.sigtimedwait(_STOP | {signal.SIGCHLD}, timeout)
        if received is not None and received.si_signo in _STOP and stop_at is None:
            stop_at = tree.stop(grace_s)


def _become_subreaper() -> None:
    """Linux only; elsewhere an escaped process is stopped only through the group."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


class _Tree:
    """The command and everything below this process."""

    def __init__(self, command: int, status_fd: int) -> None:
        self._command, self._status_fd = command, status_fd
        self.ended = False  # the command's own status is reaped (and told)

    def reaped(self) -> bool:
        """Reaps every child that ended; True once no child is left."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return True
            if pid == 0:
                return False
            if pid == self._command:
                self.ended = True
                tell(self._status_fd, "exit", os.waitstatus_to_exitcode(status))

    def stop(self, grace_s: float) -> float:
        """SIGTERM once to every descendant; returns when SIGKILL is due."""
        self.signal(signal.SIGTERM)
        self.signal(signal.SIGCONT)  # a stopped process acts on its SIGTERM only once it runs
        return time.monotonic() + grace_s

    def signal(self, sig: int) -> None:
        found = _descendants()
        if found is None:  # no /proc: the command's group, as far as it reaches
            found = [-self._command]
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def _descendants() -> list[int] | None:
    """Every process below this one, found in /proc by parent (None without /proc)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    children: dict[int, list[int]] = {}
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                ppid = int(stat.read().rpartition(b")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    found, frontier = [], [os.getpid()]
    while frontier:
        for child in children.get(frontier.pop(), ()):
            found.append(child)
            frontier.append(child)
    return found


def tell(fd: int, key: str, value: object) -> None:
    """One line of JSON, written by hand: the json module and the re it imports cost a
    few milliseconds of every command's start."""
    text = '"' + "".join(c if c.isalnum() or c in " .,:-_'()/" else f"\\u{ord(c):04x}" for c in value) + '"' \
        if isinstance(value, str) else str(value)
    with contextlib.suppress(OSError):  # the parent is gone: nobody reads it
        os.write(fd, f'{{"{key}": {text}}}\n'.encode())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
