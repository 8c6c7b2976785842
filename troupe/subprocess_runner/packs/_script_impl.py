"""``script.Command`` at run time: the program below troupe's reaper (a child subreaper,
``_command_process``), its two output streams read line by line on threads of their own,
its checkpoint folder watched, and its whole tree stopped (SIGTERM, then SIGKILL after
the machine's grace, ``TROUPE_COMMAND_KILL_GRACE_S``) when the run is cancelled, the
node's ``timeout_s`` passes, the group uses more of a shared card than the run's memory
budget, or the program ends. Nothing it started outlives the node, even a process that
left its group (``setsid``) or cleared its environment."""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import json
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from troupe.protocol.events import STEP_MAX
from troupe.subprocess_runner import checkpoint_bounds, code_record
from troupe.subprocess_runner.errors import RunCancelled
from troupe.subprocess_runner.memory import group_card_mib
from troupe.subprocess_runner.mlflow_endpoint import URI_VAR, MlflowEndpoint
from troupe.subprocess_runner.packs._command_process import CommandProcess
from troupe.subprocess_runner.packs._warm_command import start_command
from troupe.subprocess_runner.packs.script_pack import MLFLOW_OWN, THREAD_CAPS, var_text
from troupe.subprocess_runner.run_marker import RUN_ID_VAR, stop_carrying
from troupe.subprocess_runner.tensorboard_reader import FOLDER_VAR, TensorBoardFiles, command_folders

STDERR_TAIL = 20  # lines of stderr a failure quotes
_TAIL_LINE_MAX = 4096  # what a failure quotes of one line
JSON_LINE_MAX = 64 * 2**20  # the longest metric, progress or result line read
_CHUNK = 65536
_POLL_S = 0.1
_CHECKPOINT_POLL_S = 0.5


