"""``POST /api/export``: a graph as a standalone Python script."""

from __future__ import annotations

from aiohttp import web

from protocol.api import ExportGraph
from subprocess_runner.codegen import generate_script, script_name
from subprocess_runner.engine import prepare_executable_graph
from web.context import services
from web.errors import json_reply
from web.requests import read_model

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
