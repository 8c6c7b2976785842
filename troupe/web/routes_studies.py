"""``/api/studies``: variants x repeats of one graph, driven by a StudyActor under a
budget the server enforces."""

from __future__ import annotations

import contextlib
import csv
import io
import uuid
from typing import Any

from aiohttp import web

from troupe.actors.placer.actor import Check
from troupe.actors.resources import read_flavors, with_type_resources
from troupe.actors.run_messages import Cancel
from troupe.actors.store.studies import CreateStudy, GetStudy, ListStudies, UpdateStudy
from troupe.actors.study import Stepped, Wake
from troupe.actors.submission import Submission
from troupe.protocol import events as ev
from troupe.protocol.api import RunOptions
from troupe.protocol.errors import NotFound, StateConflict, TroupeError
from troupe.protocol.graph import Graph
from troupe.protocol.studies import ResumeStudy, SubmitStudy
from troupe.subprocess_runner.studies import compile_variants, rank
from troupe.subprocess_runner.validation import validate_graph
from troupe.web.change_rights import refuse_theirs
from troupe.web.context import Services, services
from troupe.web.errors import json_reply
from troupe.web.login import submitter_of
from troupe.web.quotas import declared_mib, within_quota
from troupe.web.requests import hex_id, read_model, wants_csv
from troupe.web.routes_sweeps import sweep_limits
from troupe.web.run_rights import refuse_privileged

routes = web.RouteTableDef()
# A running study resumed takes the new budget; a failed one (its actor kept crashing) runs again.
RESUMABLE = ("halted", "running", "failed")


def study_reply(study: dict[str, Any]) -> dict[str, Any]:
    spec = study["spec"]
    names = [v["name"] for v in spec["variants"]]
    ranking, unranked = rank(spec["variants"], study["attempts"], spec["repeats"], spec["objective"])
    return {
        "id": study["id"], "name": study["name"], "state": study["state"], "halt_reason": study["halt_reason"],
        "budget": study["budget"], "objective": spec["objective"], "repeats": spec["repeats"],
        "variants": [{"name": v["name"], "params": v["params"]} for v in spec["variants"]],
        "used": {"runs": len(study["attempts"]), "active_seconds": study["active_seconds"]},
        "attempts": [{"variant": names[a["variant"]], "repeat": a["repeat"], "attempt": a["attempt"],
                      "run_id": a["run_id"], "status": a["status"], "objective_value": a["objective_value"]}
                     for a in study["attempts"]],
        "ranking": ranking, "unranked": unranked, "plugin_id": study["plugin_id"], "created_at": study["created_at"],
        "notes": _notes(spec, study["budget"]), "submitted_by": spec.get("submitted_by"),
    }


def _notes(spec: dict[str, Any], budget: dict[str, Any]) -> list[dict[str, str]]:
    """What the study will do that its body does not say: seeded attempts in the
    server's own process run one at a time (the seed gate), whatever max_parallel_runs."""
    parallel = budget.get("max_parallel_runs")
    in_process = not (spec.get("options") or {}).get("target")
    if spec.get("seed") is None or not in_process or parallel == 1:
        return []
    wanted = f"{parallel} at once" if parallel else "in parallel"
    return [{"code": "seeded_runs_one_at_a_time", "message": (
        f"Seeded runs execute alone in this server (each sets the process-wide random state), so this study's "
        f"attempts run one at a time here, not {wanted}. To run them in parallel, start a local agent "
        "(Workers > Add worker gives its join command) and give the study options.target "
        '{"worker": "<its name>"}: each seeded run then has a process of its own. See docs/studies.md.')}]


