"""The two processes of a warm script, both forked from the agent's zygote (see
``troupe.subprocess_runner.warm_script``): the reaper, then below it the script.

The reaper is ``troupe.subprocess_runner.reaper``'s, in a fork rather than a fresh ``python -I
-S``: a new session, the child subreaper of everything below it, the same status lines
and the same stop (SIGTERM to every descendant, SIGKILL after the grace) once the script
ends, a stop signal comes or the run child that waits is gone (its lifeline closes: the
zygote, not the run child, is this process's parent).

The script's process becomes what ``python SCRIPT ARGS`` would be where it runs: a
process group of its own, stdin from /dev/null, stdout and stderr the run's pipes (read
as a cold command's are), no descriptor of the zygote's, default signal handlers, the
command's environment (``os.environ`` replaced, so the processes it starts get it too),
its cwd, ``sys.argv`` and ``sys.path[0]``, fresh random generators, torch's thread count
from the command's ``OMP_NUM_THREADS``, no logging handler, and troupe's own modules out
of ``sys.modules`` (a script's own ``cli.py`` or ``protocol.py`` is imported, not ours).
It then runs the script with ``runpy`` as ``__main__``, waits for its non-daemon threads,
runs its own ``atexit`` functions (not the teardown of what the zygote imported) and
exits with its code, as an interpreter would. Torch and what the zygote imported stay
imported: that is the point, and also what a script that needs a fresh interpreter's
state must not use this for (docs/scripts.md).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import itertools
import logging
import multiprocessing.process
import multiprocessing.resource_tracker
import multiprocessing.util
import os
import random
import runpy
import select
import signal
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any, NoReturn

from troupe.subprocess_runner import reaper as cold_reaper

# The top-level name of troupe's own packages, which the zygote imported: a script's own
# module of that name must be found on its path, as in a fresh interpreter.
_OURS = ("troupe",)
_names: list[str] = []  # theirs in the zygote (``ahead``)
# What the script's process takes out of reach and still holds: troupe's modules (freeing
# them would write their pages) and the zygote's std streams (one would close its fd).
_kept: list[Any] = []


def reaper(spec: dict[str, Any], fds: list[int], close_zygotes: Callable[[], None]) -> NoReturn:
    """The forked reaper: never returns (``os._exit``)."""
    code = 0
    try:
        signal.set_wakeup_fd(-1)  # the zygote's, closed below
        _flush()  # what the zygote's streams hold is the agent's output, not the script's
        close_zygotes()
        out, err, status, lifeline = fds
        os.setsid()  # as a cold command's reaper (start_new_session): out of the agent's terminal and group
        cold_reaper.hold()
        _descriptors(out, err, keep=(status, lifeline))
        script = os.fork()
        if script == 0:
            os.close(status)
            os.close(lifeline)
            _script(spec)  # never returns
        with contextlib.suppress(OSError):  # it may have set it itself already
            os.setpgid(script, script)
        cold_reaper.tell(status, "started", script)
        cold_reaper.watch(script, status, float(spec["grace_s"]), lambda: _closed(lifeline))
    except BaseException:  # nothing of the zygote's may run on in this fork
        code = 1
    os._exit(code)


def _closed(lifeline: int) -> bool:
    """Whether the run child is gone: the only writer of the lifeline closed it."""
    poller = select.poll()
    poller.register(lifeline, select.POLLIN)
    return bool(poller.poll(0))


def _descriptors(out: int, err: int, keep: tuple[int, ...]) -> None:
    """0, 1 and 2 as a command's, and of the rest only ``keep``: the zygote's pipes, its
    channels and the other runs' descriptors are not the script's."""
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, _fd_limit())
    for fd in keep:
        os.set_inheritable(fd, False)


def _fd_limit() -> int:
    try:
        return max(int(name) for name in os.listdir("/proc/self/fd")) + 1
    except (OSError, ValueError):
        return os.sysconf("SC_OPEN_MAX")


def _script(spec: dict[str, Any]) -> NoReturn:
    """The script's process: made what a fresh interpreter would be here, then the script."""
    code = 1
    try:
        os.setpgid(0, 0)
        _signals()
        os.chdir(spec["cwd"])
        os.environ.clear()
        os.environ.update(spec["env"])
        _streams()
        args = list(spec["argv"][1:])
        while args and args[0] == "-u":  # a no-op: output is unbuffered already
            args = args[1:]
        _interpreter(args)
        code = _run(args)
        _finish()
    except BaseException:  # troupe's part failed: said on the script's stderr, as a start failure
        with contextlib.suppress(BaseException):
            import traceback

            traceback.print_exc()
    _flush()
    os._exit(code)


