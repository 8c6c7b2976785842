"""``/api/openapi.json``, generated from the pydantic models that validate requests."""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from troupe.protocol import api
from troupe.protocol import replies as r
from troupe.protocol import replies_runs as rr
from troupe.protocol import replies_workers as rw
from troupe.protocol.events import ALL_STATES
from troupe.protocol.flavors import Flavor, FlavorUpdate
from troupe.protocol.studies import PluginJob, ResumeStudy, SubmitStudy
from troupe.protocol.sweeps import SubmitSweep
from troupe.protocol.where import MAX_KEY, MAX_WHERE
from troupe.web.openapi_streams import stream_operations
from troupe.web.routes_find import CURSOR_PATTERN, MAX_SEARCH, METRIC_PATTERN, SEARCH_PATTERN, SORT_PATTERN
from troupe.web.routes_login import Login, NewLoginLink, SessionName
from troupe.web.routes_runs import MAX_TAIL

_REF = "#/components/schemas/{model}"

_MODELS: tuple[type[BaseModel], ...] = (
    api.SubmitRun, api.RunOptions, api.RunCreated, api.RunRow, api.RunDetail, api.RunList, api.Event,
    api.EventPage, api.CancelReply, api.QueueList, api.ErrorReply, api.ExportGraph, api.ExportedScript,
    api.EstimateGraph, api.Estimate, api.RerunRequest, api.RunEdit,
    api.EditorSessionCache, api.EditorSessionClosed, api.NewEnrollment, api.Redeem, api.CardSharing, api.SshWorker,
    SubmitSweep, SubmitStudy, ResumeStudy, PluginJob, Flavor, FlavorUpdate, Login, NewLoginLink, SessionName,
    *(model for module in (r, rr, rw) for model in vars(module).values()
      if isinstance(model, type) and issubclass(model, rr._Reply) and model is not rr._Reply),
)
_SEQ = {"type": "integer", "minimum": 0, "maximum": 2**62}
# ?format=csv is read too, for the clients that always sent it; the document states the
# CSV as its own operation (troupe/web/routes_tables.py), with its one media type.
_FORMAT = {"type": "string", "enum": ["json"], "description": "json; the CSV table is the .csv operation beside"}
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
        required: tuple[str, ...] = (), media: str | None = None, unavailable: bool = False) -> dict[str, Any]:
    """One operation; a param's schema is a JSON type name or a whole schema (bounds,
    enums). Path params are required, and the query params named in ``required``.
    ``media``: an answer that is not JSON (a table, a file), said by its media type;
    ``unavailable``: a read that answers 503 while what it reads is away (a worker)."""
    answer = _json(ok) if ok else {"content": _media(media)} if media else {}
    responses: dict[str, Any] = {status: {"description": "ok", **answer}}
    responses["4XX"] = {"description": "client error", **_json(api.ErrorReply)}
    if mutation or unavailable:  # a busy lane, an offline worker, a full card, a stopping server: not now
        responses["503"] = {"description": "no capacity now; the error's code says which", **_json(api.ErrorReply)}
    if mutation:
        responses["429"] = {"description": "quota_exceeded: past a limit of the session's class link",
                            **_json(api.ErrorReply)}
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


def _media(media: str) -> dict[str, Any]:
    """An answer that is not JSON: text is a string, anything else bytes. A binary type
    a generator may not know (application/gzip) is also named as what it is to such a
    generator, bytes (application/octet-stream): the client it makes reads the bytes
    rather than leave the answer out."""
    if media.startswith("text/"):
        return {media: {"schema": {"type": "string"}}}
    if media == "application/json":
        return {media: {"schema": {"type": "object"}}}
    binary = {"schema": {"type": "string", "format": "binary"}}
    return {media: binary} if media == _BYTES else {media: binary, _BYTES: binary}


def _again(op: dict[str, Any], description: str) -> dict[str, Any]:
    """An idempotent creation: a repeat answers 200 with what the first made."""
    op["responses"]["200"] = {**op["responses"]["201"], "description": description}
    return op


