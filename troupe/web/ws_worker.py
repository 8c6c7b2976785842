"""``/ws/worker``: the socket an agent dials. It authenticates the agent (hello, version,
credential), then forwards every frame to the worker's WorkerConnection actor (found by
name, so a restarted actor picks the socket up again) and writes what that actor hands
it. What the frames mean is the actor's business, not this handler's."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from typing import Any

import aiohttp
from aiohttp import WSCloseCode, WSMsgType, web
from pydantic import ValidationError

from troupe.actors.base import Snapshot
from troupe.actors.errors import ActorDeadError
from troupe.actors.placer.book import INSTANCE_MARK
from troupe.actors.store.workers import WorkerConnected, WorkerForCredential
from troupe.actors.worker import CLOSE, Attached, Close, Detached, FromWorker
from troupe.protocol import events as ev
from troupe.protocol import worker as wire
from troupe.protocol.api import worker_name_problem
from troupe.protocol.errors import Unauthorized
from troupe.protocol.version import __version__
from troupe.subprocess_runner.devices import host_machine_id
from troupe.web.context import Services, services

log = logging.getLogger("troupe.web")
routes = web.RouteTableDef()
HELLO_TIMEOUT_S = 10.0
LOOPBACK = ("127.0.0.1", "::1")  # peers the session token is accepted from


async def _refuse(ws: web.WebSocketResponse, code: str, reason: str, final: bool = True) -> web.WebSocketResponse:
    log.warning("worker refused: %s", reason)
    if ws.closed:
        return ws
    with contextlib.suppress(ConnectionError):  # the peer left while it was refused
        await ws.send_str(wire.dump_frame(wire.Refused(code=code, reason=reason, final=final)))
        await ws.close(code=wire.CLOSE_REFUSED, message=code.encode())
    return ws


async def _who(svc: Services, request: web.Request, hello: wire.Hello) -> tuple[str | None, str]:
    """The worker's enrolled name, or None with the reason it is refused."""
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret:
        return None, "the agent sent no credential"
    peer = request.remote or ""
    if hmac.compare_digest(secret.encode("utf-8", "surrogateescape"), svc.token.encode()):
        if peer not in LOOPBACK:
            return None, ("the session token is accepted only from this machine (a loopback peer); enroll this "
                          "agent with a join command (POST /api/workers/enrollments)")
        if hello.machine_id != host_machine_id():  # same machine: a loopback peer *and* its machine id
            return None, (f"the session token is accepted only from an agent on this machine; this agent's machine "
                          f"id {hello.machine_id[:80]!r} is not the server's; enroll it with a join command")
        problem = worker_name_problem(hello.name)  # a same-machine agent may use the session token
        return (None, problem) if problem else (hello.name, "")
    return await credential_owner(svc, secret)


async def credential_owner(svc: Services, secret: str) -> tuple[str | None, str]:
    """The worker a credential was issued to, or None with the reason it is refused."""
    try:
        secret.encode()
    except UnicodeEncodeError:
        return None, "the credential is not valid text"
    worker = await svc.store.read(WorkerForCredential(secret))
    if worker is None:
        return None, "the credential is unknown; enroll this agent again with a new join command"
    if worker["revoked"]:
        return None, f"worker {worker['name']}'s credential was revoked"
    return worker["name"], ""


@routes.get("/ws/worker")
async def worker_socket(request: web.Request) -> web.WebSocketResponse:
    svc = services(request)
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():  # nobody to check: 401 before any upgrade
        raise Unauthorized("the worker socket needs an agent's credential (Authorization: Bearer <credential>); "
                           "enroll the agent with a join command (POST /api/workers/enrollments)")
    ws = web.WebSocketResponse(heartbeat=None, max_msg_size=8 * 1024 * 1024)
    await ws.prepare(request)
    try:
        # One deadline for the hello, not one per read: pings answered meanwhile do not
        # hold an unauthenticated socket open.
        async with asyncio.timeout(HELLO_TIMEOUT_S):
            first = await ws.receive()
        if first.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
            return ws  # it left before its hello: nobody to refuse
        hello = wire.parse_frame(first.data) if first.type == WSMsgType.TEXT else None
    except (TimeoutError, ValidationError, ValueError) as exc:
        return await _refuse(ws, "bad_handshake", f"the first frame must be a hello: {exc}")
    if not isinstance(hello, wire.Hello):
        return await _refuse(ws, "bad_handshake", "the first frame must be a hello")
    if hello.version != __version__:
        return await _refuse(ws, "version_mismatch",
                             f"the control plane runs troupe {__version__}, this agent {hello.version}; "
                             "install the same version on both")
    numbers = wire.Numbering()
    numbers.is_new(hello)
    name, reason = await _who(svc, request, hello)
    if name is None:
        return await _refuse(ws, "unauthorized", reason)
    name, refused = await _connection_name(svc, name, hello)
    if refused is not None:
        return await _refuse(ws, refused.code, refused.reason, refused.final)
    outbox: asyncio.Queue[Any] = asyncio.Queue()
    if hello.instance is None:  # listed again, though it once exited as a one-shot agent
        svc.store.write(WorkerConnected(name))
    svc.start_worker(name).tell(Attached(hello, outbox))
    pump = asyncio.ensure_future(_pump(ws, outbox, numbers))
    try:
        # receive() itself, not ``async for``: its __anext__ would be one more coroutine
        # in flight for every connected worker; and each message is handled in a call of
        # its own, so that nothing of it stays referenced here while the next is awaited.
        while await _forward(svc, ws, name, numbers, await ws.receive()):
            pass
    finally:
        pump.cancel()
        live = svc.registry.lookup(f"workers/{name}")
        if live is not None:
            live.tell(Detached(outbox))
    return ws


