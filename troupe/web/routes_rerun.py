"""``POST /api/runs/{id}/rerun``: a run made again, from the start or from where its
training stopped.

A rerun queues a new run with the old one's graph, options and target, through the same
checks as ``POST /api/runs``; it joins no sweep or study and spends no budget. With
``resume``, each TrainingLoop of the graph continues from its newest complete checkpoint
(weights and training state both stored, their files there with the sha256 recorded),
and its metrics go on from the next epoch."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from troupe.actors.store.runs import GetRun
from troupe.protocol import events as ev
from troupe.protocol.api import PARAMS_SET_MAX, RerunRequest, RunOptions
from troupe.protocol.errors import InvalidRequest, NotFound, StateConflict, TroupeError, pointer_from_path
from troupe.protocol.graph import Graph
from troupe.subprocess_runner.digest import file_sha256
from troupe.subprocess_runner.sweeps import key_targets, with_params
from troupe.web.context import Services, services
from troupe.web.errors import json_reply
from troupe.web.requests import read_model, run_id_from
from troupe.web.routes_artifacts import local_file
from troupe.web.routes_runs import queue_run, resume_points

routes = web.RouteTableDef()

@routes.post("/api/runs/{run_id}/rerun")
async def rerun(request: web.Request) -> web.Response:
    svc = services(request)
    old_id = run_id_from(request)
    body = await read_model(request, RerunRequest) if request.can_read_body else RerunRequest()
    row = await svc.store.read(GetRun(old_id))
    if row is None:
        raise NotFound(f"no run {old_id}", code="run_not_found")
    resumed_from = None
    if body.resume:
        if row["status"] in ev.ACTIVE_STATES:
            raise StateConflict(f"run {old_id} is {row['status']}; a run is resumed once it has ended",
                                code="run_active")
        resumed_from = await _resume_plan(svc, row)
    options = rerun_options(row)
    document = row["graph"]
    if body.params_set:
        document = with_params(document, _checked_sets(document, body.params_set))
        done = {**(options.params_set or {}), **body.params_set}
        if len(done) > PARAMS_SET_MAX:
            raise InvalidRequest(f"params_set: with what run {old_id} already set, the rerun would set {len(done)} "
                                 f"params; a run keeps at most {PARAMS_SET_MAX}", pointer="/params_set")
        options = options.model_copy(update={"params_set": done})
    graph = Graph.model_validate(document)
    try:  # the stored graph is asked of run_rights, whoever ran it: another's run is no way around the rule
        reply = await queue_run(svc, request, graph, row["name"], options, graph_at=None, rerun_of=old_id,
                                resumed_from=resumed_from)
    except TroupeError as exc:
        exc.pointer = _into_body(exc.pointer, document, body.params_set or {})
        raise
    return json_reply(reply, status=201)


def _into_body(pointer: str | None, document: dict[str, Any], params_set: dict[str, Any]) -> str | None:
    """A refusal's pointer into the rerun's own body: the run's graph was not sent, so a
    fault in one of its params points at the ``params_set`` entry that set it, and any
    other fault of the graph has no pointer (its ``node_id`` says where)."""
    parts = (pointer or "").split("/")
    if parts[:3] != ["", "graph", "nodes"]:
        return pointer
    if len(parts) > 5 and parts[4] == "params" and parts[3].isdigit() and int(parts[3]) < len(document["nodes"]):
        node_id, param = str(document["nodes"][int(parts[3])].get("id")), parts[5]
        ids = {str(n.get("id")) for n in document["nodes"]}
        for key in params_set:
            if any(node == node_id and name.split(".", 1)[0] == param for node, name in key_targets(key, ids)):
                return pointer_from_path(["params_set", key])
    return None


def _checked_sets(graph: dict[str, Any], params_set: dict[str, Any]) -> dict[str, Any]:
    """Each key names a node of the run's graph (its param is checked with the graph);
    a key that names none is refused, never set nowhere."""
    params = {str(n.get("id")): n.get("params") or {} for n in graph.get("nodes", [])}
    for key in params_set:
        if len(key_targets(key, params)) > 1:
            raise InvalidRequest(f"params_set: {key!r} could name a param of two nodes (node ids with a dot); it "
                                 "is not guessed", pointer=pointer_from_path(["params_set", key]), code="graph_invalid")
        node_id = key.rpartition(".")[0]
        if node_id not in params:
            node_id, _, mapping = node_id.rpartition(".")  # NODE.vars.NAME
            if node_id in params and not isinstance(params[node_id].get(mapping, {}), dict):
                raise InvalidRequest(f"params_set: {key!r} sets a name in {node_id}.{mapping}, which is a single "
                                     f"value, not a mapping; set {node_id}.{mapping} itself",
                                     pointer=pointer_from_path(["params_set", key]), code="graph_invalid")
        if node_id not in params:
            raise InvalidRequest(f"params_set: {key!r} names no node of the run's graph (it has "
                                 f"{', '.join(sorted(params))})", pointer=pointer_from_path(["params_set", key]),
                                 code="graph_invalid")
    return params_set


def rerun_options(row: dict[str, Any]) -> RunOptions:
    """The old run's options, as a standalone queued run: its seed (a sweep's variant
    keeps its own), target and device; never an editor's lane."""
    options = dict(row.get("options") or {})
    if row.get("seed") is not None:
        options["seed"] = row["seed"]
    options.pop("editor_session", None)
    options["lane"] = ev.LANE_QUEUED
    try:
        return RunOptions.model_validate(options)
    except ValidationError as exc:  # kept by an older server, under rules since made stricter
        first = exc.errors()[0]
        raise StateConflict(f"run {row['id']}'s options no longer hold ({'/'.join(map(str, first['loc']))}: "
                            f"{first['msg']}); submit its graph afresh", code="options_outdated") from None


