"""What can be said of a graph without running it: ``POST /api/export`` (a standalone
Python script) and ``POST /api/estimates`` (a static memory estimate)."""

from __future__ import annotations

from aiohttp import web

from troupe.protocol.api import EstimateGraph, ExportGraph
from troupe.subprocess_runner.codegen import generate_script, script_name
from troupe.subprocess_runner.engine import prepare_executable_graph
from troupe.subprocess_runner.estimate import estimate
from troupe.web.context import services
from troupe.web.errors import json_reply
from troupe.web.requests import read_model

routes = web.RouteTableDef()


@routes.post("/api/export")
async def export_graph(request: web.Request) -> web.Response:
    svc = services(request)
    body = await read_model(request, ExportGraph)
    prepare_executable_graph(body.graph, svc.catalog)  # the same 400s as a submission
    graph = body.graph.model_dump(mode="json", exclude_none=True)
    return json_reply(
        {"filename": script_name(graph), "script": generate_script(graph, body.seed, body.deterministic)}
    )


@routes.post("/api/estimates")
async def estimate_graph(request: web.Request) -> web.Response:
    """An estimate, labelled as one: offered as a first budget, never applied by the server."""
    svc = services(request)
    body = await read_model(request, EstimateGraph)
    prepare_executable_graph(body.graph, svc.catalog)  # the same 400s as a submission
    cards = sum(1 for device in body.devices or ("cuda:0",) if device.startswith("cuda") or device == "auto")
    return json_reply(estimate(body.graph.model_dump(mode="json", exclude_none=True), svc.catalog, max(1, cards),
                               svc.settings.cuda_context_mib))
