"""``/api/runs``: submit, list, read, cancel, delete, events and metrics."""

from __future__ import annotations

import asyncio
import csv
import io
import re
from typing import Any

from aiohttp import web

from troupe.actors.errors import ActorDeadError, RunNotFound, WorkerNotConnected
from troupe.actors.placer.actor import Admitted, Submit
from troupe.actors.resources import read_flavors, with_type_resources
from troupe.actors.run_messages import Cancel
from troupe.actors.store.events import EventsOfType, GetEvents, GetMetrics, GetOutputs
from troupe.actors.store.runs import DeleteRun, GetRun
from troupe.actors.submission import Submission
from troupe.actors.worker import ReadRecordedOutputs
from troupe.protocol import events as ev
from troupe.protocol.api import RunOptions, SubmitRun
from troupe.protocol.errors import InvalidRequest, NotFound, StateConflict
from troupe.protocol.graph import Graph, node_file_stem
from troupe.web import checkpoints
from troupe.web.change_rights import refuse_theirs
from troupe.web.context import Services, services
from troupe.web.errors import json_reply
from troupe.web.login import submitter_of
from troupe.web.queue_state import submitted_position, with_queue_reasons
from troupe.web.quotas import declared_mib, within_quota
from troupe.web.requests import RUN_ID, choice_query, int_query, one_query, read_model, run_id_from, wants_csv
from troupe.web.run_metrics import stream_metrics
from troupe.web.run_rights import refuse_privileged

routes = web.RouteTableDef()
TRAINING_LOOP = "torch.TrainingLoop"
COMMAND = "script.Command"  # resumed from its newest checkpoint file (docs/scripts.md)
MAX_TAIL = 100_000  # the most events ?tail= may ask for (a page is cut by bytes anyway)
OUTPUTS_READ_TIMEOUT_S = 10.0  # how long a worker has to answer a read of its recorded outputs

ROW_FIELDS = (
    "id", "name", "status", "device", "queue_key", "lane", "queue_position", "submitted_by", "submitted_label",
    "created_at", "started_at", "finished_at", "final_loss", "final_loss_non_finite", "sweep_id", "sweep_variant",
    "study_id", "error", "progress", "tags", "note",
)


def public_row(row: dict[str, Any]) -> dict[str, Any]:
    return {**{k: row[k] for k in ROW_FIELDS}, "queue_reason": row.get("queue_reason")}


def detail_row(row: dict[str, Any], keep_last: int = -1) -> dict[str, Any]:
    detail = public_row(row)
    detail.update(
        seed=row["seed"], deterministic=row["deterministic"], record_outputs=row["record_outputs"],
        error_detail=row["error_detail"], warnings=warning_texts(row["warnings"]),
        artifacts=checkpoints.kept(row["artifacts"]),
        graph=row["graph"], options=row.get("options") or {},
        worker=row.get("worker"), **{k: row.get(k) for k in _MEMORY_FIELDS},
        rerun_of=row.get("rerun_of"), reruns=row.get("reruns") or [],
        resumed_from=_public_resume(row.get("resumed_from")),
        resume_point=_resume_point(row, keep_last),
        logged_params=row.get("logged_params") or {}, logged_tags=row.get("logged_tags") or {},
    )
    return detail


_MEMORY_FIELDS = ("memory_budget_mib", "memory_budget_source", "peak_memory_mib", "peak_memory_exact", "out_of_memory",
                  "execution_facts")