async def create_study(svc: Services, body: SubmitStudy, plugin_id: str | None = None,
                       submitted_by: str | None = None) -> dict[str, Any]:
    """Validates everything, stores the study and starts its actor; nothing is left
    behind when a check fails. A target applies to every attempt, with the rules of a
    single run's target."""
    validate_graph(body.base_graph, svc.catalog, "/base_graph")
    body = body.model_copy(update={"base_graph": with_type_resources(body.base_graph, svc.catalog)})
    variants = compile_variants(body, svc.catalog, sweep_limits(svc))
    flavors = await read_flavors(svc.store, body.base_graph, body.options)
    await svc.actor("placer").ask(Check(tuple(
        Submission(Graph.model_validate(variant["graph"]), body.name, body.options, flavors, "/base_graph")
        for variant in variants)))
    return {
        "id": uuid.uuid4().hex, "name": body.name or body.base_graph.name or "study", "state": "running",
        # The base graph once; each variant is its params over it.
        "spec": {"base_graph": body.base_graph.model_dump(mode="json", exclude_none=True),
                 "variants": [{"name": v["name"], "params": v["params"]} for v in variants],
                 "repeats": body.repeats, "seed": body.seed,
                 "objective": body.objective.model_dump(mode="json"),
                 "options": body.options.model_dump(mode="json", exclude_none=True),
                 "submitted_by": submitted_by},  # its runs count as its submitter's
        "budget": body.budget.model_dump(mode="json", exclude_none=True), "plugin_id": plugin_id,
        "created_at": ev.utc_now(),
    }


async def store_and_start(svc: Services, study: dict[str, Any]) -> dict[str, Any]:
    await svc.store.write(CreateStudy(study))
    await _started(svc, study["id"])
    return study_reply(await load(svc, study["id"]))


async def _started(svc: Services, study_id: str) -> None:
    """Starts (or wakes) the study's actor and waits for its first attempts' rows: the
    quota's turn is held until then, so the next submission counts them."""
    svc.start_study(study_id)
    driver = svc.registry.lookup(f"studies/{study_id}")
    if driver is not None:
        with contextlib.suppress(TroupeError):  # it ended at once, or is slow: its runs count once stored
            await driver.ask(Stepped())


@routes.post("/api/studies")
async def submit_study(request: web.Request) -> web.Response:
    svc = services(request)
    body = await read_model(request, SubmitStudy)
    who = svc.login.who(request)
    refuse_privileged(svc, who, body.base_graph, "/base_graph")
    study = await create_study(svc, body, submitted_by=submitter_of(who) if who is not None else None)
    # Its runs start over time, as many at once as its budget lets: those are what the
    # running and waiting limits see; the per-minute limit counts every run it may start
    # (a study of 1000 quick repeats is 1000 runs submitted, not 1 a minute).
    planned = _runs_planned(body, len(study["spec"]["variants"]))
    at_once = min(planned, body.budget.max_parallel_runs or planned)
    async with within_quota(svc, who, at_once, declared_mib(body.options) * at_once, submits=planned):
        return json_reply(await store_and_start(svc, study), status=201)


def _owed(study: dict[str, Any], budget: dict[str, Any]) -> tuple[int, int]:
    """The attempts a resumed study still owes within what its budget leaves, and how
    many of them it may start at once (its attempts in flight are counted already, as
    runs)."""
    spec, attempts = study["spec"], study["attempts"]
    done = {(a["variant"], a["repeat"]) for a in attempts if a["status"] not in (ev.INTERRUPTED,)}
    owed = len(spec["variants"]) * spec["repeats"] - len(done)
    if budget.get("max_runs") is not None:
        owed = min(owed, budget["max_runs"] - len(attempts))
    owed = max(owed, 0)
    in_flight = sum(1 for a in attempts if a["status"] in ev.ACTIVE_STATES)
    if budget.get("max_parallel_runs") is not None:
        return owed, max(min(owed, budget["max_parallel_runs"] - in_flight), 0)
    return owed, owed


def _runs_planned(body: SubmitStudy, variants: int) -> int:
    total = variants * body.repeats
    if body.budget.max_runs is not None:
        total = min(total, body.budget.max_runs)
    return total


async def load(svc: Services, study_id: str) -> dict[str, Any]:
    study = await svc.store.read(GetStudy(study_id))
    if study is None:
        raise NotFound(f"no study {study_id}", code="study_not_found")
    return study


@routes.get("/api/studies")
async def list_studies(request: web.Request) -> web.Response:
    rows = await services(request).store.read(ListStudies())
    return json_reply({"studies": [
        {**{k: r[k] for k in ("id", "name", "state", "halt_reason", "budget", "created_at")},
         "submitted_by": r["spec"].get("submitted_by")} for r in rows]})


