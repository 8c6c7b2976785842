"""``troupe start`` and ``troupe stop``."""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import os
import resource
import signal
import socket
import sys
import threading
import time

from troupe.cli.errors import CliError, NoServer
from troupe.cli.event_loop import run as run_loop
from troupe.cli.session import acquire_lock, holder_pid, lock_is_held, read_session, remove_session, write_session
from troupe.protocol.settings import Settings
from troupe.protocol.version import __version__
from troupe.subprocess_runner.seeding import cap_threads, number_cards_by_bus
from troupe.supervisors.errors import StartRefused

log = logging.getLogger("troupe.cli")

# Measured beside two CPU-bound Python threads: API p99 fell from 326 ms to 24 ms.
SWITCH_INTERVAL_S = 0.0005
# ``troupe stop --leave-worker-runs`` asks with this signal instead of SIGTERM.
LEAVE_WORKER_RUNS = signal.SIGUSR1
# Allocations between two collections of the youngest generation (CPython's default is
# 700): a lab's load allocates fast, and each young collection is short either way.
GC_YOUNG_THRESHOLD = 10_000


def start(settings: Settings) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for warning in settings.warnings:
        log.warning("setting ignored: %s", warning)
    _check_tls(settings)
    lock = acquire_lock(settings.home)
    soft, _ = _raise_open_files()  # a flood of idle connections must not starve the server
    log.info("open-file limit %s", soft)
    # In-process runs get TROUPE_CPUS threads, leaving the event loop its cores.
    cap_threads(settings.cpus)
    number_cards_by_bus()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    # Nothing the start makes is garbage worth looking for (the imports' classes, the
    # restored runs): no collection until it is frozen (``_freeze_what_start_made``). A
    # restart at a lab's scale spent a tenth of its time before serving in collections.
    gc.disable()
    # In-process runs' prints go to their own console output; the server's go on here
    # (its log handler took the real stderr above, before the routing).
    from troupe.subprocess_runner.console import install

    install()
    try:
        code = run_loop(_serve(settings), settings.event_loop)
    except OSError as exc:
        if not _cannot_listen(exc):
            log.critical("the control plane stopped on an error", exc_info=True)
        else:  # the user's to mend, in one line: another port, another address
            log.error("cannot listen on %s port %s: %s (TROUPE_HOST / --host, TROUPE_PORT / --port)",
                      settings.host, settings.port, exc.strerror or exc)
        code = 1
    except StartRefused as exc:  # its owner's to mend: one line
        log.error("%s", exc)
        code = 1
    except Exception:
        log.critical("the control plane stopped on an error", exc_info=True)
        code = 1
    finally:
        remove_session(settings.home)
        lock.close()
    _exit_if_threads_linger(code)
    return code


async def _serve(settings: Settings) -> int:
    from troupe.subprocess_runner.catalog import load_catalog
    from troupe.subprocess_runner.pack_probe import ImportLimits
    from troupe.supervisors.root import ControlPlane

    # Each folder pack's import is tried in a child first: one that hangs or grows is
    # listed broken, and the server still binds its port.
    limits = ImportLimits(settings.pack_import_timeout_s, settings.pack_import_memory_mib)
    plane = ControlPlane(settings, load_catalog(settings.pack_dirs, limits), __version__)
    # From the first moment (`troupe stop` may signal the lock's holder while it starts):
    # a stop asked during the start is carried out, gracefully, once the start is done.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    def leave_worker_runs() -> None:
        plane.leave_worker_runs = True
        stop.set()

    loop.add_signal_handler(LEAVE_WORKER_RUNS, leave_worker_runs)
    port = await plane.start()
    _freeze_what_start_made()
    scheme = settings.scheme
    reached = [f"{scheme}://{_display_host(name)}:{port}" for name in plane.lan_hosts]
    url = settings.public_url or (reached[0] if reached else f"{scheme}://{_display_host(settings.host)}:{port}")
    login_url = await plane.login.new_link(url, printed_at_start=True)
    local = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else _display_host(settings.host)
    write_session(settings.home, f"{scheme}://{local}:{port}", plane.token, login_url,
                  str(settings.tls_cert) if settings.tls_cert else None)
    print(f"troupe {__version__} serving on {url}  (home {settings.home})", flush=True)
    if reached:
        print("Reachable on this network at: " + "  ".join(reached), flush=True)
        print("Reads need a session here: hand out a class link with `troupe open --uses 30 --expires 2h`.",
              flush=True)
    print(f"Open {login_url} to log this browser in (one use; `troupe open` makes another).", flush=True)
    print("Ctrl+C or `troupe stop` stops it gracefully.", flush=True)
    code = await plane.serve(stop)
    print("troupe stopped.", flush=True)
    return code