def _or(other: type[BaseModel], op: dict[str, Any]) -> dict[str, Any]:
    """An answer of either shape, by what was asked (the run list, or its groups)."""
    content = op["responses"]["200"]["content"]["application/json"]
    content["schema"] = {"oneOf": [content["schema"], _ref(other)]}
    return op


_RUN_ID = ("run_id", "path", "string")
# A file in the run's folder: names joined by /, none "." or "..", no control character;
# at most 63 characters a name and 512 in all here (the server takes 255 bytes a name and
# 1,024 characters: these always fit, and the request line of any of them stays short).
_NAME_CHARS = r"[^/\\\u0000-\u001f\u007f]{1,63}"
_ARTIFACT_PATH = rf"^(?:(?!\.{{1,2}}/){_NAME_CHARS}/)*(?!\.{{1,2}}$){_NAME_CHARS}$"
_BYTES = "application/octet-stream"
_CSV = "text/csv"
_LINEAGE = ("lineage", "query", {"type": "string", "enum": ["true", "false"],
                                 "description": "a resumed run's chain as one training: each run's points up to the "
                                                "step the next took over at, each with its run_id"})
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


_PROMISE = (
    "Every route of the server, each answer with its schema: every field an answer has is declared (answers stay "
    "open to fields a newer server adds). A table (CSV) is an operation of its own, text/csv. The two server-sent "
    "event streams are under x-streams, in OpenAPI 3.2's form (text/event-stream with itemSchema), not under paths: "
    "a 3.1 client reads an answer to its end, and a stream has none. docs/api.md says how to generate a client.")


@functools.lru_cache(maxsize=4)
def openapi_document(version: str, limits: tuple[int, int, int] = (32, 4, 32)) -> dict[str, Any]:
    """The document; ``limits`` are the server's (max sweep runs, params, domain)."""
    _, schemas = models_json_schema([(m, "validation") for m in _MODELS], ref_template=_REF)
    # Two models of one name would be renamed module__Name, and a $ref by the plain name
    # would lead nowhere: refused here, so no such document is ever served.
    collided = sorted(name for name in schemas.get("$defs", {}) if "__" in name)
    if collided:
        raise RuntimeError(f"two models share a name in the OpenAPI document: {', '.join(collided)}")
    _server_limits(schemas, limits)
    _closed_pattern_maps(schemas)
    paths = {**_run_paths(), **_other_paths(), **_worker_paths(), **_login_paths()}
    _name_operations(paths)
    return {
        "openapi": "3.1.0",
        "info": {"title": "troupe", "version": version, "description": _PROMISE},
        "tags": [{"name": tag} for tag in sorted({op["tags"][0] for ops in paths.values() for op in ops.values()})],
        "paths": paths,
        "x-streams": stream_operations(),
        "components": {
            "schemas": schemas.get("$defs", {}),
            "securitySchemes": {"session": {"type": "http", "scheme": "bearer"},
                                "worker": {"type": "http", "scheme": "bearer",
                                           "description": "a worker's credential (POST /api/workers/credentials)"}},
        },
    }


_ACTIONS = frozenset({"cancel", "rerun", "resume", "drain", "login", "logout"})
_VERBS = {"get": "get", "post": "create", "put": "put", "patch": "edit", "delete": "delete"}
_TAGS = {"runs": "runs", "queue-prediction": "queues", "queues": "queues", "export": "runs", "estimates": "runs",
         "ids": "runs", "stream": "runs", "sweeps": "sweeps", "studies": "studies", "plugins": "studies",
         "workers": "workers", "files": "files", "flavors": "flavors", "packs": "catalog", "nodes": "catalog",
         "examples": "catalog", "editor-sessions": "editor", "resources": "server", "info": "server",
         "openapi.json": "server", "login": "login", "logout": "login", "login-links": "login",
         "sessions": "login"}