def run_command(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The command, with an MLflow endpoint of its run for as long as it runs, unless its
    env points MLflow elsewhere (a lab's own tracking server)."""
    if URI_VAR in params["env"]:
        return _command(ctx, params, {})
    with MlflowEndpoint(ctx, ctx.files("checkpoints").parent) as mlflow:
        return _command(ctx, params, mlflow.env)


def _inherited() -> dict[str, str]:
    """This process's environment, less the MLflow run and secret: those are troupe's
    endpoint's to give, and a command that logs to a lab's own server (its env's
    MLFLOW_TRACKING_URI) gets neither, not one the server was started with."""
    return {k: v for k, v in os.environ.items() if k not in MLFLOW_OWN}


def _command(ctx: Any, params: dict[str, Any], mlflow_env: dict[str, str]) -> dict[str, Any]:
    checkpoints = ctx.files("checkpoints")
    outputs = ctx.files("outputs")
    cwd = Path(params.get("cwd") or checkpoints.parent)  # the run's folder, unless it names one
    argv = [_filled(text, params, ctx) for text in params["argv"]]
    # The program gets the environment it would get from a shell here (not a setting
    # troupe reads), then the run's own variables, then the node's.
    env = {**_inherited(), **_own_env(ctx, checkpoints, outputs), **mlflow_env,
           **{k: str(v) for k, v in params["env"].items()}}
    board, board_folders = command_folders(checkpoints.parent, cwd, ctx.node_id)
    env[FOLDER_VAR] = str(board)
    if not cwd.is_dir():
        raise RuntimeError(f"cannot start {argv[0]!r}: its folder {str(cwd)!r} (cwd) is not a folder here")
    # What it runs, recorded before it starts (the files argv names, their git state): a fact of the run.
    ctx.sinks.emit("code", ctx.node_id, code_record.take(argv, cwd, ctx.limits.readable or ()))
    grace = ctx.limits.kill_grace_s
    try:
        command = start_command(ctx, params, argv, cwd, env, grace)  # warm: forked from the zygote, where it can be
    except OSError as exc:
        raise RuntimeError(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from None
    lines = _Lines(ctx)
    ended = threading.Event()  # the tree is gone: readers take what is left, then stop
    readers = [threading.Thread(target=lines.read, args=(command.process.stdout, "stdout", ended), daemon=True),
               threading.Thread(target=lines.read, args=(command.process.stderr, "stderr", ended), daemon=True)]
    for reader in readers:
        reader.start()
    watched = _Checkpoints(ctx, checkpoints, checkpoint_bounds.for_node(ctx, params))
    tensorboard = TensorBoardFiles(ctx, board_folders)
    try:
        _wait(command, ctx, watched, _Limits(ctx, argv[0], float(params.get("timeout_s") or 0)), tensorboard)
    finally:
        command.stop()
        code = command.exit_code()  # read whatever ended the wait: it closes the reaper's status pipe
        stop_carrying([ctx.run_id], grace)  # a process the reaper could not hold (not Linux) still carries the mark
        ended.set()
        for reader in readers:
            reader.join(5)
        watched.look()  # what it renamed into place last
        tensorboard.look()  # and the points it wrote last
        tensorboard.close()
    if code is None:
        raise RuntimeError(f"{argv[0]}'s exit status was lost: the process that watched it was killed")
    if code != 0:
        how = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with status {code}"
        raise CommandFailed(f"{argv[0]} {how}", list(lines.stderr_tail))
    return {"exit_code": code, "result": lines.result}


class CommandFailed(RuntimeError):
    """A command that did not exit 0: its words are what happened, then the last lines
    of its stderr (the run's error, read where its console is not: ``ls``, ``show``).
    ``console_tail_lines`` says how many lines those are, so that ``troupe logs``, which
    shows the console, shows a script's traceback once."""

    def __init__(self, what: str, stderr_tail: list[str]) -> None:
        tail = "\n".join(stderr_tail)
        super().__init__(what + (f"\nthe last lines of its stderr:\n{tail}" if tail else ""))
        self.console_tail_lines = tail.count("\n") + 2 if tail else 0  # the tail and the line that says so


def _filled(text: str, params: Mapping[str, Any], ctx: Any) -> str:
    values = {"seed": "" if ctx.seed is None else str(ctx.seed), "run_id": ctx.run_id, "python": sys.executable}
    values.update({k: var_text(v) for k, v in params["vars"].items()})
    return text.format_map(values)


def _own_env(ctx: Any, checkpoints: Path, outputs: Path) -> dict[str, str]:
    env = {RUN_ID_VAR: ctx.run_id, "TROUPE_CHECKPOINT_DIR": str(checkpoints), "TROUPE_OUTPUT_DIR": str(outputs),
           "PYTHONUNBUFFERED": "1"}
    if ctx.seed is not None:
        env["TROUPE_SEED"] = str(ctx.seed)
    if ctx.threads:  # the caps the node's declared cpus give, as an in-process node gets them
        env.update({name: str(ctx.threads) for name in THREAD_CAPS})
    if ctx.limits.memory_budget_mib:  # a script may cap its own allocator at it (troupe.cap_memory)
        env["TROUPE_MEMORY_BUDGET_MIB"] = str(ctx.limits.memory_budget_mib)
    point = ctx.resume_point()
    if point is not None:
        env["TROUPE_RESUME_FROM"] = str(_resume_copy(point, checkpoints.parent / "resume"))
    return env


def _resume_copy(point: Mapping[str, str], folder: Path) -> Path:
    """The checkpoint a resumed command goes on from, read once, checked against the
    sha256 its run records, and written where only this run reads it: the script loads
    the bytes that were checked, whatever happens to the stored file meanwhile."""
    from troupe.subprocess_runner.errors import CheckpointUnavailable

    source = Path(point["weights"])
    try:
        data = source.read_bytes()
    except OSError as exc:
        raise CheckpointUnavailable(f"the checkpoint to resume from cannot be read ({exc.strerror})") from None
    expected = point.get("weights_sha256")
    if expected is not None and hashlib.sha256(data).hexdigest() != expected:
        raise CheckpointUnavailable("the checkpoint to resume from is not the file the run records (sha256 "
                                    f"{expected[:16]}...): it changed after the rerun was asked for")
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / source.name
    copy.write_bytes(data)
    return copy


def _wait(command: CommandProcess, ctx: Any, watched: _Checkpoints, limits: _Limits,
          tensorboard: TensorBoardFiles | None = None) -> None:
    """Until the program and everything it started are gone (the reaper ended); raises
    on a cancel, a timeout or a budget passed, once the tree is stopped."""
    last_look = time.monotonic()
    while True:
        try:
            command.process.wait(_POLL_S)
            return
        except subprocess.TimeoutExpired:
            pass
        if ctx.cancelled:
            command.stop()
            raise RunCancelled("the run was cancelled")
        if time.monotonic() - last_look >= _CHECKPOINT_POLL_S:
            watched.look()
            if tensorboard is not None:
                tensorboard.look()
            last_look = time.monotonic()
            over = limits.passed(command.pid)
            if over is not None:
                command.stop()
                raise RuntimeError(over)


class _Limits:
    """The node's timeout and the run's memory budget on a shared card, looked at on the
    checkpoint poll's beat: the program is not this process, so neither a timer here nor
    the allocator cap the run's process has reaches it."""

    def __init__(self, ctx: Any, program: str, timeout_s: float) -> None:
        self._program, self._timeout_s = program, timeout_s
        self._deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
        self._budget = ctx.limits.memory_budget_mib
        if self._budget and group_card_mib(os.getpgid(0)) is None:
            ctx.warning(f"the memory budget of {self._budget} MiB is not watched on this command: NVML cannot "
                        "be read here", code="memory_budget_unwatched")
            self._budget = None

    def passed(self, pgid: int) -> str | None:
        """Why the group must stop now, or None."""
        if self._deadline is not None and time.monotonic() >= self._deadline:
            return f"{self._program} ran past its timeout_s of {self._timeout_s:g} s and was stopped"
        if self._budget:
            used = group_card_mib(pgid) or [0]
            if max(used) > self._budget:
                # The words torch uses, so that the run counts as out of memory (and the
                # next run of its graph is budgeted more).
                return (f"CUDA out of memory: {self._program}'s processes held {max(used)} MiB of a card, over "
                        f"the run's memory budget of {self._budget} MiB; they were stopped")
        return None


def _signal_name(number: int) -> str:
    """SIGKILL, or ``signal 40`` for one Python has no name for (a real-time signal)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _next_chunk(fd: int, ended: threading.Event) -> bytes:
    """What the pipe holds, as it comes; nothing at its end, or once the group is gone
    and nothing more came (a process that escaped it may hold the pipe open)."""
    while True:
        ready, _, _ = select.select([fd], [], [], _POLL_S)
        if ready:
            return os.read(fd, _CHUNK)
        if ended.is_set():
            return b""


class _Lines:
    """What the command prints: each line to the run's console, told apart by stream; a
    JSON object with ``metric`` is a point, one with ``progress`` the run's progress, the
    last one with ``result`` the node's ``result`` output."""

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL)
        self.result: Any = None

    def read(self, stream: IO[bytes], name: str, ended: threading.Event) -> None:
        """Whatever has come, as it comes: a line that never ends (a progress bar redrawn
        with ``\r``, a flood with no newline) reaches the console while it is printed and
        costs at most one chunk here. Only a line that starts with ``{`` is held whole, up
        to ``JSON_LINE_MAX``, to be read as JSON once it ends."""
        console = self._ctx.sinks.console
        text = codecs.getincrementaldecoder("utf-8")("replace")
        line = bytearray()  # the line being printed: whole if it may be JSON, else its start
        held = True  # all of it is in ``line`` so far
        while chunk := _next_chunk(stream.fileno(), ended):
            if console is not None:
                console.write(name, text.decode(chunk), self._ctx.node_id)
            else:  # a worker's child: its own descriptors are the run's console
                os.write(1 if name == "stdout" else 2, chunk)
            *whole, rest = chunk.split(b"\n")
            for part in whole:
                self._line_ended(bytes(line) + part if held else bytes(line), name, held)
                line.clear()
                held = True
            if not held:
                line += rest[:max(0, _TAIL_LINE_MAX - len(line))]
                continue
            line += rest
            if len(line) > (JSON_LINE_MAX if line.startswith(b"{") else _TAIL_LINE_MAX):
                held = False  # from here on only its start is kept, for the stderr tail
                if line.startswith(b"{"):
                    self._ctx.warning(f"a line of {name} past {JSON_LINE_MAX // 2**20} MiB is not read as JSON",
                                      code="line_not_read")
                del line[_TAIL_LINE_MAX:]
        if console is not None:
            console.write(name, text.decode(b"", final=True), self._ctx.node_id)
        if line:
            self._line_ended(bytes(line), name, held)

    def _line_ended(self, raw: bytes, name: str, whole: bool) -> None:
        if name == "stderr":
            self.stderr_tail.append(raw[:_TAIL_LINE_MAX].decode("utf-8", "replace").rstrip("\r"))
        if whole and raw.startswith(b"{"):
            self._structured(raw.decode("utf-8", "replace"))

    def _structured(self, line: str) -> None:
        """Runs on the thread that drains the command's output: nothing a line holds may
        end it (then the pipe fills and the command blocks for good)."""
        try:
            found = json.loads(line, parse_float=_number)
        except (ValueError, RecursionError):  # not JSON, or nested past what the reader takes
            return
        if not isinstance(found, dict):
            return
        try:
            if "metric" in found:
                name, value, step = found["metric"], found["value"], found.get("step")
                if not isinstance(name, str):
                    raise TypeError(f"a metric's name is text, got {json.dumps(name)[:40]}")
                if isinstance(value, _PastFloat):
                    raise OverflowError(f"its value {value.text[:40]} is past what a float holds")
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise TypeError(f"a metric's value is a JSON number, got {json.dumps(value)[:40]}")
                self._ctx.metric(name, float(value), step=None if step is None else _whole(step, "its step"))
            elif "progress" in found and found.get("total"):
                done, total = _whole(found["progress"], "progress"), _whole(found["total"], "total")
                if not 0 <= done <= STEP_MAX or not 0 < total <= STEP_MAX:
                    raise ValueError(f"progress and total must be counts up to 2**53, got {done!s:.40} of "
                                     f"{total!s:.40}")
                self._ctx.metric("progress", done / total, step=done, epoch=done, epochs=total)
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            self._ctx.warning(f"a {'metric' if 'metric' in found else 'progress'} line was not read: {exc}",
                              code="line_not_read")
        if "result" in found:
            self.result = found["result"]


def _whole(value: Any, what: str) -> int:
    """A step or a count as the line wrote it: a JSON integer (``3``, or ``3.0``). Text, a
    flag or a fraction is refused, not read as some other step (``"3"`` was charted at the
    next step, ``1.5`` at step 1)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            isinstance(value, float) and not value.is_integer()):
        raise TypeError(f"{what} is a whole number, got {json.dumps(value)[:40]}")
    return int(value)


class _PastFloat(float):
    """A JSON number past what a float holds (``1e999``), which Python's reader makes an
    infinity: kept apart from a written ``Infinity`` so a metric line of it is refused
    rather than charted as a value the program never printed."""

    text: str


def _number(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        past = _PastFloat(value)
        past.text = text
        return past
    return value


class _Checkpoints:
    """Files that appear, whole, in the checkpoint folder (a script writes a temporary
    name and renames it into place): each announced once as the run's checkpoint."""

    def __init__(self, ctx: Any, folder: Path, bounds: checkpoint_bounds.Bounds | None = None) -> None:
        self._ctx, self._folder = ctx, folder
        self._seen: set[str] = set()
        self._bounds = bounds  # keep_checkpoints / keep_best: the older ones are let go

    def look(self) -> None:
        found = []
        try:
            paths = list(self._folder.iterdir())
        except OSError:  # the script removed the folder: no checkpoint there now, and no failure
            paths = []
        for path in paths:
            if path.name in self._seen or path.name.startswith(".") or path.suffix in (".tmp", ".part"):
                continue
            with contextlib.suppress(OSError):  # renamed or removed meanwhile: not a checkpoint now
                if path.is_file():
                    found.append((path.stat().st_mtime, path))
        for _, path in sorted(found):
            self._seen.add(path.name)
            self._ctx.artifact("checkpoint", path)
            if self._bounds is not None:
                self._bounds.kept([("checkpoint", path)])