async def _resume_plan(svc: Services, row: dict[str, Any]) -> dict[str, Any]:
    points = resume_points(row)
    if not points:
        raise StateConflict(f"run {row['id']} has no complete checkpoint to resume from (a TrainingLoop with "
                            "checkpoint_every writes one per epoch; a script command's is a file it writes to "
                            "TROUPE_CHECKPOINT_DIR)", code="no_checkpoint")
    nodes: dict[str, Any] = {}
    for node_id, (epoch, weights, state) in points.items():
        plan: dict[str, Any] = {"epoch": epoch}
        for part, artifact in (("weights", weights), ("state", state)):
            plan.update({f"{part}_id": artifact["id"], f"{part}_sha256": artifact["sha256"],
                         f"{part}_path": await _checked(svc, row["id"], artifact)})
        nodes[node_id] = plan
    first_node, first = next(iter(nodes.items()))
    return {"run_id": row["id"], "artifact_id": first["weights_id"], "epoch": first["epoch"],
            "sha256": first["weights_sha256"], "node_id": first_node, "nodes": nodes}


async def _checked(svc: Services, run_id: str, artifact: dict[str, Any]) -> str | None:
    """The checkpoint file on this machine, once its content is checked; a file that is
    gone or changed is refused, naming it (one in the bucket is checked where it is read)."""
    if artifact["backend"] == "s3":
        return None
    where = local_file(svc, run_id, artifact)
    found = await asyncio.to_thread(lambda: file_sha256(where) if where.is_file() else None)
    if found != artifact["sha256"]:
        why = "is gone" if found is None else "no longer has the sha256 it was stored with"
        raise StateConflict(f"checkpoint {artifact['path']} (artifact {artifact['id']}) of run {run_id} {why}; it "
                            "cannot be resumed from", code="checkpoint_unavailable",
                            details={"artifact_id": artifact["id"], "path": artifact["path"]})
    return str(where)
