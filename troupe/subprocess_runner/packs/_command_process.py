"""A command's program as the run sees it: started below troupe's reaper
(``troupe/subprocess_runner/reaper.py``), which is the process this run waits for and signals.
The reaper ends only once every process the program started is gone, so waiting for it
is waiting for the whole tree, and its SIGTERM reaches every process of the tree once,
however it left its group or its environment."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

REAPER = Path(__file__).resolve().parent.parent / "reaper.py"
# How long after the grace a reaper that has not ended is killed with the command's group.
_REAPER_MARGIN_S = 5.0


class CommandProcess:
    """The reaper (``process``: its stdout and stderr are the program's) and the
    program's pid, which is also its process group's id."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str], grace_s: float) -> None:
        read_end, write_end = os.pipe()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-S", str(REAPER), str(write_end), repr(float(grace_s)), "--", *argv],
                cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True, pass_fds=(write_end,))
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        self._status = os.fdopen(read_end, "rb")
        first = self._next()  # the program started, or why not (a few ms: the reaper imports no troupe)
        if "started" not in first:
            self.process.wait()
            for stream in (self._status, self.process.stdout, self.process.stderr):
                if stream is not None:
                    stream.close()
            raise OSError(first.get("error") or "troupe's reaper ended before it started the program")
        self.pid = int(first["started"])
        self._grace_s = grace_s

    def _next(self) -> dict[str, Any]:
        line = self._status.readline()
        try:
            told = json.loads(line) if line else {}
        except ValueError:
            told = {}
        return told if isinstance(told, dict) else {}

    def exit_code(self) -> int | None:
        """The program's exit code once the reaper has ended (negative: the signal that
        ended it); None when the reaper was killed before it could say."""
        self.process.wait()
        code = None
        while told := self._next():
            if "exit" in told:
                code = int(told["exit"])
        with contextlib.suppress(OSError):
            self._status.close()
        return code

    def stop(self) -> None:
        """SIGTERM to the reaper, which passes it once to every process below it and
        SIGKILLs what is left after the grace. A reaper not gone well after that is
        killed with the program's group."""
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGTERM)  # nothing once it has been waited for
        try:
            self.process.wait(self._grace_s + _REAPER_MARGIN_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
            self.process.kill()
            self.process.wait()