def _name_operations(paths: dict[str, Any]) -> None:
    """Every operation's ``operationId`` (a generated client's function name: the verb,
    then the path's words, ``get_runs_run_id_metrics``) and its tag (the resource)."""
    for path, operations in paths.items():
        words = [w.strip("{}").replace("-", "_").replace(".", "_") for w in path.strip("/").split("/")]
        words = words[1:] if words[0] == "api" else words
        tag = "server" if path == "/metrics" else "workers" if path == "/ws/worker" else _TAGS[path.split("/")[2]]
        for method, op in operations.items():
            if method == "post" and words[-1] in _ACTIONS:  # cancel_runs_run_id, not create_..._cancel
                op.setdefault("operationId", "_".join([words[-1], *words[:-1]]) if len(words) > 1 else words[0])
            op.setdefault("operationId", "_".join([_VERBS[method], *words]))
            op.setdefault("tags", [tag])


# GET /api/runs's query: each one the route takes (any other is refused: unknown_parameter).
_RUN_LIST_PARAMS = (
    ("status", "query", _STATUS), ("sweep_id", "query", "string"), ("study_id", "query", "string"),
    ("limit", "query", {"type": "integer", "minimum": 1, "maximum": 500}),
    ("cursor", "query", {"type": "string", "pattern": CURSOR_PATTERN}),
    ("q", "query", {"type": "string", "maxLength": MAX_SEARCH, "pattern": SEARCH_PATTERN}),
    ("tag", "query", {"type": "string", "pattern": "^(" + api.TAG_PATTERN[1:-1] + ")?$",
                      "description": "empty: any tag"}),
    ("grouped", "query", {"type": "string", "enum": ["true", "false"]}),
    ("mine", "query", {"type": "string", "enum": ["true", "false"],
                       "description": "true: the runs the asking session submitted"}),
    ("values", "query", {"type": "string", "enum": ["true", "false"],
                         "description": "true: each run with its params and newest metric values"}),
    ("sort", "query", {"type": "string", "pattern": SORT_PATTERN,
                       "description": "by a series' newest value, lowest first (-name: highest); "
                                      "its next_cursor pages on"}),
    ("where", "query", {"type": "string", "maxLength": MAX_WHERE,
                        "description": "a filter: KEY OP VALUE joined by and / or with parentheses "
                                       "(adam.lr = 0.01 and metric.val_loss < 0.1); docs/runs.md"}),
    ("group_by", "query", {"type": "string", "maxLength": MAX_KEY,
                           "description": "a key of where: the answer is a RunGroupList, a row per value"}),
    ("metric", "query", {"type": "string", "pattern": METRIC_PATTERN,
                         "description": "with group_by: each group's statistics of this series"}),
)