def _signals() -> None:
    """What a fresh interpreter has: the default action but for Python's own SIGINT
    handler and its ignored SIGPIPE and SIGXFSZ; no wake-up fd; nothing blocked."""
    signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):
            handler = signal.getsignal(sig)
            if sig == signal.SIGINT:
                signal.signal(sig, signal.default_int_handler)
            elif sig in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_IGN)
            elif handler not in (signal.SIG_DFL, None):
                signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def _streams() -> None:
    """New ``sys.std*`` on 0, 1 and 2, unbuffered as ``PYTHONUNBUFFERED`` asks (troupe
    sets it for every command), in the zygote's encoding."""
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    named, _, named_errors = os.environ.get("PYTHONIOENCODING", "").partition(":")
    encoding = named or (sys.__stdout__.encoding if sys.__stdout__ is not None else "utf-8")

    def stream(fd: int, mode: str, errors: str) -> io.TextIOWrapper:
        errors = named_errors if named_errors and fd != 2 else errors
        raw = io.FileIO(fd, mode, closefd=False)
        binary: Any = raw if unbuffered and mode == "w" else (
            io.BufferedWriter(raw) if mode == "w" else io.BufferedReader(raw))
        return io.TextIOWrapper(binary, encoding=encoding, errors=errors, newline="\n" if mode == "w" else None,
                                line_buffering=False, write_through=unbuffered)

    _kept.extend((sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__, sys.__stderr__))
    sys.stdin, sys.stdout, sys.stderr = stream(0, "r", "strict"), stream(1, "w", "strict"), \
        stream(2, "w", "backslashreplace")
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr  # type: ignore[misc]


def ahead() -> None:
    """In the zygote, before its first script's fork: the names of troupe's modules it
    imported, found once (a scan in each script's process would write a page of every
    module name it touches, tens of ms of copies on a small machine)."""
    if not _names:
        _names.extend(n for n in sys.modules if n.split(".", 1)[0] in _OURS)



def _interpreter(args: list[str]) -> None:
    """The interpreter's own state as a fresh one's where it matters to a script."""
    _kept.extend(sys.modules.pop(name, None) for name in _names)
    first = os.getcwd() if args[0] == "-m" else os.path.dirname(os.path.abspath(args[0]))
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first, *extra, *(p for p in sys.path[1:] if p not in extra)]
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    tempfile.tempdir = None  # the command's TMPDIR, if it sets one
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    # The zygote is a multiprocessing child; the script is a main process of its own,
    # with none of the zygote's finalizers.
    multiprocessing.util._finalizer_registry.clear()  # type: ignore[attr-defined]
    multiprocessing.util._run_after_forkers()  # type: ignore[attr-defined]
    _main_process()
    _exit_functions()
    random.seed()
    for name, reseed in (("numpy", lambda m: m.random.seed()), ("torch", lambda m: m.seed())):
        if name in sys.modules:
            reseed(sys.modules[name])
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if "torch" in sys.modules and threads.isdigit() and int(threads) > 0:
        sys.modules["torch"].set_num_threads(int(threads))


def _main_process() -> None:
    """The zygote's ``multiprocessing`` process object made the main process's, as in a
    fresh interpreter: named MainProcess, no parent, not a daemon (which may start none),
    a fresh authentication key, children counted from 1."""
    process: Any = multiprocessing.process
    current = process.current_process()
    current._identity, current._parent_pid, current._popen = (), None, None
    current._name = "MainProcess"
    current._config = {"authkey": process.AuthenticationString(os.urandom(32)), "semprefix": "/mp"}
    process._parent_process, process._children, process._process_counter = None, set(), itertools.count(1)
    tracker: Any = multiprocessing.resource_tracker._resource_tracker
    tracker._fd = tracker._pid = None  # the agent's tracker, whose pipe is closed here: the script starts its own


def _exit_functions() -> None:
    """The script's own exit functions, not the zygote's: torch's teardown of its
    operator libraries and its compile-time table cost a warm script's end about 0.1 s,
    in a process that is about to leave. What a script's exit relies on stays: its
    logging handlers' flush, its ``multiprocessing`` children's end, the finalizers it
    makes (a ``TemporaryDirectory``'s removal)."""
    atexit._clear()
    atexit.register(logging.shutdown)
    atexit.register(multiprocessing.util._exit_function)  # type: ignore[attr-defined]
    finalizers: Any = weakref.finalize
    for info in finalizers._registry.values():  # the zygote's: not run at this exit
        info.atexit = False
    atexit.register(finalizers._exitfunc)


def _run(args: list[str]) -> int:
    """The script as ``__main__``; its exit code as the interpreter gives it."""
    try:
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]  # runpy puts the module's file in argv[0]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(args)
            path = os.path.abspath(args[0])
            try:
                with open(path, "rb"):
                    pass
            except OSError as exc:  # python's own words for a script it cannot open
                print(f"{sys.executable}: can't open file {path!r}: [Errno {exc.errno}] {exc.strerror}",
                      file=sys.stderr)
                return 2
            runpy.run_path(args[0], run_name="__main__")
    except SystemExit as exc:
        return _exit_code(exc.code)
    except BaseException as exc:
        shown = _scripts_frames(exc.__traceback__)
        sys.excepthook(type(exc), exc.with_traceback(shown), shown)
        return 128 + signal.SIGINT if isinstance(exc, KeyboardInterrupt) else 1
    return 0


def _scripts_frames(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the script's first frame, as a fresh interpreter prints it:
    not this module's and runpy's frames above it."""
    ours = {__file__, runpy.__file__, "<frozen runpy>"}
    first = tb
    while first is not None and first.tb_frame.f_code.co_filename in ours:
        first = first.tb_next
    return first or tb


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _finish() -> None:
    """What an interpreter does at its end: waits for the script's non-daemon threads,
    then runs its exit functions (a writer's last flush, MLflow's end of run)."""
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            if stream is not None:
                stream.flush()
