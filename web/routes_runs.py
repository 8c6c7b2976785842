"""``/api/runs``: submit, list, read, cancel, delete, events and metrics."""

from __future__ import annotations

import base64
import binascii
import csv
import io
from typing import Any

from aiohttp import web

from actors.errors import RunNotFound
from actors.placer import Submit
from actors.run import Cancel
from actors.store import DeleteRun, GetEvents, GetMetrics, GetOutputs, GetRun, ListRuns
from actors.submission import ANY, WorkerOffer, build_row, target_worker
from actors.worker import Snapshot as WorkerSnapshot
from protocol import events as ev
from protocol.api import RunOptions, SubmitRun
from protocol.errors import CapacityRefused, InvalidRequest, NotFound, StateConflict
from protocol.graph import Graph
from web.context import Services, services
from web.requests import int_query, read_model, run_id_from

routes = web.RouteTableDef()

ROW_FIELDS = (
    "id", "name", "status", "device", "queue_key", "lane", "queue_position", "created_at", "started_at",
    "finished_at", "final_loss", "sweep_id", "sweep_variant", "error",
)


def public_row(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row[k] for k in ROW_FIELDS}


def detail_row(row: dict[str, Any]) -> dict[str, Any]:
    detail = public_row(row)
    detail.update(
        seed=row["seed"], deterministic=row["deterministic"], record_outputs=row["record_outputs"],
        error_detail=row["error_detail"], warnings=row["warnings"], artifacts=row["artifacts"], graph=row["graph"],
        worker=row.get("worker"),
    )
    return detail


def run_row(svc: Services, graph_doc: Graph, name: str | None, options: RunOptions, prefix: str = "/graph",
            worker: WorkerOffer | None = None, **extra: Any) -> tuple[dict[str, Any], Any]:
    return build_row(svc.settings, svc.catalog, svc.accelerators, graph_doc, name, options, prefix, worker,
                     **extra)


async def worker_of(svc: Services, options: RunOptions, graph: Graph | None = None
                    ) -> WorkerOffer | None:
    """What the worker a submission targets offers; 400 for a worker never seen
    since this server started, or one that lacks node types the graph uses (a degraded
    worker). A known worker that is offline is fine: the run waits for it."""
    name = target_worker(options)
    if name is None:
        return None
    if name == ANY:
        offer = _eligible_workers(svc)
        await _check_wait(svc, options, _eligible_names(svc))
        return offer
    if name not in svc.seen_workers:
        raise InvalidRequest(f"no worker {name!r} has connected since this server started",
                             pointer="/options/target/worker", code="unknown_target")
    lacking = sorted({n.type for n in graph.nodes} - svc.worker_types.get(name, frozenset())) if graph else []
    if lacking:
        raise InvalidRequest(f"worker {name} lacks the node types {lacking}", pointer="/options/target/worker",
                             code="worker_lacks_node_types")
    await _check_wait(svc, options, [name])
    return svc.seen_workers[name]


async def _check_wait(svc: Services, options: RunOptions, candidates: list[str]) -> None:
    """``target.wait`` (default true): false refuses the run at once when no candidate
    worker is connected and taking runs, instead of letting it wait for one."""
    wait = (options.target or {}).get("wait", True)
    if not isinstance(wait, bool):
        raise InvalidRequest("options.target.wait must be true or false", pointer="/options/target/wait")
    if wait:
        return
    for name in candidates:
        live = svc.registry.lookup(f"workers/{name}")
        snapshot = await live.ask(WorkerSnapshot()) if live is not None else None
        if snapshot is not None and snapshot["state"] == "connected" and not snapshot["draining"]:
            return
    raise CapacityRefused(
        f"no worker of {', '.join(candidates)} is connected and taking runs, and options.target.wait is false; "
        "submit with wait true to queue the run until one is", pointer="/options/target/wait", code="worker_offline")


def _eligible_names(svc: Services) -> list[str]:
    return [name for name, types in svc.worker_types.items() if not set(svc.catalog.types) - types]


def _eligible_workers(svc: Services) -> WorkerOffer:
    """What the workers that target ``any`` may use offer together: those with every
    node type this server has (a degraded worker lacking some is skipped). 400 when
    there is none, with what was seen."""
    eligible = _eligible_names(svc)
    if not eligible:
        seen = sorted(svc.seen_workers)
        raise InvalidRequest(
            f"target any needs a worker with every node type of this server; {len(seen)} seen since start"
            + (f" ({', '.join(seen)}), none has them all" if seen else ""),
            pointer="/options/target/worker", code="no_eligible_worker")
    offers = [svc.seen_workers[name] for name in eligible]
    return WorkerOffer(ANY, tuple(sorted({d for offer in offers for d in offer.devices})),
                       max(offer.cpus for offer in offers))


@routes.post("/api/runs")
async def submit_run(request: web.Request) -> web.Response:
    svc = services(request)
    body = await read_model(request, SubmitRun)
    row, graph = run_row(svc, body.graph, body.name, body.options,
                         worker=await worker_of(svc, body.options, body.graph))
    run_id, committed = await svc.actor("placer").ask(Submit(row, graph))
    position = await committed
    reply = {
        "run_id": run_id, "status": ev.QUEUED, "device": row["device"], "queue_key": row["queue_key"],
        "lane": row["lane"], "queue_position": position, "warnings": row["warnings"],
    }
    return web.json_response(reply, status=201)