def _run_paths() -> dict[str, Any]:
    """A run's routes: submit, list, read, follow, rerun, and what it made."""
    return {
        "/api/runs": {
            "post": _op("Submit a graph as a run", api.RunCreated, status="201", body=api.SubmitRun, mutation=True),
            "get": _or(rr.RunGroupList, _op(
                "List runs, newest first (grouped: a row per sweep and study; group_by: a row per value of a key)",
                api.RunList, params=_RUN_LIST_PARAMS)),
        },
        "/api/runs/keys": {"get": _op("The keys where and group_by can name, with how many runs have each",
                                      rr.RunKeyList)},
        "/api/queue-prediction": {"get": _op("Would a run queued now on this key start at once, and if not why",
                                             r.QueuePrediction, params=(("queue_key", "query", {"type": "string",
                                                                                   "pattern": api.QUEUE_KEY_PATTERN}),
                                                           ("seeded", "query", {"type": "string",
                                                                                "enum": ["true", "false"]})),
                                             required=("queue_key",))},
        "/api/runs/{run_id}": {
            "get": _op("One run", api.RunDetail, params=(_RUN_ID,)),
            "patch": _op("A run's name, tags and note", api.RunDetail, body=api.RunEdit, params=(_RUN_ID,),
                         mutation=True),
            "delete": _op("Delete a finished run", r.RunDeleted, params=(_RUN_ID,), mutation=True),
        },
        "/api/runs/{run_id}/cancel": {"post": _op("Cancel a run", api.CancelReply, params=(_RUN_ID,), mutation=True)},
        "/api/runs/{run_id}/rerun": {"post": {**_op(
            "Queue the run again, from the start or (resume) from its newest checkpoint", api.RunCreated,
            status="201", params=(_RUN_ID,), mutation=True),
            "requestBody": {"required": False, **_json(api.RerunRequest)}}},
        "/api/runs/{run_id}/events": {"get": _op("A page of a run's events", api.EventPage, params=(
            _RUN_ID, ("after", "query", _SEQ), ("tail", "query", {"type": "integer", "minimum": 1,
                                                                  "maximum": MAX_TAIL})))},
        "/api/runs/{run_id}/provenance": {"get": _op("The dataset and weight files the run read (with provenance on)",
                                                     rr.Provenance, params=(_RUN_ID,))},
        "/api/runs/{run_id}/fingerprint": {"get": _op("What executed the run; against another, what differs",
                                                      rr.Fingerprint,
                                                      params=(_RUN_ID, ("against", "query", _HEX_ID)))},
        "/api/runs/{run_id}/console": {"get": _op("What the run printed, from byte offset on (a page of 1 MiB)",
                                                  r.ConsolePage, params=(
                                                      _RUN_ID, ("offset", "query", _SEQ),
                                                      ("nodes", "query", {"type": "string", "enum": ["true", "false"],
                                                                          "description": "each line marked with its "
                                                                                         "node and stream"})))},
        "/api/runs/{run_id}/metrics": {"get": _op("A run's metric series", r.RunMetrics, params=(
            _RUN_ID, ("format", "query", _FORMAT), _LINEAGE))},
        "/api/runs/{run_id}/metrics.csv": {"get": _op("A run's metric series as a table: series,step,value,ts", None,
                                                      media=_CSV, params=(_RUN_ID, _LINEAGE))},
        "/api/export": {"post": _op("A graph as a standalone Python script", api.ExportedScript,
                                    body=api.ExportGraph, mutation=True)},
        "/api/estimates": {"post": _op("A static memory estimate of a graph, offered as a first budget", api.Estimate,
                                       body=api.EstimateGraph, mutation=True)},
        "/api/runs/{run_id}/outputs": {"get": _op("Recorded outputs of every node", rr.RunOutputs, params=(_RUN_ID,),
                                                  unavailable=True)},
        "/api/runs/{run_id}/artifacts/{artifact_id}": {"get": _op(
            "An artifact's bytes, wherever it lives", None, media=_BYTES,
            params=(_RUN_ID, ("artifact_id", "path", "string")))},
        "/api/runs/{run_id}/artifacts": {"put": {**_op(
            "A worker sends one of its run's files (the run's worker, with its credential)", r.ArtifactStored,
            status="201", mutation=True, required=("path", "X-Troupe-Sha256"), params=(
                _RUN_ID, ("path", "query", {"type": "string", "maxLength": 512, "pattern": _ARTIFACT_PATH}),
                ("X-Troupe-Sha256", "header", {"type": "string", "pattern": "^[0-9a-f]{64}$"}))),
            "requestBody": {"required": True, "content": {_BYTES: {"schema": {"type": "string",
                                                                              "format": "binary"}}}}}},
        "/api/runs/{run_id}/outputs/{node_id}": {"get": _op("Recorded outputs of one node", rr.NodeOutputs, params=(
            _RUN_ID, ("node_id", "path", "string")), unavailable=True)},
    }