async def _forward(svc: Services, ws: web.WebSocketResponse, name: str, numbers: wire.Numbering,
                   message: aiohttp.WSMessage) -> bool:
    """Tell the worker's connection the new frames of one message; False: the socket is
    done (closed, broken, or its worker's connection is gone)."""
    if message.type == WSMsgType.BINARY:  # the protocol is JSON text: a binary frame is a broken peer
        log.warning("worker %s sent a binary frame: closing its socket", name)
        await ws.close(code=WSCloseCode.UNSUPPORTED_DATA, message=b"frames are JSON text")
        return False
    if message.type != WSMsgType.TEXT:
        return False  # a close, or an error on the socket: the connection is over
    try:
        frames = wire.parse_frames(message.data)
        for frame in frames:
            _check_kinds(frame)
    except (ValidationError, ValueError) as exc:
        log.warning("worker %s sent a malformed frame: %s", name, exc)
        await ws.close(code=wire.CLOSE_PROTOCOL, message=b"malformed frame")
        return False
    fresh = []
    for frame in frames:
        if numbers.is_new(frame):
            fresh.append(frame)
        else:
            log.warning("worker %s sent frame %s twice: dropped", name, frame.frame_no)
    live = svc.registry.lookup(f"workers/{name}")
    if live is None:
        return False
    if fresh:
        live.tell(FromWorker(tuple(fresh)))
    return True


def _check_kinds(frame: Any) -> None:
    """A worker sends its runs' node events; the run's own lifecycle events (queued,
    started, finished) are the RunActor's alone."""
    if not isinstance(frame, wire.RunEvents):
        return
    for kind in {kind for kind, _, _ in frame.events}:
        if kind not in ev.WORKER_KINDS:
            raise ValueError(f"event kind {kind!r} is not the worker's to send")


async def _connection_name(svc: Services, name: str, hello: wire.Hello) -> tuple[str, wire.Refused | None]:
    """The connection an authenticated hello takes (an array's task: ``name#instance``),
    or why it may not take it now."""
    if hello.instance is not None:
        if not hello.one_shot:
            return name, wire.Refused(code="bad_handshake", reason="an instance of a worker is a one-shot agent: "
                                                                   "start it with --one-shot")
        name = f"{name}{INSTANCE_MARK}{hello.instance}"
        if (await _connected(svc.registry.lookup(f"workers/{name}"))) is not None:
            return name, wire.Refused(code="instance_in_use", reason=(
                f"instance {hello.instance} of worker {name.split(INSTANCE_MARK)[0]} is connected already; give "
                "each task its own --instance (the array's task id)"))
    elif hello.one_shot:
        # A second batch job of the same name would take the connection of the first and end
        # its run; the same agent coming back reports its runs. Not now: it tries again.
        view = await _connected(svc.registry.lookup(f"workers/{name}"))
        busy = sorted(set(view["running_runs"]) - set(hello.runs)) if view is not None else []
        if busy:
            return name, wire.Refused(code="worker_busy", final=False, reason=(
                f"worker {name} is connected and runs {busy[0]}; a second one-shot agent of that name waits until "
                "it is gone (give each job its own --instance to run them side by side)"))
    return name, None


async def _connected(live: Any) -> dict[str, Any] | None:
    """The worker's view while its connection is up, else None."""
    if live is None:
        return None
    try:
        snapshot = await live.ask(Snapshot())
    except ActorDeadError:
        return None
    return snapshot if snapshot["state"] == "connected" else None


async def _pump(ws: web.WebSocketResponse, outbox: asyncio.Queue[Any], numbers: wire.Numbering) -> None:
    while await _send(ws, await outbox.get(), numbers):  # the item sent is not held while the next is awaited
        pass


async def _send(ws: web.WebSocketResponse, item: Any, numbers: wire.Numbering) -> bool:
    """Write one item of the outbox; False: it closed the socket."""
    if item is CLOSE:
        await ws.close()
        return False
    if isinstance(item, Close):
        await ws.close(code=item.code, message=item.reason.encode()[:120])
        return False
    await ws.send_str(wire.dump_frame(item, numbers.next()))
    return True