def _cannot_listen(exc: OSError) -> bool:
    """A port taken or not ours to bind, an address this machine does not have or cannot
    bind as given (an IPv6 link-local address without its scope, IPv6 on a machine
    without it), or a name that resolves to none."""
    return isinstance(exc, socket.gaierror) or exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES,
                                                             errno.EINVAL, errno.EAFNOSUPPORT)


def _check_tls(settings: Settings) -> None:
    """Both halves of TLS or neither, and a pair that loads, before anything starts."""
    if (settings.tls_cert is None) != (settings.tls_key is None):
        raise CliError("--tls-cert and --tls-key go together (TROUPE_TLS_CERT, TROUPE_TLS_KEY)")
    if settings.tls_cert is None or settings.tls_key is None:
        return
    import ssl

    from troupe.protocol.tls import EncryptedKey, server_context

    try:
        server_context(str(settings.tls_cert), str(settings.tls_key))
    except EncryptedKey as exc:
        raise CliError(str(exc)) from None
    except (OSError, ssl.SSLError) as exc:
        raise CliError(f"cannot serve TLS from {settings.tls_cert} and {settings.tls_key}: {exc}") from None


def _display_host(host: str) -> str:
    if host in ("0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _exit_if_threads_linger(code: int) -> None:
    # A node that ignores cancellation keeps its thread alive after the graceful stop
    # gave up on it; the record already says interrupted, so do not hang on exit.
    stuck = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if stuck:
        log.error("threads %s ignored cancellation; exiting without them", ", ".join(t.name for t in stuck))
        logging.shutdown()
        sys.stdout.flush()
        os._exit(code)


def stop(settings: Settings, timeout: float, leave_worker_runs: bool = False) -> int:
    if not lock_is_held(settings.home):
        raise NoServer(f"no troupe server runs on {settings.home}")
    # The lock's holder, as it wrote itself when it took the lock: a session.json can be a
    # dead server's until the new one serves, and its pid may be another process's now.
    pid = holder_pid(settings.home) or (read_session(settings.home) or {}).get("pid")
    if pid is None:  # never signal 0: that is this terminal's own process group
        raise CliError(f"{settings.home}'s session.json names no server pid; stop the server where it runs")
    try:
        os.kill(pid, LEAVE_WORKER_RUNS if leave_worker_runs else signal.SIGTERM)
    except ProcessLookupError:
        raise NoServer(f"the server's pid {pid} is gone") from None
    deadline = time.monotonic() + timeout
    while lock_is_held(settings.home):
        if time.monotonic() > deadline:
            raise CliError(f"the server (pid {pid}) did not stop within {timeout}s")
        time.sleep(0.05)
    print(f"stopped the server (pid {pid})" + ("; worker runs go on and queued runs wait for the next start"
                                                if leave_worker_runs else ""))
    return 0


def _raise_open_files() -> tuple[int, int]:
    """Soft limit of open files up to the hard one; returns (soft, hard) now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %s to %s: %s", soft, target, exc)
    return soft, hard


def _freeze_what_start_made() -> None:
    """What the imports and the start made lives as long as the process: it leaves the
    garbage collector's generations for good (``gc.freeze``), and young collections come
    every ``GC_YOUNG_THRESHOLD`` allocations. With a lab's load (200 agents, 50 runs a
    second) a full collection came every two seconds and held the event loop for 50-120
    ms, which every endpoint's p99 showed at once; now six came in 200 s, of 30 ms."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    gc.enable()
