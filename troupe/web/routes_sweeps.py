"""``/api/sweeps``: one graph queued as many runs, ranked by an objective."""

from __future__ import annotations

import csv
import io
import uuid
from typing import Any

from aiohttp import web

from troupe.actors.placer.actor import SubmitSweep as PlacerSubmitSweep
from troupe.actors.resources import read_flavors, with_type_resources
from troupe.actors.run_messages import Cancel
from troupe.actors.store.sweeps import GetSweep, ListSweeps, SetSweepState
from troupe.actors.submission import Submission, shared_base
from troupe.protocol import events as ev
from troupe.protocol.errors import NotFound
from troupe.protocol.graph import Graph
from troupe.protocol.sweeps import SubmitSweep
from troupe.subprocess_runner.sweeps import SweepLimits, compile_sweep
from troupe.subprocess_runner.validation import validate_graph
from troupe.web.change_rights import refuse_theirs
from troupe.web.context import Services, services
from troupe.web.errors import json_reply
from troupe.web.login import submitter_of
from troupe.web.quotas import declared_mib, within_quota
from troupe.web.requests import hex_id, read_model, wants_csv
from troupe.web.run_rights import refuse_privileged

routes = web.RouteTableDef()


def sweep_limits(svc: Services) -> SweepLimits:
    s = svc.settings
    return SweepLimits(s.max_sweep_runs, s.max_sweep_params, s.max_sweep_domain, s.recorded_outputs_keep)


@routes.post("/api/sweeps")
async def submit_sweep(request: web.Request) -> web.Response:
    svc = services(request)
    body = await read_model(request, SubmitSweep)
    validate_graph(body.base_graph, svc.catalog, "/base_graph")
    body = body.model_copy(update={"base_graph": with_type_resources(body.base_graph, svc.catalog)})
    who = svc.login.who(request)
    refuse_privileged(svc, who, body.base_graph, "/base_graph")  # a variant changes params, never a node's type
    compiled = compile_sweep(body, svc.catalog, sweep_limits(svc))
    sweep_id = uuid.uuid4().hex
    name = body.name or body.base_graph.name or "sweep"
    flavors = await read_flavors(svc.store, body.base_graph, body.options)
    base = shared_base(compiled.base)
    # A target applies to every variant.
    submissions = tuple(
        Submission(Graph.model_validate(variant.graph), name, body.options, flavors, "/base_graph", seed=variant.seed,
                   sweep_id=sweep_id, sweep_variant=variant.index, shared=(base, variant.graph, variant.params),
                   submitted_by=submitter_of(who) if who is not None else None)
        for variant in compiled.variants)
    variants = tuple({"index": v.index, "params": v.params, "seed": v.seed} for v in compiled.variants)
    sweep = {"id": sweep_id, "name": name, "spec": body.sweep_spec.model_dump(mode="json"),
             "objective": body.objective.model_dump(mode="json"), "domains": compiled.domains,
             "total": compiled.total_combinations, "created_at": ev.utc_now(),
             "submitted_by": submitter_of(who) if who is not None else None}
    async with within_quota(svc, who, len(submissions), declared_mib(body.options) * len(submissions)):
        records, committed = await svc.actor("placer").ask(PlacerSubmitSweep(sweep, variants, submissions))
        await committed
    return json_reply(
        {"sweep_id": sweep_id, "total_combinations": compiled.total_combinations, "params": compiled.domains,
         "variants": [{**v, "run_id": r.id, "status": ev.QUEUED} for v, r in zip(variants, records, strict=True)]},
        status=201,
    )


async def _load(svc: Services, sweep_id: str) -> dict[str, Any]:
    sweep = await svc.store.read(GetSweep(sweep_id))
    if sweep is None:
        raise NotFound(f"no sweep {sweep_id}", code="sweep_not_found")
    active = any(v["status"] in ev.ACTIVE_STATES for v in sweep["variants"])
    if sweep["state"] in ("running", "cancelling") and not active:
        # Every child ended: the sweep is finished. A read derives it, as the list does,
        # and writes nothing: the runs' rows are the one record of how far it got.
        sweep["state"] = "finished"
    return sweep


