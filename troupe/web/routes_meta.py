"""Everything about the server rather than one run: queues, info, examples, the node
catalog, the OpenAPI document and Prometheus metrics."""

from __future__ import annotations

import json
import logging
import re
import sys
from typing import Any

from aiohttp import web

from troupe.actors.base import Snapshot
from troupe.actors.placer.actor import Predict
from troupe.protocol.api import QUEUE_KEY_PATTERN
from troupe.protocol.errors import InvalidRequest
from troupe.subprocess_runner.devices import host_machine_id
from troupe.web.context import Services, services
from troupe.web.errors import json_reply
from troupe.web.queue_state import QueueState, asker_limit, at_limit_reason, predicted_place
from troupe.web.requests import one_query

log = logging.getLogger("troupe.web")
routes = web.RouteTableDef()


async def queue_rows(svc: Services) -> list[dict[str, Any]]:
    return (await QueueState.read(svc)).rows(svc.settings.concurrency_for)


@routes.get("/api/queues")
async def queues(request: web.Request) -> web.Response:
    return json_reply({"queues": await queue_rows(services(request))})


_QUEUE_KEY = re.compile(QUEUE_KEY_PATTERN)


@routes.get("/api/queue-prediction")
async def queue_prediction(request: web.Request) -> web.Response:
    """Would a run queued now on ``queue_key`` start at once? Read off the same books the
    server admits by: the queue's slots, then the placer (the seed gate, the runs waiting
    there, a device shared with a same-machine worker, a worker's device)."""
    svc = services(request)
    key = one_query(request, "queue_key", "")
    if not _QUEUE_KEY.fullmatch(key):
        raise InvalidRequest("queue_key is a queue's key: cpu, cuda:0, or WORKER/DEVICE", pointer="?queue_key")
    seeded = one_query(request, "seeded", "false")
    if seeded not in ("true", "false"):
        raise InvalidRequest("seeded is true or false", pointer="?seeded")
    state = await QueueState.read(svc, {key})
    row = state.row(key, svc.settings.concurrency_for(key))
    reason: dict[str, str] | None
    if row["state"] == "quarantined":
        reason = {"code": "queue_quarantined", "message": f"queue {key} is quarantined: {row['reason']}"}
    elif (limit := asker_limit(svc, key, request))[0] is not None:
        reason = at_limit_reason(key, limit[0], "in line")
    elif (ahead := row["queued"] - limit[1]) or row["running"] >= row["limit"]:
        place, fair = await predicted_place(svc, key, request, ahead + 1)
        reason = {"code": "slots_busy", "message": f"#{place} in line for {key}: {state.busy(key, row['limit'])}" + (
                                                       "; the line is in fair order (who used this queue least "
                                                       "lately goes first)" if fair else "")}
    else:
        reason = await svc.actor("placer").ask(Predict(key, seeded == "true"), first=True)
    return json_reply({"queue_key": key, "starts": reason is None, "reason": reason})


@routes.get("/api/resources")
async def resources(request: web.Request) -> web.Response:
    return json_reply({"cpus": await services(request).actor("cpus").ask(Snapshot())})


@routes.get("/api/info")
async def info(request: web.Request) -> web.Response:
    svc = services(request)
    settings = svc.settings
    return json_reply(
        {
            "name": "troupe",
            "version": svc.version,
            "started_at": svc.started_at,
            "devices": ["cpu", *svc.accelerators],
            "capabilities": {
                "runs": True,
                "interactive_lane": True,
                "sweeps": True,
                "studies": True,
                "workers": True,
                "s3": False,
                "editor_cache": svc.node_cache.enabled,
            },
            "catalog": {"digest": svc.catalog.digest, "packs": list(svc.catalog.packs),
                        "broken_packs": svc.catalog.broken_packs},
            "limits": {
                "run_queue_max_concurrent_cpu": settings.run_queue_max_concurrent_cpu,
                "run_queue_max_concurrent_gpu": settings.run_queue_max_concurrent_gpu,
                "run_queue_max_concurrent": dict(settings.run_queue_max_concurrent),
                "run_interactive_max_concurrent": settings.run_interactive_max_concurrent,
                "max_parallel_nodes": settings.max_parallel_nodes,
                "run_retention_keep_last": settings.run_retention_keep_last,
                "run_retention_per": "submitter",  # the newest N of each session (and of the server's token)
                "cpus": settings.cpus,
            },
            "public_url": svc.public_url,
            # The kind of session this request came with (a notebook's client asks before
            # tagging keep, the teacher's to give), or None: none.
            "login": {"reads_need_session": bool(svc.lan_hosts),
                      "session": getattr(svc.login.who(request), "kind", None)},
            # An agent reporting this machine id shares this server's cpu (one quota).
            "machine_id": host_machine_id(),
            # Node outputs kept between the interactive runs of editor sessions.
            "editor_cache": svc.node_cache.stats(),
            "runtime": {
                "switch_interval_s": sys.getswitchinterval(),
                # The control plane must stay light: only node code imports torch.
                "torch_imported": "torch" in sys.modules,
            },
        }
    )


def load_examples(svc: Services) -> list[dict[str, Any]]:
    folder = svc.settings.examples_dir
    if folder is None or not folder.is_dir():
        return []
    examples = []
    for path in sorted(folder.glob("*.json")):
        try:
            examples.append({"name": path.stem, "graph": json.loads(path.read_text())})
        except (OSError, ValueError) as exc:
            log.warning("skipping example %s: %s", path, exc)
    return examples


@routes.get("/api/examples")
async def examples(request: web.Request) -> web.Response:
    return json_reply({"examples": load_examples(services(request))})


@routes.get("/api/nodes")
async def nodes(request: web.Request) -> web.Response:
    return json_reply(services(request).catalog.to_json())


@routes.get("/api/openapi.json")
async def openapi(request: web.Request) -> web.Response:
    # The document's reply models are imported when it is first asked for, not at every
    # start: they are a twentieth of the server's imports, and nothing else uses them.
    from troupe.web.openapi import openapi_document

    svc = services(request)
    settings = svc.settings
    return json_reply(openapi_document(svc.version, (settings.max_sweep_runs, settings.max_sweep_params,
                                                     settings.max_sweep_domain)))
