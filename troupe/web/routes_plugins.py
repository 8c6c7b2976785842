"""``/api/plugins/{plugin_id}/jobs``: work a plugin asks the server to own.

Kinds come from a registry; only ``study`` is registered. No plugin code is loaded on
the server: a plugin is a client that names itself in the path. A job is idempotent per
plugin and ``idempotency_key``: the same key with the same spec answers the same job
(200), a different spec under that key is a 409.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from troupe.actors.store.studies import CreatePluginJob, GetPluginJobs
from troupe.protocol import events as ev
from troupe.protocol.errors import NotFound, StateConflict, TroupeError
from troupe.protocol.studies import SubmitStudy
from troupe.web.context import Services, services
from troupe.web.errors import json_reply
from troupe.web.requests import invalid_body, read_model
from troupe.web.routes_studies import create_study
from troupe.web.run_rights import refuse_privileged

routes = web.RouteTableDef()
_PLUGIN_ID = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")

# kind -> builds the study row of a job from its spec (validating it: 400 on a mistake)
JobKind = Callable[[Services, dict[str, Any], str], Awaitable[dict[str, Any]]]
JOB_KINDS: dict[str, JobKind] = {}


def register_job_kind(kind: str, build: JobKind) -> None:
    JOB_KINDS[kind] = build


async def _study_kind(svc: Services, spec: dict[str, Any], plugin_id: str) -> dict[str, Any]:
    from pydantic import ValidationError

    try:
        body = SubmitStudy.model_validate(spec)
    except ValidationError as exc:
        raise invalid_body(exc, spec, within="/spec") from None
    try:
        return await create_study(svc, body, plugin_id)
    except TroupeError as exc:  # point into the job's body, where the spec sits
        if exc.pointer is not None:
            exc.pointer = "/spec" + exc.pointer
        raise


register_job_kind("study", _study_kind)


class SubmitJob(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["study"]
    spec: dict[str, Any]
    idempotency_key: str = Field(min_length=1, max_length=200)


def _plugin_id(request: web.Request) -> str:
    plugin_id = request.match_info["plugin_id"]
    if not _PLUGIN_ID.fullmatch(plugin_id):
        raise NotFound(f"{plugin_id!r} is not a plugin id (lowercase letters, digits, '.', '_', '-')",
                       code="plugin_not_found")
    return plugin_id


def _public(job: dict[str, Any]) -> dict[str, Any]:
    return {k: job[k] for k in ("id", "plugin_id", "kind", "idempotency_key", "study_id", "state", "created_at")}


@routes.post("/api/plugins/{plugin_id}/jobs")
async def submit_job(request: web.Request) -> web.Response:
    svc = services(request)
    plugin_id = _plugin_id(request)
    body = await read_model(request, SubmitJob)
    digest = hashlib.sha256(json.dumps(body.spec, sort_keys=True).encode()).hexdigest()
    # A key already used answers its job, whatever the server holds now (the flavor its
    # study used may be gone): checked before the spec is, and again in the write (a race).
    jobs = await svc.store.read(GetPluginJobs(plugin_id))
    earlier = next((j for j in jobs if j["idempotency_key"] == body.idempotency_key), None)
    if earlier is not None:
        return _again(earlier, digest, plugin_id, body.idempotency_key)
    study = await JOB_KINDS[body.kind](svc, body.spec, plugin_id)
    refuse_privileged(svc, svc.login.who(request), study["spec"]["base_graph"], "/spec/base_graph")
    job = {"id": uuid.uuid4().hex, "plugin_id": plugin_id, "kind": body.kind,
           "idempotency_key": body.idempotency_key, "spec_digest": digest, "created_at": ev.utc_now()}
    result = await svc.store.write(CreatePluginJob(job, study))
    if not result["created"]:
        return _again(result["job"], digest, plugin_id, body.idempotency_key)
    svc.start_study(study["id"])
    return json_reply(_public(result["job"]), status=201)


def _again(found: dict[str, Any], digest: str, plugin_id: str, key: str) -> web.Response:
    """A job asked for again under its key: the same job (200), or a 409 for another spec."""
    if found["spec_digest"] != digest:
        raise StateConflict(f"plugin {plugin_id} already has a job under key {key!r} with another spec",
                            pointer="/idempotency_key", code="idempotency_conflict")
    return json_reply(_public(found))


@routes.get("/api/plugins/{plugin_id}/jobs")
async def list_jobs(request: web.Request) -> web.Response:
    jobs = await services(request).store.read(GetPluginJobs(_plugin_id(request)))
    return json_reply({"jobs": [_public(j) for j in jobs]})


@routes.get("/api/plugins/{plugin_id}/jobs/{job_id}")
async def get_job(request: web.Request) -> web.Response:
    jobs = await services(request).store.read(GetPluginJobs(_plugin_id(request), request.match_info["job_id"]))
    if not jobs:
        raise NotFound("no such job of this plugin", code="job_not_found")
    return json_reply(_public(jobs[0]))