def _other_paths() -> dict[str, Any]:
    """Sweeps, studies, editor sessions, plugins, workers, files, flavors, the catalog."""
    return {
        "/api/sweeps": {
            "post": _op("Queue a sweep: one run per combination", r.SweepCreated, status="201", body=SubmitSweep,
                        mutation=True),
            "get": _op("Every sweep, newest first", r.SweepList),
        },
        "/api/sweeps/{sweep_id}": {"get": _op("A sweep's ranked variants", r.SweepDetail, params=(
            ("sweep_id", "path", "string"), ("format", "query", _FORMAT)))},
        "/api/sweeps/{sweep_id}/ranking.csv": {"get": _op("A sweep's ranked variants as a table, a column per param",
                                                          None, media=_CSV, params=(("sweep_id", "path", "string"),))},
        "/api/sweeps/{sweep_id}/cancel": {"post": _op("Cancel a sweep's active runs", r.SweepCancelled, params=(
            ("sweep_id", "path", "string"),), mutation=True)},
        "/api/editor-sessions/{session}": {
            "get": _op("What an editor session's node cache holds", api.EditorSessionCache, params=(_SESSION,)),
            "delete": _op("Close an editor session: drop its cached node outputs", api.EditorSessionClosed,
                          params=(_SESSION,), mutation=True),
        },
        "/api/resources": {"get": _op("The cpus lent to declared nodes", rw.CpuLedgerReply)},
        "/api/studies": {
            "post": _op("Start a study", r.StudyDetail, status="201", body=SubmitStudy, mutation=True),
            "get": _op("Every study, newest first", r.StudyList),
        },
        "/api/studies/{study_id}": {"get": _op("A study with its attempts and ranking", r.StudyDetail, params=(
            ("study_id", "path", "string"), ("format", "query", _FORMAT)))},
        "/api/studies/{study_id}/ranking.csv": {"get": _op("A study's ranking as a table, the unranked after it",
                                                           None, media=_CSV,
                                                           params=(("study_id", "path", "string"),))},
        "/api/studies/{study_id}/cancel": {"post": _op("Cancel a study", r.StudyDetail, params=(
            ("study_id", "path", "string"),), mutation=True)},
        "/api/studies/{study_id}/resume": {"post": _op("Resume a halted study with a new budget", r.StudyDetail,
                                                       params=(
            ("study_id", "path", "string"),), body=ResumeStudy, mutation=True)},
        "/api/plugins/{plugin_id}/jobs": {
            "post": _again(_op("Create a plugin job (idempotent per key)", r.PluginJobRow, status="201", body=PluginJob,
                               params=(("plugin_id", "path", "string"),), mutation=True),
                           "the job of this idempotency key, already made with the same spec"),
            "get": _op("A plugin's jobs", r.PluginJobList, params=(("plugin_id", "path", "string"),)),
        },
        "/api/plugins/{plugin_id}/jobs/{job_id}": {"get": _op("One plugin job", r.PluginJobRow, params=(
            ("plugin_id", "path", "string"), ("job_id", "path", "string")))},
        "/api/queues": {"get": _op("Queue keys with limits and counts", api.QueueList)},
        "/api/info": {"get": _op("Version, devices and capabilities", rw.Info)},
        "/api/examples": {"get": _op("Bundled example graphs", r.ExampleList)},
        "/api/nodes": {"get": _op("The node catalog", r.Catalog)},
        "/metrics": {"get": _op("Prometheus metrics (OpenMetrics when Accept asks for it)", None,
                                media="text/plain")},
        "/api/openapi.json": {"get": _op("This document", None, media="application/json")},
        "/ws/worker": {"get": {**_op("The socket a worker's agent dials (a websocket; frames in protocol.worker)",
                                     None, status="101"), "security": [{"worker": []}]}},
        "/api/ids": {"get": _op("The runs, sweeps and studies whose id starts with a prefix (a short id)", r.IdMatches,
                                params=(("prefix", "query", {"type": "string", "pattern": "^[0-9a-f]{4,32}$"}),),
                                required=("prefix",))},
        "/api/packs": {"get": _op("Every pack loaded, with its version, digest and node types; the broken ones "
                                  "with their error", r.PackList)},
        "/api/packs/{name}/archive": {"get": _op("A folder pack's files (gzip'd tar) for an agent started with "
                                                 "--accept-packs; X-Troupe-Pack-Digest is their sha256", None,
                                                 media="application/gzip",
                                                 params=(("name", "path", "string"),))},
        "/api/flavors": {"get": _op("Every flavor (a named size)", r.FlavorList),
                         "post": _op("Store a flavor", Flavor, status="201", body=Flavor, mutation=True)},
        "/api/flavors/{name}": {
            "get": _op("One flavor", Flavor, params=(("name", "path", "string"),)),
            "put": _op("Replace a flavor's sizes (what is left out is unset)", Flavor, body=FlavorUpdate,
                       params=(("name", "path", "string"),), mutation=True),
            "delete": _op("Delete a flavor no unfinished run, sweep or study uses", r.FlavorDeleted,
                          params=(("name", "path", "string"),), mutation=True)},
    }


