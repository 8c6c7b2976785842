"""How a ``script.Command`` starts: below troupe's reaper in a fresh interpreter
(``_command_process``), or, with ``warm: true`` in a run child the agent's zygote forked,
forked from that zygote with torch already imported (``troupe.subprocess_runner.warm_script``).
Either way the run gets a ``CommandProcess``: the same pipes, status lines, stop and
exit code, so what reads a command's output, watches its limits and ends its tree does
not know which it was. Where no zygote can fork it (the control plane, an agent started
without ``--warm``, a run that sets ``resources.env``, a zygote that refused or is gone)
the script starts in a fresh interpreter, and the run says so once, with why."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
from pathlib import Path
from typing import Any

from troupe.subprocess_runner import warm_script
from troupe.subprocess_runner.packs._command_process import CommandProcess

WARM_FALLBACK = "warm_fallback"  # the warning's code


def start_command(ctx: Any, params: dict[str, Any], argv: list[str], cwd: Path, env: dict[str, str],
                  grace_s: float) -> CommandProcess:
    """The command's process; OSError when it cannot be started at all."""
    if not params.get("warm"):
        return CommandProcess(argv, cwd, env, grace_s)
    why = warm_script.cold_reason()
    if why is None:
        try:
            return WarmCommandProcess(argv, cwd, env, grace_s)
        except OSError as exc:
            why = str(exc)
    ctx.warning(f"warm: {why}, so the script starts in a fresh interpreter", code=WARM_FALLBACK)
    return CommandProcess(argv, cwd, env, grace_s)


class WarmCommandProcess(CommandProcess):
    """A warm script's reaper, forked by the zygote, seen as a ``CommandProcess``'s: its
    pipes are the script's stdout and stderr, its status lines the reaper's."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str], grace_s: float) -> None:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        status_r, status_w = os.pipe()
        life_r, life_w = os.pipe()  # the reaper's lifeline: only this process writes it
        try:
            pid, pidfd = warm_script.fork({"argv": argv, "cwd": str(cwd), "env": env, "grace_s": float(grace_s)},
                                          (out_w, err_w, status_w, life_r))
        except BaseException:
            for fd in (out_r, err_r, status_r, life_w):
                os.close(fd)
            raise
        finally:
            for fd in (out_w, err_w, status_w, life_r):
                os.close(fd)
        self.process: Any = _Forked(pid, pidfd, out_r, err_r, life_w)
        self._status = os.fdopen(status_r, "rb")
        self._grace_s = grace_s
        first = self._next()  # the script's process exists, or the reaper failed to make it
        if "started" not in first:
            self.process.wait()
            self.process.close()
            self._status.close()
            raise OSError(first.get("error") or "the warm script's reaper ended before it started the script")
        self.pid = int(first["started"])

    def exit_code(self) -> int | None:
        code = super().exit_code()
        self.process.close()
        return code


class _Forked:
    """What ``CommandProcess`` asks of its ``subprocess.Popen``, for a reaper this
    process is not the parent of: waited for and signalled through a pidfd."""

    def __init__(self, pid: int, pidfd: int, out: int, err: int, lifeline: int) -> None:
        self.pid, self._pidfd, self._lifeline = pid, pidfd, lifeline
        self.stdout = os.fdopen(out, "rb", buffering=0)
        self.stderr = os.fdopen(err, "rb", buffering=0)
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if self._pidfd < 0 or _readable(self._pidfd, timeout):
                self.returncode = 0  # its own status is the zygote's to reap; the script's comes in the status lines
            else:
                raise subprocess.TimeoutExpired("warm script", timeout or 0.0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None and self._pidfd >= 0:
            signal.pidfd_send_signal(self._pidfd, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def close(self) -> None:
        """Its descriptors, once it ended; the lifeline's close would stop its tree."""
        for fd in (self._pidfd, self._lifeline):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._pidfd = self._lifeline = -1


def _readable(fd: int, timeout: float | None) -> bool:
    """Whether ``fd`` is readable within ``timeout`` (a pidfd is once its process ended)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout is None else timeout * 1000))
