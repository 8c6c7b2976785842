"""``/api/workers``: enrollment, credentials, the list of workers, revoke and drain.

A one-time enrollment token (made with the session token) is exchanged by the agent for
a per-worker credential. Only hashes are stored. The credential exchange is the one
mutation that does not take the session token: the enrollment token is its proof.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Annotated

from aiohttp import web
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from actors.base import Snapshot
from actors.store import CreateEnrollment, ListWorkers, RedeemEnrollment, RevokeWorker
from actors.worker import Drain, Revoked
from protocol.errors import NotFound
from web.context import services
from web.errors import json_reply
from web.requests import read_model

routes = web.RouteTableDef()
CREDENTIALS_PATH = "/api/workers/credentials"
_NAME = r"[a-z0-9][a-z0-9_.-]{0,63}"


def _not_reserved(name: str | None) -> str | None:
    if name in _RESERVED:
        raise ValueError(f"{name!r} is a target word (options.target.worker), not a worker name")
    return name


_RESERVED = ("any", "local")
WorkerName = Annotated[str | None, Field(default=None, pattern=f"^{_NAME}$"), AfterValidator(_not_reserved)]


class NewEnrollment(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: WorkerName = None
    ttl_s: float = Field(default=86400, gt=0, le=365 * 86400)
    uses: int = Field(default=1, ge=1, le=1000)


class Redeem(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    token: str = Field(min_length=1, max_length=200)
    name: WorkerName = None
    machine_id: str = Field(min_length=1, max_length=200)


@routes.post("/api/workers/enrollments")
async def enroll(request: web.Request) -> web.Response:
    svc = services(request)
    body = await read_model(request, NewEnrollment)
    token = secrets.token_urlsafe(24)
    expires_at = await svc.store.write(CreateEnrollment(token, body.name, body.ttl_s, body.uses))
    url = svc.public_url
    command = f"troupe agent start --url {url} --token {token}"
    if body.name:
        command += f" --name {body.name}"
    return json_reply({
        "token": token, "command": command, "uses": body.uses, "name": body.name,
        "expires_at": datetime.fromtimestamp(expires_at, UTC).isoformat().replace("+00:00", "Z"),
    }, status=201)


@routes.post(CREDENTIALS_PATH)
async def redeem(request: web.Request) -> web.Response:
    svc = services(request)
    body = await read_model(request, Redeem)
    credential = secrets.token_urlsafe(32)
    name = await svc.store.write(RedeemEnrollment(body.token, body.name, body.machine_id, credential))
    return json_reply({"name": name, "credential": credential}, status=201)


@routes.get("/api/workers")
async def list_workers(request: web.Request) -> web.Response:
    svc = services(request)
    rows = []
    for row in await svc.store.read(ListWorkers()):
        if row["revoked"]:
            continue
        live = svc.registry.lookup(f"workers/{row['name']}")
        snapshot = await live.ask(Snapshot()) if live is not None else {
            "name": row["name"], "state": "disconnected", "degraded": False, "draining": False,
            "missing_node_types": [], "version": None, "machine_id": row["machine_id"], "devices": [],
            "inventory": None, "slots": [], "running_runs": []}
        rows.append({**snapshot, "enrolled_at": row["enrolled_at"]})
    return json_reply({"workers": rows})


@routes.delete("/api/workers/{name}")
async def revoke(request: web.Request) -> web.Response:
    svc = services(request)
    name = request.match_info["name"]
    if not await svc.store.write(RevokeWorker(name)):
        raise NotFound(f"no enrolled worker {name!r}", code="worker_not_found")
    live = svc.registry.lookup(f"workers/{name}")
    if live is not None:
        live.tell(Revoked())
    return json_reply({"name": name, "revoked": True})


@routes.post("/api/workers/{name}/drain")
async def drain(request: web.Request) -> web.Response:
    svc = services(request)
    name = request.match_info["name"]
    live = svc.registry.lookup(f"workers/{name}")
    if live is None:
        raise NotFound(f"worker {name!r} is not connected", code="worker_not_found")
    live.tell(Drain())
    return json_reply(await live.ask(Snapshot()))