def _decode_cursor(raw: str | None) -> int | None:
    if not raw:
        return None
    try:
        text = base64.urlsafe_b64decode(raw.encode() + b"=" * (-len(raw) % 4)).decode()
        kind, _, value = text.partition(":")
        if kind != "runs" or not value.isdigit():
            raise ValueError(text)
        return int(value)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidRequest("cursor is not one this server handed out", pointer="?cursor") from None


def _encode_cursor(seq: int | None) -> str | None:
    return None if seq is None else base64.urlsafe_b64encode(f"runs:{seq}".encode()).decode().rstrip("=")


@routes.get("/api/runs")
async def list_runs(request: web.Request) -> web.Response:
    svc = services(request)
    status = request.query.get("status") or None
    if status is not None and status not in ev.ALL_STATES:
        raise InvalidRequest(f"status must be one of {sorted(ev.ALL_STATES)}, got {status!r}", pointer="?status")
    query = ListRuns(
        status=status,
        sweep_id=request.query.get("sweep_id") or None,
        study_id=request.query.get("study_id") or None,
        limit=int_query(request, "limit", default=50, minimum=1, maximum=500) or 50,
        before_seq=_decode_cursor(request.query.get("cursor")),
    )
    rows, next_seq = await svc.store.read(query)
    return web.json_response({"runs": [public_row(r) for r in rows], "next_cursor": _encode_cursor(next_seq)})


async def _get_row(svc: Services, run_id: str) -> dict[str, Any]:
    row = await svc.store.read(GetRun(run_id))
    if row is None:
        raise RunNotFound(f"no run {run_id}")
    return row


@routes.get("/api/runs/{run_id}")
async def get_run(request: web.Request) -> web.Response:
    svc = services(request)
    return web.json_response(detail_row(await _get_row(svc, run_id_from(request))))


@routes.post("/api/runs/{run_id}/cancel")
async def cancel_run(request: web.Request) -> web.Response:
    svc = services(request)
    run_id = run_id_from(request)
    run = svc.registry.lookup(f"runs/{run_id}")
    if run is not None:
        return web.json_response(await run.ask(Cancel()))
    row = await _get_row(svc, run_id)
    raise StateConflict(f"run {run_id} already ended as {row['status']}", code="run_finished")


@routes.delete("/api/runs/{run_id}")
async def delete_run(request: web.Request) -> web.Response:
    svc = services(request)
    run_id = run_id_from(request)
    await svc.store.write(DeleteRun(run_id))
    return web.json_response({"run_id": run_id, "deleted": True})


@routes.get("/api/runs/{run_id}/events")
async def run_events(request: web.Request) -> web.Response:
    svc = services(request)
    run_id = run_id_from(request)
    after = int_query(request, "after", default=0) or 0
    tail = int_query(request, "tail", minimum=1)
    if tail is not None and "after" in request.query:
        raise InvalidRequest("use either ?after= or ?tail=, not both", pointer="?tail")
    await _get_row(svc, run_id)
    events, next_cursor = await svc.store.read(
        GetEvents(run_id, after=after, tail=tail, cap_bytes=svc.settings.run_events_response_cap_bytes)
    )
    return web.json_response({"events": events, "next_cursor": next_cursor})


@routes.get("/api/runs/{run_id}/outputs")
async def run_outputs(request: web.Request) -> web.Response:
    svc = services(request)
    run_id = run_id_from(request)
    row = await _get_row(svc, run_id)
    outputs = await svc.store.read(GetOutputs(run_id))
    return web.json_response({"run_id": run_id, "record_outputs": row["record_outputs"], "outputs": outputs})


@routes.get("/api/runs/{run_id}/outputs/{node_id}")
async def run_node_outputs(request: web.Request) -> web.Response:
    svc = services(request)
    run_id = run_id_from(request)
    node_id = request.match_info["node_id"]
    await _get_row(svc, run_id)
    outputs = await svc.store.read(GetOutputs(run_id, node_id))
    if node_id not in outputs:
        raise NotFound(f"run {run_id} has no recorded outputs of node {node_id!r} (was it run with "
                       "record_outputs, and is it among the newest TROUPE_RECORDED_OUTPUTS_KEEP runs?)",
                       code="outputs_not_found")
    return web.json_response({"run_id": run_id, "node_id": node_id, "outputs": outputs[node_id]})


@routes.get("/api/runs/{run_id}/metrics")
async def run_metrics(request: web.Request) -> web.Response:
    svc = services(request)
    run_id = run_id_from(request)
    await _get_row(svc, run_id)
    series = await svc.store.read(GetMetrics(run_id))
    fmt = request.query.get("format", "json")
    if fmt == "json":
        return web.json_response({"series": series})
    if fmt != "csv":
        raise InvalidRequest(f"format must be json or csv, got {fmt!r}", pointer="?format")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["series", "step", "value", "ts"])
    for name, points in series.items():
        for point in points:
            writer.writerow([name, point["step"], point["value"], point["ts"]])
    return web.Response(
        text=out.getvalue(), content_type="text/csv",
        headers={"Content-Disposition": f'attachment; filename="{run_id}-metrics.csv"'},
    )