def _login_paths() -> dict[str, Any]:
    """Logging in and out, login links and sessions."""
    return {
        "/api/login": {"post": _op("A login link's token for a session (a terminal's bearer secret, or a browser's "
                                   "cookie with browser: true)", r.LoggedIn, status="201", body=Login)},
        "/api/logout": {"post": _op("End the session the request comes with", r.Revoked, mutation=True)},
        "/api/login-links": {
            "get": _op("The login links this server made (never their tokens)", r.LoginLinks),
            "post": {**_op("A fresh login link: a teacher's, a class's (uses) or a read-only one", r.LoginLinkCreated,
                           status="201", mutation=True),
                     "requestBody": {"required": False, **_json(NewLoginLink)}}},
        "/api/login-links/{link_id}": {"delete": _op("Revoke a login link and end the sessions it opened", r.Revoked,
                                                     params=(("link_id", "path", "string"),), mutation=True)},
        "/api/sessions": {"get": _op("The open sessions (never their secrets)", r.Sessions)},
        "/api/sessions/me": {"put": _op("Name this session (as the teacher sees it in who is connected)",
                                        r.SessionNamed, body=SessionName, mutation=True)},
        "/api/sessions/{session_id}": {"delete": _op("End a session", r.Revoked,
                                                     params=(("session_id", "path", "string"),), mutation=True)},
    }


def _worker_paths() -> dict[str, Any]:
    """Workers (enrolling, listing, draining, their cards) and uploaded files."""
    return {
        "/api/workers": {"get": _op("Every enrolled or connected worker with its state, devices and slots",
                                     rw.WorkerList)},
        "/api/workers/enrollments": {"post": _op("A one-time join token and the command that uses it", rw.Enrollment,
                                                 status="201", body=api.NewEnrollment, mutation=True)},
        "/api/workers/credentials": {"post": _op("An agent trades its join token for its credential (the token is "
                                                 "the proof; no session token)", rw.WorkerCredential, status="201",
                                                 body=api.Redeem)},
        "/api/workers/{name}": {"delete": _op("Revoke a worker: its agent is refused and its runs end", r.Revoked,
                                              params=(("name", "path", "string"),), mutation=True)},
        "/api/workers/{name}/drain": {"post": _op("No new runs start on this worker", rw.WorkerRow,
                                                  params=(("name", "path", "string"),), mutation=True)},
        "/api/files": {"get": _op("Every uploaded file", r.FileList),
                       "post": {**_op("Upload a file (multipart, field file) for runs to read as upload:<id>",
                                      r.FileStored,
                                      status="201", mutation=True), "requestBody": _UPLOAD}},
        "/api/files/{file_id}/content": {"get": _op("An uploaded file's bytes", None, media=_BYTES,
                                                    params=(("file_id", "path", "string"),))},
        "/api/files/{file_id}": {"delete": _op("Delete an upload no queued or running run reads", r.FileDeleted,
                                               params=(("file_id", "path", "string"),), mutation=True)},
        "/api/workers/ssh": {"post": _op("Serve a worker through an SSH session this server opens (ssh -R)",
                                         rw.WorkerAdded,
                                         status="201", body=api.SshWorker, mutation=True)},
        "/api/workers/{name}/devices/{device}": {"put": _op(
            "Set how a card admits runs: by slots, or shared by memory budget", rw.CardPolicySet, body=api.CardSharing,
            params=(("name", "path", "string"), ("device", "path", "string")), mutation=True)},
    }