def resume_points(row: dict[str, Any]) -> dict[str, tuple[int, dict[str, Any], dict[str, Any]]]:
    """Each TrainingLoop's newest complete checkpoint: node id -> (epoch, weights row,
    state row), from the run's stored artifacts; a command's newest checkpoint file is
    both (it is one file, handed to the script as TROUPE_RESUME_FROM), its epoch the
    last number in its name."""
    stored = {a["path"]: a for a in row.get("artifacts") or () if (a.get("state") or "stored") == "stored"}
    points: dict[str, tuple[int, dict[str, Any], dict[str, Any]]] = {}
    for node in (n for n in row["graph"].get("nodes", ()) if n.get("type") == COMMAND):
        mine = [a for a in stored.values() if a.get("node_id") == node["id"] and a["kind"] == "checkpoint"]
        if mine:
            newest = max(mine, key=lambda a: a["id"])
            numbers = re.findall(r"\d+", newest["path"].rsplit("/", 1)[-1])
            points[node["id"]] = (int(numbers[-1]) if numbers else 0, newest, newest)
    for node in (n for n in row["graph"].get("nodes", ()) if n.get("type") == TRAINING_LOOP):
        stem = node_file_stem(node["id"])  # the name the loop gives its files
        pattern = re.compile(rf"checkpoints/{re.escape(stem)}-epoch-(\d+)\.pt")
        for path, weights in stored.items():
            found = pattern.fullmatch(path)
            state = stored.get(f"checkpoints/{stem}-epoch-{found[1]}.state.pt") if found else None
            if found and state is not None and int(found[1]) > points.get(node["id"], (0,))[0]:
                points[node["id"]] = (int(found[1]), weights, state)
    return points


def _resume_point(row: dict[str, Any], keep_last: int) -> dict[str, Any] | None:
    """Where a run that ended can be resumed from, and until when."""
    points = resume_points(row) if row["status"] not in ev.ACTIVE_STATES else {}
    if not points:
        return None
    # Retention counts each submitter's runs apart (troupe/actors/store/runs.py) and spares a run tagged keep.
    kept = ("as long as it is tagged keep and not deleted" if "keep" in (row.get("tags") or ())
            else f"while it is among the newest {keep_last} runs of its submitter (TROUPE_RUN_RETENTION_KEEP_LAST, "
                 "counted per session), or once it is tagged keep" if keep_last >= 0
            else "as long as it is not deleted")
    return {"epoch": min(epoch for epoch, _, _ in points.values()), "nodes": {n: p[0] for n, p in points.items()},
            "until": kept}