def _ranked(sweep: dict[str, Any]) -> dict[str, Any]:
    direction = sweep["objective"]["direction"]
    done = [v for v in sweep["variants"]
            if v["objective_value"] is not None and v["status"] not in ev.ACTIVE_STATES]
    done.sort(key=lambda v: (v["objective_value"] if direction == "minimize" else -v["objective_value"], v["index"]))
    ranks = {v["index"]: i for i, v in enumerate(done, start=1)}
    rows = []
    for v in done + [v for v in sweep["variants"] if v["index"] not in ranks]:
        rows.append({"index": v["index"], "run_id": v["run_id"], "status": v["status"], "params": v["params"],
                     "seed": v["seed"], "objective_value": v["objective_value"], "rank": ranks.get(v["index"]),
                     "run_exists": v["run_exists"], "final_metrics": v["final_metrics"]})
    counts: dict[str, int] = {}
    for v in sweep["variants"]:
        counts[v["status"]] = counts.get(v["status"], 0) + 1
    reply = {"sweep_id": sweep["id"], "name": sweep["name"], "state": sweep["state"], "objective": sweep["objective"],
             "total_combinations": sweep["total"], "counts": counts, "params": sweep["domains"], "variants": rows,
             "best": rows[0] if rows and rows[0]["rank"] == 1 else None, "created_at": sweep["created_at"],
             "submitted_by": sweep.get("submitted_by")}
    if sweep["state"] == "finished" and not done:
        # 002: only once the sweep finished, per run, from what the variant rows kept (the
        # final value of each series), so it outlives the pruning of the runs.
        per_run = "; ".join(f"{v['run_id']}: {', '.join(sorted(v['final_metrics'] or {})) or 'nothing'}"
                            for v in sweep["variants"])
        reply["objective_warning"] = (
            f"no variant recorded {sweep['objective']['metric']!r}; what each run recorded: {per_run}")
    return reply


@routes.get("/api/sweeps")
async def list_sweeps(request: web.Request) -> web.Response:
    return json_reply({"sweeps": await services(request).store.read(ListSweeps())})


@routes.get("/api/sweeps/{sweep_id}")
async def get_sweep(request: web.Request) -> web.Response:
    svc = services(request)
    reply = _ranked(await _load(svc, hex_id(request, "sweep")))
    if not wants_csv(request):
        return json_reply(reply)
    keys = [d["key"] for d in reply["params"]]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["index", "rank", "status", "objective_value", *keys, "run_id"])
    for v in reply["variants"]:
        writer.writerow([v["index"], v["rank"] if v["rank"] is not None else "", v["status"],
                         v["objective_value"] if v["objective_value"] is not None else "",
                         *(v["params"].get(k) for k in keys), v["run_id"]])
    return web.Response(text=out.getvalue(), content_type="text/csv",
                        headers={"Content-Disposition": f'attachment; filename="sweep-{reply["sweep_id"]}.csv"'})


@routes.post("/api/sweeps/{sweep_id}/cancel")
async def cancel_sweep(request: web.Request) -> web.Response:
    svc = services(request)
    sweep_id = hex_id(request, "sweep")
    sweep = await _load(svc, sweep_id)
    await refuse_theirs(svc, svc.login.who(request), "sweep", sweep_id, sweep.get("submitted_by"), "cancel")
    cancelled = already = active = 0
    for variant in sweep["variants"]:
        run = svc.registry.lookup(f"runs/{variant['run_id']}")
        if variant["status"] in ev.ACTIVE_STATES and run is not None:
            active += 1
            reply = await run.ask(Cancel())
            cancelled += not reply["repeat"]  # a child still stopping from an earlier cancel is not counted again
        else:
            already += 1
    if active:
        await svc.store.write(SetSweepState(sweep_id, "cancelling"))
    sweep = await _load(svc, sweep_id)
    # 002: "cancelling" while any child was still active when asked; "finished" only when
    # every child had already ended. The next read settles it.
    state = "cancelling" if active else sweep["state"]
    return json_reply({
        "sweep_id": sweep_id, "state": state, "cancelled": cancelled, "already_finished": already,
        "variants": [{"index": v["index"], "run_id": v["run_id"], "status": v["status"]} for v in sweep["variants"]],
    })
