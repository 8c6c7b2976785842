"""SshSession: a worker on a machine that cannot reach the control plane, served through
an SSH session the control plane opens (``ssh -R``), named ``ssh/<worker>``.

The session forwards a Unix socket on the remote host (created by sshd with mode 0600, a
fresh path each attempt) to the control plane's port, and runs ``troupe agent start``
there against that socket with a fresh one-time token. The agent then dials out through
the forward as any agent does; its websocket carries its own credential.

ssh ending for a reason a retry can fix (a reset connection, a reboot) starts it again
after a backoff. For a reason no retry can fix (authentication refused, a changed host
key, no ``troupe`` on the remote host, the control plane refusing the agent) it stops,
and the worker shows ``failed`` with the reason (#840). Stopping this actor (removing the
worker) ends the ssh process.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import re
import secrets
import shlex
import signal
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from troupe.actors.base import Actor, Shutdown, Snapshot
from troupe.actors.store import StoreClient
from troupe.actors.store.workers import CreateEnrollment
from troupe.protocol.errors import TroupeError

log = logging.getLogger("troupe.ssh")

BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)
TOKEN_TTL_S = 600.0
STOP_GRACE_S = 5.0
SSH_ERROR = 255  # ssh's own exit code for its errors (else it exits with the remote command's)
NOT_FOUND = 127  # the remote shell's exit code for a command it cannot find
# What ssh or the remote side prints, with the exit code it ends with, when no retry can
# help, and how the worker says it. Only the attempt that just ended is read, and only
# with its code: a line a healthy session printed (a .bashrc's "No such file or
# directory") never makes a dropped connection final. (A host name that does not
# resolve is retried, as any network failure: DNS comes and goes with a laptop's network.)
FINAL = (
    ("Permission denied (", SSH_ERROR, "the remote host refused the authentication"),
    ("Host key verification failed", SSH_ERROR, "the remote host's key does not match the known one"),
    ("REMOTE HOST IDENTIFICATION HAS CHANGED", SSH_ERROR, "the remote host's key changed"),
    ("", NOT_FOUND, "troupe is not found on the remote host (set remote_command)"),
    ("syntax error", 2, "the remote shell cannot read remote_command (a syntax error)"),
    ("refused by the control plane", 1, "the control plane refused the remote agent"),
    ("enrollment refused", 1, "the control plane refused the remote agent's enrollment"),
)
LINE_MAX = 4096  # what one line of ssh's output keeps
CHUNK = 65536
# The join token is on the remote command line, which a remote shell may echo (a syntax
# error quotes it): what is kept and shown never holds it.
_TOKEN = re.compile(r"(--token\s+)\S+")
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class SshTarget:
    name: str
    host: str
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    remote_command: str = "troupe"
    known_hosts_file: str | None = None


class SshSession(Actor):
    publishes_view = True  # its state changes in its own task: each change calls changed()

    def __init__(self, target: SshTarget, control_port: int, store: StoreClient,
                 on_failed: Callable[[str, str], None], forward_target: str | None = None) -> None:
        super().__init__(f"ssh/{target.name}")
        self._target = target
        self._control_port = control_port
        # What the forward reaches here: the port, or with TLS a plain-HTTP Unix socket.
        self._forward_target = forward_target or f"127.0.0.1:{control_port}"
        self._store = store
        self._on_failed = on_failed
        self._task: asyncio.Task[None] | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._attempts = 0
        self._state = "starting"
        self._last: deque[str] = deque(maxlen=40)  # the tail of what ssh and the remote agent printed
        self._attempt: list[str] = []  # what the attempt under way printed (its last 40 lines)
        self._token: str | None = None  # the join token of the last attempt

    async def on_start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._keep_up(), name=self.name)

    async def on_stop(self, reason: str) -> None:
        if self._task is not None:
            self._task.cancel()
        await self._end_process()

    async def receive(self, message: Any) -> Any:
        match message:
            case Snapshot():
                return self.make_view()
            case Shutdown():
                return None  # the workers supervisor stops this actor next
            case _:
                raise TypeError(f"{self.name} got an unknown message {message!r}")

    def make_view(self) -> dict[str, Any]:
        return {"name": self._target.name, "host": self._target.host, "state": self._state,
                "attempts": self._attempts, "output": list(self._last)[-5:]}

    async def _keep_up(self) -> None:
        try:
            await self._attempts_until_final()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a defect here must show on the worker, never leave it `retrying` unseen
            log.exception("ssh session of %s stopped on an error", self._target.name)
            self._fail(f"the ssh session stopped on an error ({type(exc).__name__}: {exc})")

    async def _attempts_until_final(self) -> None:
        while True:
            self._attempts += 1
            self._attempt = []
            self.changed()
            code: int | None = None
            try:
                code = await self._run_once()
            except OSError as exc:
                # No ssh client on this machine, or no process to be had: no retry helps,
                # and the worker must say so rather than stay `connecting` for ever.
                self._last.append(f"{exc.strerror or exc}: {exc.filename or 'ssh'}")
                self._fail("the control plane cannot run ssh")
                return
            except TroupeError as exc:  # the attempt's token could not be stored (a full disk): a retry may
                self._last.append(f"the join token could not be stored: {exc}")
            reason = self._final_reason(code) if code is not None else None
            if reason is not None:
                self._fail(reason)
                return
            delay = BACKOFF_S[min(self._attempts - 1, len(BACKOFF_S) - 1)]
            self._state = "retrying"
            self.changed()
            log.warning("ssh session of %s ended (exit %s); again in %ss", self._target.name, code, delay)
            await asyncio.sleep(delay)

    def _fail(self, reason: str) -> None:
        self._state = "failed"
        self.changed()
        detail = next((line for line in reversed(self._last) if line.strip()), "")
        log.error("ssh session of %s failed: %s (%s)", self._target.name, reason, detail)
        self._on_failed(self._target.name, f"{reason}: {detail}" if detail else reason)
        self.stop_self("failed")

    async def _run_once(self) -> int:
        token = secrets.token_urlsafe(24)
        # The last attempt's token was redeemed or never will be: it goes as this one is made.
        await self._store.write(CreateEnrollment(token, self._target.name, TOKEN_TTL_S, 1, replaces=self._token))
        self._token = token
        self._process = await asyncio.create_subprocess_exec(
            *self._argv(token), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, preexec_fn=_die_with_parent)
        self._state = "running"
        self.changed()
        assert self._process.stdout is not None
        async for line in _lines(self._process.stdout):
            line = _TOKEN.sub(r"\1(the join token)", line)
            self._last.append(line)
            self._attempt = [*self._attempt[-39:], line]
            self.changed()
        return await self._process.wait()

    def _argv(self, token: str) -> list[str]:
        target = self._target
        socket = f"/tmp/troupe-{target.name}-{secrets.token_hex(6)}.sock"
        agent = (f"{target.remote_command} agent start --url http://127.0.0.1:{self._control_port} "
                 f"--unix-socket {shlex.quote(socket)} --token {shlex.quote(token)} --name {shlex.quote(target.name)}")
        # -tt: a terminal on the remote side, so that the agent is hung up on when the
        # session ends, rather than left dialing a forward nobody serves.
        argv = ["ssh", "-tt", "-o", "BatchMode=yes", "-o", "ExitOnForwardFailure=yes", "-o",
                "ServerAliveInterval=15", "-o", "ServerAliveCountMax=3", "-R",
                f"{socket}:{self._forward_target}"]
        if target.port is not None:
            argv += ["-p", str(target.port)]
        if target.identity_file is not None:
            argv += ["-i", target.identity_file, "-o", "IdentitiesOnly=yes"]
        if target.known_hosts_file is not None:
            argv += ["-o", f"UserKnownHostsFile={target.known_hosts_file}"]
        argv += [f"{target.user}@{target.host}" if target.user else target.host, agent]
        return argv

    def _final_reason(self, code: int) -> str | None:
        text = "\n".join(self._attempt)
        return next((reason for marker, final_code, reason in FINAL if code == final_code and marker in text), None)

    async def _end_process(self) -> None:
        process = self._process
        if process is None or process.returncode is not None:
            return
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), STOP_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


async def _lines(stream: asyncio.StreamReader) -> AsyncIterator[str]:
    """What ssh and the remote side print, line by line, a line cut at ``LINE_MAX``
    characters: a stream's own line reader raises past 64 KiB without a newline (a
    remote progress bar, a banner), which would leave the pipe unread and ssh blocked."""
    pending = b""
    while chunk := await stream.read(CHUNK):
        pending += chunk
        *whole, pending = pending.split(b"\n")
        for line in whole:
            yield line[:LINE_MAX].decode(errors="replace").rstrip()
        if len(pending) > LINE_MAX:
            yield pending[:LINE_MAX].decode(errors="replace").rstrip()
            pending = b""
    if pending:
        yield pending[:LINE_MAX].decode(errors="replace").rstrip()


def _die_with_parent() -> None:
    """In the ssh child, before exec: Linux ends it when the control plane's process ends
    (a crash leaves no session behind); elsewhere nothing."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