@routes.get("/api/studies/{study_id}")
async def get_study(request: web.Request) -> web.Response:
    reply = study_reply(await load(services(request), hex_id(request, "study")))
    if not wants_csv(request):
        return json_reply(reply)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    keys = sorted({key for v in reply["variants"] for key in v["params"]})
    writer.writerow(["variant", "rank", "objective_value", "std", "repeats", "unranked_reason", *keys])
    for entry in reply["ranking"]:
        writer.writerow([entry["variant"], entry["rank"], entry["objective_value"], entry["std"], entry["repeats"], "",
                         *(entry["params"].get(k) for k in keys)])
    for entry in reply["unranked"]:
        writer.writerow([entry["variant"], "", "", entry["std"] if entry["std"] is not None else "",
                         entry["repeats_done"], entry["reason"], *(entry["params"].get(k) for k in keys)])
    return web.Response(text=out.getvalue(), content_type="text/csv", headers={"X-Content-Type-Options": "nosniff"})


@routes.post("/api/studies/{study_id}/cancel")
async def cancel_study(request: web.Request) -> web.Response:
    svc = services(request)
    study = await load(svc, hex_id(request, "study"))
    await refuse_theirs(svc, svc.login.who(request), "study", study["id"], study["spec"].get("submitted_by"), "cancel")
    # Only from running or halted, in the write itself: the study's own finish (or a
    # resume) committed meanwhile is not overwritten, and a second cancel changes nothing.
    if await svc.store.write(UpdateStudy(study["id"], {"state": "cancelled"}, ("running", "halted"))):
        study = await load(svc, study["id"])
        for attempt in study["attempts"]:
            run = svc.registry.lookup(f"runs/{attempt['run_id']}")
            if attempt["status"] in ev.ACTIVE_STATES and run is not None:
                await run.ask(Cancel("study_cancelled"))
        driver = svc.registry.lookup(f"studies/{study['id']}")
        if driver is not None:  # it sees the study cancelled and stops, with or without runs to end
            driver.tell(Wake())
    return json_reply(study_reply(await load(svc, study["id"])))


@routes.post("/api/studies/{study_id}/resume")
async def resume_study(request: web.Request) -> web.Response:
    svc = services(request)
    study = await load(svc, hex_id(request, "study"))
    study_id = study["id"]
    body = await read_model(request, ResumeStudy)
    # What resumes is the stored study's graph: whoever started it, the resumer must be
    # one who may run it.
    refuse_privileged(svc, svc.login.who(request), study["spec"].get("base_graph") or {}, None)
    # And its budget is its starter's to raise (or the teacher's), as its runs count as theirs.
    await refuse_theirs(svc, svc.login.who(request), "study", study_id, study["spec"].get("submitted_by"), "resume")
    budget = {**study["budget"], **body.budget.model_dump(mode="json", exclude_unset=True)}
    # Never from finished or cancelled, in the write itself: a cancel committed since the
    # read above wins.
    resumed = UpdateStudy(study_id, {"state": "running", "halt_reason": None, "budget": budget}, RESUMABLE)
    if study["state"] not in RESUMABLE:
        raise StateConflict(f"study {study_id} is {study['state']}; only a halted study resumes",
                            code="study_not_resumable")
    # What it starts once resumed is checked as a new study's would be (the new budget
    # may let more run at once than the one it was admitted under), against the limits
    # of the session its runs count for: its submitter's, whoever resumes it.
    owner = study["spec"].get("submitted_by")
    who = svc.login.session_who(owner) if owner else None
    owed, at_once = _owed(study, budget)
    async with within_quota(svc, who, at_once, declared_mib(RunOptions.model_validate(
            study["spec"].get("options") or {})) * at_once, submits=owed):
        if not await svc.store.write(resumed):
            state = (await load(svc, study_id))["state"]
            raise StateConflict(f"study {study_id} is {state}; only a halted study resumes",
                                code="study_not_resumable")
        await _started(svc, study_id)
    return json_reply(study_reply(await load(svc, study_id)))