def _public_resume(resumed: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a resumed run continues from, as the API shows it (not where its files lie)."""
    if not resumed:
        return None
    return {k: resumed[k] for k in ("run_id", "artifact_id", "epoch", "sha256")}


def warning_texts(warnings: list[Any]) -> list[str]:
    """A run's warnings as the API lists them: texts (the events carry their codes)."""
    return [w["message"] if isinstance(w, dict) else w for w in warnings]


@routes.post("/api/runs")
async def submit_run(request: web.Request) -> web.Response:
    body = await read_model(request, SubmitRun)
    svc = services(request)
    return json_reply(await queue_run(svc, request, body.graph, body.name, body.options), status=201)


async def queue_run(svc: Services, request: web.Request, graph_doc: Graph, name: str | None, options: RunOptions,
                    graph_at: str | None = "/graph", **asked: Any) -> dict[str, Any]:
    """Validates and queues one run, as ``POST /api/runs`` answers it: one ``Submit`` to
    the placer, once the session may run its node types (``run_rights``; ``graph_at``:
    where the graph sits in the body, None for a stored run's), within its session's
    quotas. ``asked``: more of the ``Submission`` (a rerun's origin)."""
    who = svc.login.who(request)
    refuse_privileged(svc, who, graph_doc, graph_at)
    graph_doc = with_type_resources(graph_doc, svc.catalog)
    submission = Submission(graph_doc, name, options, await read_flavors(svc.store, graph_doc, options),
                            submitted_by=submitter_of(who) if who is not None else None, **asked)
    async with within_quota(svc, who, 1, declared_mib(options), at_once=options.lane == ev.LANE_INTERACTIVE):
        admitted: Admitted = await svc.actor("placer").ask(Submit(submission))
        stored = await admitted.committed
    record = admitted.record
    position = await submitted_position(svc, record.id, record.submitted_by, str(record.queue_key), stored)
    return {"run_id": record.id, "status": ev.QUEUED, "device": record.device, "queue_key": str(record.queue_key),
            "lane": record.lane, "queue_position": position, "warnings": warning_texts(list(record.warnings))}


# A page of runs ends before the run of this enqueue sequence: digits, opaque to clients.
async def _get_row(svc: Services, run_id: str) -> dict[str, Any]:
    row = await svc.store.read(GetRun(run_id))
    if row is None:
        raise RunNotFound(f"no run {run_id}")
    return row


LINEAGE_MAX = 50  # resumes followed back; a chain longer than that is cut there


async def _lineage(svc: Services, row: dict[str, Any]) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """A resumed run's metrics as one training: each ancestor's points up to the step its
    checkpoint was taken at, then the next run's after it, each point saying its run.
    ``resumed``: where each run took over (its id and the first step that is its own)."""
    # Newest first: (a run, the step its resumer took over after).
    chain: list[tuple[str, int | None]] = [(row["id"], None)]
    while (point := row.get("resumed_from")) and len(chain) <= LINEAGE_MAX:
        parent = await svc.store.read(GetRun(point["run_id"]))
        if parent is None:  # deleted since: the chain starts at what is left
            break
        chain.append((parent["id"], int(point["epoch"])))
        row = parent
    merged: dict[str, list[dict[str, Any]]] = {}
    resumed: list[dict[str, Any]] = []
    after = None  # the last step an older run of the chain gave
    for run_id, until in reversed(chain):
        for name, points in (await svc.store.read(GetMetrics(run_id))).items():
            merged.setdefault(name, []).extend(
                {**p, "run_id": run_id} for p in points
                if (after is None or p["step"] > after) and (until is None or p["step"] <= until))
        if after is not None:
            resumed.append({"run_id": run_id, "from_step": after + 1})
        after = until
    return merged, resumed


CONSOLE_PAGE_BYTES = 1024 * 1024


@routes.get("/api/runs/{run_id}/console")
async def get_console(request: web.Request) -> web.Response:
    """The run's console output from byte ``offset`` on (UTF-8), a page at most 1 MiB;
    ``next_offset`` is where the next read starts (the same while nothing more came)."""
    svc = services(request)
    run_id = run_id_from(request)
    offset = int_query(request, "offset", default=0) or 0
    marked = choice_query(request, "nodes", ("false", "true"))
    await _get_row(svc, run_id)  # 404 for no such run
    events = await svc.store.read(EventsOfType(run_id, ev.CONSOLE))
    # Encoded with "replace": an event an older server stored before its text was checked still reads.
    text = "".join(console_lines(e) if marked == "true" else str(e["payload"].get("text", ""))
                   for e in events).encode("utf-8", "replace")
    if offset < len(text) and (text[offset] & 0xC0) == 0x80:  # a page starts where a character does
        raise InvalidRequest(f"offset {offset} is inside a character; give a next_offset this route answered",
                             pointer="?offset")
    end = min(len(text), offset + CONSOLE_PAGE_BYTES)
    while offset < end < len(text) and (text[end] & 0xC0) == 0x80:  # never cut inside a character
        end -= 1
    page = text[offset:end]
    return json_reply({"text": page.decode("utf-8", "replace"), "next_offset": offset + len(page),
                       "size": len(text)})


def console_lines(event: dict[str, Any]) -> str:
    """A console event's text, each line marked with the node that printed it and its
    stream: ``train › epoch 3`` on stdout, ``train ! warning`` on stderr."""
    payload = event["payload"]
    text = str(payload.get("text", ""))
    if "stream" not in payload:  # the note of skipped output
        return text
    mark = f"{event.get('node_id') or ''} {'!' if payload['stream'] == 'stderr' else '›'} ".lstrip()
    return "".join(mark + line for line in text.splitlines(keepends=True))


async def run_detail(svc: Services, run_id: str) -> dict[str, Any]:
    """What ``GET /api/runs/{id}`` answers."""
    row = (await with_queue_reasons(svc, [await _get_row(svc, run_id)]))[0]
    return {**detail_row(row, svc.settings.run_retention_keep_last), "checkpoints": await checkpoints.summary(svc, row)}


@routes.get("/api/runs/{run_id}")
async def get_run(request: web.Request) -> web.Response:
    return json_reply(await run_detail(services(request), run_id_from(request)))


@routes.get("/api/runs/{run_id}/fingerprint")
async def fingerprint(request: web.Request) -> web.Response:
    """The run's environment fingerprint; with ``?against=OTHER``, also the fields in
    which the two differ (equal digests: none)."""
    svc = services(request)
    row = await _get_row(svc, run_id_from(request))
    facts = row.get("execution_facts")
    if facts is None:
        raise StateConflict(f"run {row['id']} has no fingerprint: it has not started", code="no_fingerprint")
    reply: dict[str, Any] = {"run_id": row["id"], **facts}
    other_id = one_query(request, "against")
    if other_id is not None:
        if not RUN_ID.fullmatch(other_id):
            raise InvalidRequest(f"{other_id[:80]!r} is not a run id (32 lowercase hex characters)",
                                 pointer="?against")
        other = await _get_row(svc, other_id)
        theirs = other.get("execution_facts")
        if theirs is None:
            raise StateConflict(f"run {other['id']} has no fingerprint: it has not started", code="no_fingerprint",
                                pointer="?against")
        mine, yours = _flat(facts["fingerprint"]), _flat(theirs["fingerprint"])
        reply["against"] = {
            "run_id": other["id"], "fingerprint_digest": theirs["fingerprint_digest"],
            "fingerprint_source": theirs["fingerprint_source"],
            "differs": {key: {"this": mine.get(key), "other": yours.get(key)}
                        for key in sorted(set(mine) | set(yours)) if mine.get(key) != yours.get(key)}}
    return json_reply(reply)


@routes.get("/api/runs/{run_id}/provenance")
async def provenance(request: web.Request) -> web.Response:
    """What dataset and weight files the run read, recorded by each reading node at the
    moment it read, by identity or by content (the two are never compared)."""
    svc = services(request)
    row = await _get_row(svc, run_id_from(request))
    records = await svc.store.read(EventsOfType(row["id"], ev.PROVENANCE))
    return json_reply({"run_id": row["id"], "mode": (row.get("options") or {}).get("provenance"),
                       "records": [{"node_id": e["node_id"], "ts": e["ts"], **e["payload"]} for e in records]})


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{"torch": {"version": ...}}`` as ``{"torch.version": ...}``; packs by name."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flat(item, f"{prefix}{key}.").items()}
    if isinstance(value, list) and all(isinstance(item, dict) and "name" in item for item in value):
        return {k: v for item in value for k, v in _flat(item, f"{prefix}{item['name']}.").items()}
    return {prefix.rstrip("."): value}


async def own_run(svc: Services, request: web.Request, run_id: str, doing: str) -> dict[str, Any] | None:
    """403 ``not_your_run`` unless the session may ``doing`` the run (``change_rights``:
    a class session changes only its own); no such run is left to the route to say.
    Returns the run's row as read (None: no such run)."""
    row = await svc.store.read(GetRun(run_id))
    if row is not None:
        await refuse_theirs(svc, svc.login.who(request), "run", run_id, row.get("submitted_by"), doing)
    return row


@routes.post("/api/runs/{run_id}/cancel")
async def cancel_run(request: web.Request) -> web.Response:
    svc = services(request)
    run_id = run_id_from(request)
    await own_run(svc, request, run_id, "cancel")
    run = svc.registry.lookup(f"runs/{run_id}")
    if run is not None:
        reply = await run.ask(Cancel())
        return json_reply({"run_id": reply["run_id"], "status": reply["status"]})
    row = await _get_row(svc, run_id)
    raise StateConflict(f"run {run_id} already ended as {row['status']}", code="run_finished")


@routes.delete("/api/runs/{run_id}")
async def delete_run(request: web.Request) -> web.Response:
    svc = services(request)
    run_id = run_id_from(request)
    await own_run(svc, request, run_id, "delete")
    await svc.store.write(DeleteRun(run_id))
    return json_reply({"run_id": run_id, "deleted": True})


@routes.get("/api/runs/{run_id}/events")
async def run_events(request: web.Request) -> web.Response:
    svc = services(request)
    run_id = run_id_from(request)
    after = int_query(request, "after", default=0) or 0
    tail = int_query(request, "tail", minimum=1, maximum=MAX_TAIL)  # with ?after=: the last N after it
    await _get_row(svc, run_id)
    events, next_cursor = await svc.store.read(
        GetEvents(run_id, after=after, tail=tail, cap_bytes=svc.settings.run_events_response_cap_bytes)
    )
    return json_reply({"events": events, "next_cursor": next_cursor})


@routes.get("/api/runs/{run_id}/outputs")
async def run_outputs(request: web.Request) -> web.Response:
    svc = services(request)
    run_id = run_id_from(request)
    row = await _get_row(svc, run_id)
    outputs = await _recorded_outputs(svc, row, None)
    return json_reply({"run_id": run_id, "record_outputs": row["record_outputs"], "outputs": outputs})


@routes.get("/api/runs/{run_id}/outputs/{node_id}")
async def run_node_outputs(request: web.Request) -> web.Response:
    svc = services(request)
    run_id = run_id_from(request)
    node_id = request.match_info["node_id"]
    row = await _get_row(svc, run_id)
    outputs = await _recorded_outputs(svc, row, node_id)
    if node_id not in outputs:
        raise NotFound(f"run {run_id} has no recorded outputs of node {node_id!r} (was it run with "
                       "record_outputs, and is it among the newest TROUPE_RECORDED_OUTPUTS_KEEP runs?)",
                       code="outputs_not_found")
    return json_reply({"run_id": run_id, "node_id": node_id, "outputs": outputs[node_id]})


async def _recorded_outputs(svc: Services, row: dict[str, Any], node_id: str | None) -> dict[str, Any]:
    """In-process runs' outputs are in the database; a worker run's stay on its worker and
    are read through its connection (503 ``worker_offline`` while it is away)."""
    if row.get("worker") is None or not row["record_outputs"]:
        return dict(await svc.store.read(GetOutputs(row["id"], node_id)))
    connection = svc.registry.lookup(f"workers/{row['worker']}")
    if connection is None:
        raise WorkerNotConnected(f"worker {row['worker']} is not connected; run {row['id']}'s recorded outputs stay "
                                 "on it and can be read once it is back")
    try:
        waiter = await connection.ask(ReadRecordedOutputs(row["id"], node_id))
        kept = await asyncio.wait_for(waiter, OUTPUTS_READ_TIMEOUT_S)
    except (ActorDeadError, TimeoutError) as exc:
        raise WorkerNotConnected(f"worker {row['worker']} did not answer for run {row['id']}'s recorded outputs") \
            from exc
    return dict(kept or {})


@routes.get("/api/runs/{run_id}/metrics")
async def run_metrics(request: web.Request) -> web.StreamResponse:
    svc = services(request)
    run_id = run_id_from(request)
    row = await _get_row(svc, run_id)
    lineage = choice_query(request, "lineage", ("false", "true"))
    if lineage != "true":  # streamed a page at a time: a run of millions of points is not held whole
        return await stream_metrics(request, svc, run_id, wants_csv(request))
    series, resumed = await _lineage(svc, row)
    if not wants_csv(request):
        return json_reply({"series": series, "resumed": resumed})
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["series", "step", "value", "ts"])
    for name, points in series.items():
        for point in points:
            value = point["value"] if point["value"] is not None else point.get("non_finite", "")
            writer.writerow([name, point["step"], value, point["ts"]])
    return web.Response(
        text=out.getvalue(), content_type="text/csv",
        headers={"Content-Disposition": f'attachment; filename="{run_id}-metrics.csv"'},
    )
