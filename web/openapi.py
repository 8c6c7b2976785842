"""``/api/openapi.json``, generated from the pydantic models that validate requests."""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from protocol import api
from protocol.events import ALL_STATES
from protocol.flavors import Flavor, FlavorUpdate
from protocol.studies import PluginJob, ResumeStudy, SubmitStudy
from protocol.sweeps import SubmitSweep
from web.routes_find import CURSOR_PATTERN, MAX_SEARCH, SEARCH_PATTERN, SORT_PATTERN
from web.routes_runs import MAX_TAIL

_REF = "#/components/schemas/{model}"

_MODELS: tuple[type[BaseModel], ...] = (
    api.SubmitRun, api.RunOptions, api.RunCreated, api.RunRow, api.RunDetail, api.RunList, api.Event,
    api.EventPage, api.CancelReply, api.QueueList, api.ErrorReply, api.ExportGraph, api.ExportedScript,
    api.EstimateGraph, api.Estimate, api.RerunRequest, api.RunEdit,
    api.EditorSessionCache, api.EditorSessionClosed, api.NewEnrollment, api.Redeem, api.CardSharing, api.SshWorker,
    SubmitSweep, SubmitStudy, ResumeStudy, PluginJob, Flavor, FlavorUpdate,
)
_SEQ = {"type": "integer", "minimum": 0, "maximum": 2**62}
_FORMAT = {"type": "string", "enum": ["json", "csv"]}
_STATUS = {"type": "string", "pattern": "^(({0})(,({0}))*)?$".format("|".join(sorted(ALL_STATES))),
           "description": "a status, or several joined by commas (queued,running); empty: every status"}
