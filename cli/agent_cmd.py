"""``troupe agent start | stop | forget``: the worker agent that dials out to a control
plane. Its files live in platformdirs' user config and state dirs (``XDG_*`` move them):
credentials (0600), keyed by (control-plane URL, worker name), and a pid file per worker."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import platformdirs

from cli.client import Client
from cli.config import load_settings
from cli.errors import CliError
from subprocess_runner.devices import host_machine_id

log = logging.getLogger("troupe.cli")


def _config_dir() -> Path:
    return Path(platformdirs.user_config_dir("troupe"))


def _state_dir() -> Path:
    return Path(platformdirs.user_state_dir("troupe"))


def _credentials_file() -> Path:
    return _config_dir() / "agent-credentials.json"


def _read_credentials() -> dict[str, dict[str, str]]:
    try:
        data = json.loads(_credentials_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@contextlib.contextmanager
def _credentials_locked() -> Iterator[dict[str, dict[str, str]]]:
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


def _enroll(url: str, token: str, name: str | None, machine: str, unix_socket: str | None) -> tuple[str, str]:
    status, reply = Client(url, None, unix_socket).request("POST", "/api/workers/credentials",
                                                           {"token": token, "name": name, "machine_id": machine})
    if status != 201:
        error = reply.get("error", {}) if isinstance(reply, dict) else {}
        raise CliError(f"enrollment refused ({status} {error.get('code', '')}): {error.get('message', reply)}")
    return reply["name"], reply["credential"]


def start(url: str, token: str | None, name: str | None, simulated: dict[str, Any] | None,
          one_shot: bool = False, idle_timeout_s: float = 600.0, instance: str | None = None,
          deadline: float | None = None, unix_socket: str | None = None) -> int:
    from subprocess_runner.devices import number_cards_by_bus
    from supervisors.agent import Agent, AgentConfig

    number_cards_by_bus()

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    machine = machine_id(simulated)
    if instance is not None and (not one_shot or not name):
        raise CliError("--instance is for the tasks of a batch array: give it with --one-shot and --name")
    credentials = _read_credentials()
    if token and instance is not None:
        # The tasks of an array start together with one join command: the first to get the
        # lock redeems the token, the others use the credential it stored.
        assert name is not None
        with _credentials_locked() as stored:
            if _key(url, name) not in stored:
                name, credential = _enroll(url, token, name, machine, unix_socket)
                stored[_key(url, name)] = {"credential": credential}
            credential = stored[_key(url, name)]["credential"]
    elif token:
        name, credential = _enroll(url, token, name, machine, unix_socket)
        with _credentials_locked() as stored:
            stored[_key(url, name)] = {"credential": credential}
    else:
        known = _matching(credentials, url, name)
        if len(known) != 1:
            raise CliError(f"no stored credential for {url}" + (f" as {name}" if name else "") +
                           "; start with the join command (--token) the control plane printed")
        name = known[0].split("|", 1)[1]
        credential = credentials[known[0]]["credential"]
    assert name is not None
    pid_file = _state_dir() / f"agent-{name}.pid"
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.write_text(str(os.getpid()))
    print(f"troupe agent {name} dialing {url}" + (" (one-shot)" if one_shot else ""), flush=True)
    try:
        settings = load_settings()
        return asyncio.run(_serve(Agent(AgentConfig(url, name, credential, machine, simulated,
                                                     settings.worker_kill_grace_s,
                                                     int(settings.agent_outbox_mb * 1024 * 1024),
                                                     settings.cuda_visible_devices, one_shot,
                                                     idle_timeout_s, instance, deadline or _job_end(),
                                                     unix_socket))))
    finally:
        pid_file.unlink(missing_ok=True)


def _job_end() -> float | None:
    """Inside a SLURM job: when it ends (``SLURM_JOB_END_TIME``, epoch seconds)."""
    raw = os.environ.get("SLURM_JOB_END_TIME", "").strip()
    try:
        return float(raw) if raw else None
    except ValueError:
        raise CliError(f"SLURM_JOB_END_TIME is not epoch seconds: {raw!r}") from None


async def _serve(agent: Any) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    code: int = await agent.run(stop)
    return code


def stop(name: str | None, timeout: float) -> int:
    pids = sorted(_state_dir().glob(f"agent-{name or '*'}.pid"))
    if not pids:
        raise CliError("no troupe agent runs here" + (f" as {name}" if name else ""))
    for pid_file in pids:
        pid = int(pid_file.read_text())
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pid_file.unlink(missing_ok=True)
            continue
        deadline = time.monotonic() + timeout
        while pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        print(f"stopped agent {pid_file.stem.removeprefix('agent-')} (pid {pid})")
    return 0


def forget(url: str | None, name: str | None) -> int:
    with _credentials_locked() as credentials:
        doomed = _matching(credentials, url, name)
        if not doomed:
            raise CliError("no stored credential matches")
        for key in doomed:
            del credentials[key]
            print(f"forgot {key.replace('|', ' as ')}")
    return 0
