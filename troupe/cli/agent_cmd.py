"""``troupe agent start | stop | forget``: the worker agent that dials out to a control
plane. Its files live in platformdirs' user config and state dirs (``XDG_*`` move them):
credentials (0600), keyed by (control-plane URL, worker name), and a pid file per worker."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import math
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import platformdirs

from troupe.cli.client import Client
from troupe.cli.config import load_settings
from troupe.cli.errors import BadOption, CliError
from troupe.cli.event_loop import run as run_loop
from troupe.protocol.worker import INSTANCE
from troupe.subprocess_runner.devices import host_machine_id
from troupe.subprocess_runner.pack_probe import ImportLimits

log = logging.getLogger("troupe.cli")


def _config_dir() -> Path:
    return Path(platformdirs.user_config_dir("troupe"))


def _state_dir() -> Path:
    return Path(platformdirs.user_state_dir("troupe"))


def _credentials_file() -> Path:
    return _config_dir() / "agent-credentials.json"


def _read_credentials() -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(_credentials_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@contextlib.contextmanager
def _credentials_locked() -> Iterator[dict[str, dict[str, Any]]]:
    """The stored credentials, to change under an exclusive lock: the tasks of a batch
    array start together and share one home, so their read-modify-writes must not
    interleave. What the block leaves in the dict is written back whole."""
    path = _credentials_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = _read_credentials()
        yield data
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle)
        os.replace(tmp, path)


def _key(url: str, name: str) -> str:
    return f"{url.rstrip('/')}|{name}"


def _matching(credentials: dict[str, Any], url: str | None, name: str | None) -> list[str]:
    return [key for key in credentials
            if (url is None or key.startswith(f"{url.rstrip('/')}|")) and (name is None or key.endswith(f"|{name}"))]


def machine_id(simulated: dict[str, Any] | None) -> str:
    if simulated and simulated.get("machine_id"):
        return str(simulated["machine_id"])
    return host_machine_id()


def _enroll(url: str, token: str, name: str | None, machine: str, options: StartOptions) -> tuple[str, str]:
    status, reply = Client(url, None, options.unix_socket, options.ca).request("POST", "/api/workers/credentials",
                                                           {"token": token, "name": name, "machine_id": machine})
    if status != 201:
        error = reply.get("error", {}) if isinstance(reply, dict) else {}
        raise CliError(f"enrollment refused ({status} {error.get('code', '')}): {error.get('message', reply)}")
    return reply["name"], reply["credential"]


@dataclass(frozen=True)
class StartOptions:
    """How ``troupe agent start`` runs, beyond where it dials and as whom."""

    one_shot: bool = False  # one run, then exit with its outcome (a batch job's agent)
    idle_timeout_s: float = 600.0
    instance: str | None = None  # a batch array's task id
    deadline: float | None = None  # when the batch job ends (default: SLURM_JOB_END_TIME)
    unix_socket: str | None = None  # dial through this socket (an ssh -R forward)
    foreground: bool = False  # else detached, its output in a log file
    mounts: tuple[str, ...] = ()  # LABEL=PATH
    warm: int = 0  # run children kept forked from the zygote
    ca: str | None = None  # the certificate of an https control plane's own authority
    packs: tuple[str, ...] = ()  # folders of packs of this machine's own (--packs)
    accept_packs: bool = False  # fetch the control plane's folder packs as runs need them


def start(url: str, token: str | None, name: str | None, simulated: dict[str, Any] | None,
          options: StartOptions = StartOptions()) -> int:
    from troupe.subprocess_runner.seeding import number_cards_by_bus
    from troupe.supervisors.agent import Agent, AgentConfig

    number_cards_by_bus()

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    machine = machine_id(simulated)
    mounts = _mounts(options.mounts)
    if options.instance is not None and (not options.one_shot or not name):
        raise CliError("--instance is for the tasks of a batch array: give it with --one-shot and --name")
    if options.deadline is not None and not math.isfinite(options.deadline):
        raise BadOption(f"--deadline {options.deadline}: give the batch job's end in epoch seconds")
    if options.instance is not None and not re.fullmatch(INSTANCE, options.instance):
        raise BadOption(f"--instance {options.instance[:80]!r}: a task id is 1 to 64 letters, digits, '_', '.' or '-'")
    for folder in (_state_dir() / "artifact-outbox", _state_dir() / "outputs", _state_dir() / "packs"):
        _writable(folder)  # before a join token is spent on an agent that could not start
    name, credential, ca = _credential(url, token, name, machine, options)
    label = f"{name}{'#' + options.instance if options.instance else ''}"
    # A batch job's agent, and one an SSH session runs, belong to that job or session.
    if not (options.foreground or options.one_shot or options.unix_socket):
        _detach(label)
    pid_file = _state_dir() / f"agent-{label}.pid"
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.write_text(str(os.getpid()))
    print(f"troupe agent {name} dialing {url}" + (" (one-shot)" if options.one_shot else ""), flush=True)
    try:
        settings = load_settings(packs=[Path(p) for p in options.packs])
        for warning in settings.warnings:
            log.warning("setting ignored: %s", warning)
        return run_loop(_serve(Agent(AgentConfig(
            url, name, credential, machine, simulated, settings.worker_kill_grace_s,
            int(settings.agent_outbox_mb * 1024 * 1024), settings.cuda_visible_devices, options.one_shot,
            options.idle_timeout_s, options.instance, options.deadline or settings.job_end_time, options.unix_socket,
            mounts, _state_dir() / "outputs" / label, settings.recorded_outputs_keep,
            0 if options.one_shot else options.warm, settings.ddp_cpu_ranks,
            _state_dir() / "artifact-outbox" / label, int(settings.agent_artifact_outbox_gib * 2**30), ca,
            tuple(str(root) for root in settings.data_roots),
            command_kill_grace_s=settings.command_kill_grace_s, pack_dirs=settings.pack_dirs,
            accept_packs=options.accept_packs, pack_cache=_state_dir() / "packs",
            pack_import=ImportLimits(settings.pack_import_timeout_s, settings.pack_import_memory_mib)))),
            settings.event_loop)
    finally:
        pid_file.unlink(missing_ok=True)


def _writable(folder: Path) -> None:
    """A folder of the agent's state it writes runs' files into, made if need be."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise CliError(f"the agent cannot write to {folder}: {exc.strerror or exc}; free some room there, or set "
                       "XDG_STATE_HOME to a folder it can write") from None