_HEX_ID = {"type": "string", "pattern": "^[0-9a-f]{32}$"}
_UPLOAD = {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file"], "additionalProperties": False,
    "properties": {"file": {"type": "string", "format": "binary"}}}}}}


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _json(model: type[BaseModel]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": _ref(model)}}}


def _op(summary: str, ok: type[BaseModel] | None, *, status: str = "200", body: type[BaseModel] | None = None,
        params: tuple[tuple[str, str, str | dict[str, Any]], ...] = (), mutation: bool = False,
        required: tuple[str, ...] = ()) -> dict[str, Any]:
    """One operation; a param's schema is a JSON type name or a whole schema (bounds,
    enums). Path params are required, and the query params named in ``required``."""
    responses: dict[str, Any] = {status: {"description": "ok", **(_json(ok) if ok else {})}}
    responses["4XX"] = {"description": "client error", **_json(api.ErrorReply)}
    op: dict[str, Any] = {"summary": summary, "responses": responses}
    if body is not None:
        op["requestBody"] = {"required": True, **_json(body)}
    if params:
        op["parameters"] = [
            {"name": name, "in": where, "required": where == "path" or name in required,
             "schema": {"type": kind} if isinstance(kind, str) else kind}
            for name, where, kind in params
        ]
    if mutation:
        op["security"] = [{"session": []}]
    return op


def _again(op: dict[str, Any], description: str) -> dict[str, Any]:
    """An idempotent creation: a repeat answers 200 with what the first made."""
    op["responses"]["200"] = {"description": description}
    return op


_RUN_ID = ("run_id", "path", "string")
_SESSION = ("session", "path", "string")


def _closed_pattern_maps(node: Any) -> None:
    """A dict whose keys have a pattern takes no other key; pydantic states the pattern
    (``patternProperties``) but not that."""
    if isinstance(node, dict):
        if "patternProperties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for value in node.values():
            _closed_pattern_maps(value)
    elif isinstance(node, list):
        for value in node:
            _closed_pattern_maps(value)


def _server_limits(schemas: dict[str, Any], limits: tuple[int, int, int]) -> None:
    """The limits this server was started with, stated where a request meets them."""
    max_runs, max_params, max_domain = limits
    defs = schemas.get("$defs", {})
    if "SweepSpec" in defs:
        defs["SweepSpec"]["properties"]["params"]["maxItems"] = max_params
        samples = defs["SweepSpec"]["properties"]["samples"]["anyOf"][0]
        samples["maximum"] = max_runs
    if "SweepParam" in defs:
        defs["SweepParam"]["properties"]["values"]["anyOf"][0]["maxItems"] = max_domain


@functools.lru_cache(maxsize=4)
def openapi_document(version: str, limits: tuple[int, int, int] = (32, 4, 32)) -> dict[str, Any]:
    """The document; ``limits`` are the server's (max sweep runs, params, domain)."""
    _, schemas = models_json_schema([(m, "validation") for m in _MODELS], ref_template=_REF)
    _server_limits(schemas, limits)
    _closed_pattern_maps(schemas)
    return {
        "openapi": "3.1.0",
        "info": {"title": "troupe", "version": version},
        "paths": {**_run_paths(), **_other_paths()},
        "components": {
            "schemas": schemas.get("$defs", {}),
            "securitySchemes": {"session": {"type": "http", "scheme": "bearer"}},
        },
    }


def _run_paths() -> dict[str, Any]:
    """A run's routes: submit, list, read, follow, rerun, and what it made."""
    return {
        "/api/runs": {
            "post": _op("Submit a graph as a run", api.RunCreated, status="201", body=api.SubmitRun, mutation=True),
            "get": _op("List runs, newest first (grouped: a row per sweep and study)", api.RunList, params=(
                ("status", "query", _STATUS), ("sweep_id", "query", "string"), ("study_id", "query", "string"),
                ("limit", "query", {"type": "integer", "minimum": 1, "maximum": 500}),
                ("cursor", "query", {"type": "string", "pattern": CURSOR_PATTERN}),
                ("q", "query", {"type": "string", "maxLength": MAX_SEARCH, "pattern": SEARCH_PATTERN}),
                ("tag", "query", {"type": "string", "pattern": "^(" + api.TAG_PATTERN[1:-1] + ")?$",
                                  "description": "empty: any tag"}),
                ("grouped", "query", {"type": "string", "enum": ["true", "false"]}),
                ("sort", "query", {"type": "string", "pattern": SORT_PATTERN,
                                   "description": "by a series' newest value, lowest first (-name: highest); "
                                                  "one page, no cursor"}))),
        },
        "/api/queue-prediction": {"get": _op("Would a run queued now on this key start at once, and if not why",
                                             None, params=(("queue_key", "query", {"type": "string",
                                                                                   "pattern": api.QUEUE_KEY_PATTERN}),
                                                           ("seeded", "query", {"type": "string",
                                                                                "enum": ["true", "false"]})),
                                             required=("queue_key",))},
        "/api/runs/{run_id}": {
            "get": _op("One run", api.RunDetail, params=(_RUN_ID,)),
            "patch": _op("A run's name, tags and note", api.RunDetail, body=api.RunEdit, params=(_RUN_ID,),
                         mutation=True),
            "delete": _op("Delete a finished run", None, params=(_RUN_ID,), mutation=True),
        },
        "/api/runs/{run_id}/cancel": {"post": _op("Cancel a run", api.CancelReply, params=(_RUN_ID,), mutation=True)},
        "/api/runs/{run_id}/rerun": {"post": {**_op(
            "Queue the run again, from the start or (resume) from its newest checkpoint", api.RunCreated,
            status="201", params=(_RUN_ID,), mutation=True),
            "requestBody": {"required": False, **_json(api.RerunRequest)}}},
        "/api/runs/{run_id}/events": {"get": _op("A page of a run's events", api.EventPage, params=(
            _RUN_ID, ("after", "query", _SEQ), ("tail", "query", {"type": "integer", "minimum": 1,
                                                                  "maximum": MAX_TAIL})))},
        "/api/runs/{run_id}/stream": {"get": _op("A run's events as server-sent events", None, params=(
            _RUN_ID, ("after", "query", _SEQ)))},
        "/api/runs/{run_id}/provenance": {"get": _op("The dataset and weight files the run read (with provenance on)",
                                                     None, params=(_RUN_ID,))},
        "/api/runs/{run_id}/fingerprint": {"get": _op("What executed the run; against another, what differs", None,
                                                      params=(_RUN_ID, ("against", "query", _HEX_ID)))},
        "/api/runs/{run_id}/console": {"get": _op("What the run printed, from byte offset on (a page of 1 MiB)",
                                                  None, params=(_RUN_ID, ("offset", "query", _SEQ)))},
        "/api/runs/{run_id}/metrics": {"get": _op("A run's metric series (json or csv)", None, params=(
            _RUN_ID, ("format", "query", _FORMAT),
            ("lineage", "query", {"type": "string", "enum": ["true", "false"],
                                  "description": "a resumed run's chain as one training: each run's points up to "
                                                 "the step the next took over at, each with its run_id"})))},
        "/api/export": {"post": _op("A graph as a standalone Python script", api.ExportedScript,
                                    body=api.ExportGraph, mutation=True)},
        "/api/estimates": {"post": _op("A static memory estimate of a graph, offered as a first budget", api.Estimate,
                                       body=api.EstimateGraph, mutation=True)},
        "/api/runs/{run_id}/outputs": {"get": _op("Recorded outputs of every node", None, params=(_RUN_ID,))},
        "/api/runs/{run_id}/artifacts/{artifact_id}": {"get": _op(
            "An artifact's bytes, wherever it lives", None, params=(_RUN_ID, ("artifact_id", "path", "string")))},
        "/api/runs/{run_id}/outputs/{node_id}": {"get": _op("Recorded outputs of one node", None, params=(
            _RUN_ID, ("node_id", "path", "string")))},
    }


def _other_paths() -> dict[str, Any]:
    """Sweeps, studies, editor sessions, plugins, workers, files, flavors, the catalog."""
    return {
        "/api/sweeps": {
            "post": _op("Queue a sweep: one run per combination", None, status="201", body=SubmitSweep, mutation=True),
            "get": _op("Every sweep, newest first", None),
        },
        "/api/sweeps/{sweep_id}": {"get": _op("A sweep's ranked variants (json or csv)", None, params=(
            ("sweep_id", "path", "string"), ("format", "query", _FORMAT)))},
        "/api/sweeps/{sweep_id}/cancel": {"post": _op("Cancel a sweep's active runs", None, params=(
            ("sweep_id", "path", "string"),), mutation=True)},
        "/api/editor-sessions/{session}": {
            "get": _op("What an editor session's node cache holds", api.EditorSessionCache, params=(_SESSION,)),
            "delete": _op("Close an editor session: drop its cached node outputs", api.EditorSessionClosed,
                          params=(_SESSION,), mutation=True),
        },
        "/api/resources": {"get": _op("The cpus lent to declared nodes", None)},
        "/api/studies": {
            "post": _op("Start a study", None, status="201", body=SubmitStudy, mutation=True),
            "get": _op("Every study, newest first", None),
        },
        "/api/studies/{study_id}": {"get": _op("A study with its attempts and ranking (json or csv)", None, params=(
            ("study_id", "path", "string"), ("format", "query", _FORMAT)))},
        "/api/studies/{study_id}/cancel": {"post": _op("Cancel a study", None, params=(
            ("study_id", "path", "string"),), mutation=True)},
        "/api/studies/{study_id}/resume": {"post": _op("Resume a halted study with a new budget", None, params=(
            ("study_id", "path", "string"),), body=ResumeStudy, mutation=True)},
        "/api/plugins/{plugin_id}/jobs": {
            "post": _again(_op("Create a plugin job (idempotent per key)", None, status="201", body=PluginJob,
                               params=(("plugin_id", "path", "string"),), mutation=True),
                           "the job of this idempotency key, already made with the same spec"),
            "get": _op("A plugin's jobs", None, params=(("plugin_id", "path", "string"),)),
        },
        "/api/plugins/{plugin_id}/jobs/{job_id}": {"get": _op("One plugin job", None, params=(
            ("plugin_id", "path", "string"), ("job_id", "path", "string")))},
        "/api/stream": {"get": _op("Every run's changes as server-sent events", None)},
        "/api/queues": {"get": _op("Queue keys with limits and counts", api.QueueList)},
        "/api/info": {"get": _op("Version, devices and capabilities", None)},
        "/api/examples": {"get": _op("Bundled example graphs", None)},
        "/api/nodes": {"get": _op("The node catalog", None)},
        "/metrics": {"get": _op("Prometheus metrics", None)},
        "/api/workers": {"get": _op("Every enrolled or connected worker with its state, devices and slots", None)},
        "/api/workers/enrollments": {"post": _op("A one-time join token and the command that uses it", None,
                                                 status="201", body=api.NewEnrollment, mutation=True)},
        "/api/workers/credentials": {"post": _op("An agent trades its join token for its credential (the token is "
                                                 "the proof; no session token)", None, status="201",
                                                 body=api.Redeem)},
        "/api/workers/{name}": {"delete": _op("Revoke a worker: its agent is refused and its runs end", None,
                                              params=(("name", "path", "string"),), mutation=True)},
        "/api/workers/{name}/drain": {"post": _op("No new runs start on this worker", None,
                                                  params=(("name", "path", "string"),), mutation=True)},
        "/api/files": {"get": _op("Every uploaded file", None),
                       "post": {**_op("Upload a file (multipart, field file) for runs to read as upload:<id>", None,
                                      status="201", mutation=True), "requestBody": _UPLOAD}},
        "/api/files/{file_id}/content": {"get": _op("An uploaded file's bytes", None,
                                                    params=(("file_id", "path", "string"),))},
        "/api/files/{file_id}": {"delete": _op("Delete an upload no queued or running run reads", None,
                                               params=(("file_id", "path", "string"),), mutation=True)},
        "/api/ids": {"get": _op("The runs, sweeps and studies whose id starts with a prefix (a short id)", None,
                                params=(("prefix", "query", {"type": "string", "pattern": "^[0-9a-f]{4,32}$"}),))},
        "/api/packs": {"get": _op("Every pack loaded, with its version, digest and node types; the broken ones "
                                  "with their error", None)},
        "/api/packs/{name}/archive": {"get": _op("A folder pack's files (gzip'd tar) for an agent started with "
                                                 "--accept-packs; X-Troupe-Pack-Digest is their sha256", None,
                                                 params=(("name", "path", "string"),))},
        "/api/flavors": {"get": _op("Every flavor (a named size)", None),
                         "post": _op("Store a flavor", Flavor, status="201", body=Flavor, mutation=True)},
        "/api/flavors/{name}": {
            "get": _op("One flavor", Flavor, params=(("name", "path", "string"),)),
            "put": _op("Replace a flavor's sizes (what is left out is unset)", Flavor, body=FlavorUpdate,
                       params=(("name", "path", "string"),), mutation=True),
            "delete": _op("Delete a flavor no unfinished run, sweep or study uses", None,
                          params=(("name", "path", "string"),), mutation=True)},
        "/api/workers/ssh": {"post": _op("Serve a worker through an SSH session this server opens (ssh -R)", None,
                                         status="201", body=api.SshWorker, mutation=True)},
        "/api/workers/{name}/devices/{device}": {"put": _op(
            "Set how a card admits runs: by slots, or shared by memory budget", None, body=api.CardSharing,
            params=(("name", "path", "string"), ("device", "path", "string")), mutation=True)},
    }