def _credential(url: str, token: str | None, name: str | None, machine: str,
                options: StartOptions) -> tuple[str, str, str | None]:
    """The worker's name, credential and trusted certificate (``--ca``): redeemed from
    ``token``, or stored by an earlier start (which kept its ``--ca`` too)."""
    if token and options.instance is not None:
        # The tasks of an array start together with one join command: the first to get the
        # lock redeems the token, the others use the credential it stored.
        assert name is not None
        with _credentials_locked() as stored:
            if _key(url, name) not in stored:
                name, credential = _enroll(url, token, name, machine, options)
                stored[_key(url, name)] = {"credential": credential, "ca": options.ca}
            return name, stored[_key(url, name)]["credential"], options.ca
    if token:
        name, credential = _enroll(url, token, name, machine, options)
        with _credentials_locked() as stored:
            stored[_key(url, name)] = {"credential": credential, "ca": options.ca}
        return name, credential, options.ca
    credentials = _read_credentials()
    known = _matching(credentials, url, name)
    if len(known) != 1:
        raise CliError(f"no stored credential for {url}" + (f" as {name}" if name else "") +
                       "; start with the join command (--token) the control plane printed")
    entry = credentials[known[0]]
    return known[0].split("|", 1)[1], entry["credential"], options.ca or entry.get("ca")


def _mounts(given: tuple[str, ...]) -> dict[str, str]:
    """``--mount data=/mnt/nas``: the storage labels this agent reports."""
    found = {}
    for entry in given:
        label, sep, path = entry.partition("=")
        if not sep or not re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,63}", label) or not path:
            raise CliError(f"--mount {entry!r}: want LABEL=PATH, the label in lowercase letters, digits, '_.-'")
        found[label] = str(Path(path).expanduser())
    return found


def _detach(label: str) -> None:
    """Goes on in the background, in a session of its own, its output in a log file in
    the state dir; the terminal gets the pid, the log and how to stop it."""
    log_path = _state_dir() / f"agent-{label}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    pid = os.fork()
    if pid > 0:
        print(f"troupe agent {label} runs in the background (pid {pid}); log {log_path}; stop it with "
              f"`troupe agent stop --name {label.split('#')[0]}`", flush=True)
        os._exit(0)
    os.setsid()
    out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)


# ``troupe agent stop`` asks with this signal: drain, let the running runs end, stop.
DRAIN_SIGNAL = signal.SIGUSR1


async def _serve(agent: Any) -> int:
    stop, drain = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    # A hang-up (the terminal of a --foreground agent closed, an ssh -tt session dropped)
    # stops it as Ctrl+C does: its runs are cancelled and their process groups ended,
    # which a plain death by SIGHUP would leave running. Unless hang-ups were asked to be
    # ignored (nohup): then the agent and its runs go on.
    hangup = [] if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN else [signal.SIGHUP]
    for sig in (signal.SIGINT, signal.SIGTERM, *hangup):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(DRAIN_SIGNAL, drain.set)
    code: int = await agent.run(stop, drain)
    return code


def stop(name: str | None, timeout: float) -> int:
    """Drains each agent here (or ``name``'s): no new runs, the running ones end and are
    reported; past ``timeout`` it is stopped at once (its runs cancelled)."""
    pids = sorted(_state_dir().glob(f"agent-{name or '*'}.pid")) + (
        sorted(_state_dir().glob(f"agent-{name}#*.pid")) if name else [])
    if not pids:
        raise CliError("no troupe agent runs here" + (f" as {name}" if name else ""))
    for pid_file in pids:
        pid = int(pid_file.read_text())
        label = pid_file.stem.removeprefix("agent-")
        if not _signal(pid, DRAIN_SIGNAL, pid_file):
            continue
        print(f"draining agent {label} (pid {pid}): waiting up to {timeout:g} s for its runs", flush=True)
        if _gone(pid_file, timeout):
            print(f"stopped agent {label} (pid {pid})")
            continue
        print(f"agent {label} still has runs after {timeout:g} s: stopping it now", flush=True)
        _signal(pid, signal.SIGTERM, pid_file)
        _gone(pid_file, 60.0)
        print(f"stopped agent {label} (pid {pid})")
    return 0


def _signal(pid: int, sig: int, pid_file: Path) -> bool:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pid_file.unlink(missing_ok=True)
        return False
    return True


def _gone(pid_file: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while pid_file.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def forget(url: str | None, name: str | None) -> int:
    with _credentials_locked() as credentials:
        doomed = _matching(credentials, url, name)
        if not doomed:
            raise CliError("no stored credential matches")
        for key in doomed:
            del credentials[key]
            print(f"forgot {key.replace('|', ' as ')}")
    return 0
