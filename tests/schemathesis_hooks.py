"""A check for the seeded schemathesis run (tests/integration/test_openapi_fuzz_functional):
a request the OpenAPI document calls valid is never refused for its shape; and every field
of an answer is one the document declares (the schemas only answers use are closed before
schemathesis reads the document, so its response conformance check says so). Valid
requests name what the test made (``map_case``). Loaded by schemathesis through
``SCHEMATHESIS_HOOKS``.

Answers that are not defects: 401 (the token is the fuzzer's to get right), 404 (an
id that names nothing), 409 (a state that forbids it), and the 400s that judge a graph
against the catalog or a sweep against its graph, or name a worker that never connected,
which no schema can say."""

from __future__ import annotations

import json
import os
from typing import Any

import schemathesis

ANSWERS = frozenset({401, 404, 409})
MEANING_CODES = frozenset({"graph_invalid", "sweep_invalid", "study_invalid", "invalid_device", "target_needs_worker",
                           "memory_budget_needs_worker", "unknown_target_option", "flavor_not_found",
                           "upload_not_found", "worker_cannot_grant", "too_many_cpus", "unknown_flavor",
                           "unknown_target", "one_shot_record_outputs",
                           # a file whose X-Troupe-Sha256 is not its bytes' digest, or whose path is a folder there
                           "artifact_refused",
                           # a where filter's grammar nests (no pattern says it), a key no stored run has, and
                           # the list's parameters that do not go together (group_by with sort)
                           "where_invalid", "where_unknown_key", "query_conflict",
                           # a device this server does not have, with options.require_device refusing the cpu
                           "device_unavailable"})


# "Not now" answers, documented as 503 on every mutation: a busy lane, an offline worker,
# a full card, a stopping server. Any other 5xx is a defect.
PLANNED_503 = frozenset({"capacity_refused", "interactive_lane_full", "editor_session_busy", "queue_quarantined",
                         "shutting_down", "memory_busy", "worker_offline", "storage_unavailable"})


@schemathesis.check
def no_unplanned_server_error(ctx: Any, response: Any, case: Any) -> None:
    """schemathesis's not_a_server_error, less the 503s the document states."""
    if response.status_code < 500:
        return
    try:
        code = response.json()["error"]["code"]
    except Exception:
        code = None
    if response.status_code == 503 and code in PLANNED_503:
        return
    raise AssertionError(f"a server error: {response.status_code} {code}: {response.text[:300]}")


@schemathesis.check
def valid_requests_are_answered(ctx: Any, response: Any, case: Any) -> None:
    tally = os.environ.get("TROUPE_FUZZ_TALLY")
    if tally:  # the test checks that this check ran at all
        with open(tally, "a") as out:
            out.write(f"{response.status_code}\n")
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return
    status = response.status_code
    if status < 400 or status in ANSWERS or status >= 500:  # a 5xx is not_a_server_error's to report
        return
    try:
        error = response.json()["error"]
    except Exception:
        error = {}
    code = error.get("code")
    if status == 400 and code in MEANING_CODES:
        return
    if "should match pattern" in error.get("message", "") and "\n" in error.get("pointer", ""):
        # The fuzzer reads a pattern's "$" as Python does (before a final newline); the
        # document's patterns are ECMA-262, where "$" is the end: such a value is not valid.
        return
    raise AssertionError(f"a request the document calls valid was refused: {status} {code}: {response.text[:300]}")


def close_answers(document: dict[str, Any]) -> set[str]:
    """Closes (``additionalProperties: false``) every schema that only answers use, so
    that response conformance fails on a field the server sends and the document does
    not declare. The served document keeps them open, for a client of an older document
    against a newer server; a schema that a request uses too keeps its own rule. Answers
    the names closed."""
    schemas = document.get("components", {}).get("schemas", {})

    def refs(node: Any, found: set[str]) -> set[str]:
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                found.add(node["$ref"].rsplit("/", 1)[-1])
            for value in node.values():
                refs(value, found)
        elif isinstance(node, list):
            for value in node:
                refs(value, found)
        return found

    def reached(start: set[str]) -> set[str]:
        seen: set[str] = set()
        todo = list(start)
        while todo:
            name = todo.pop()
            if name not in seen and name in schemas:
                seen.add(name)
                todo.extend(refs(schemas[name], set()))
        return seen

    answers: set[str] = set()
    asks: set[str] = set()
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            refs(operation.get("responses", {}), answers)
            refs(operation.get("requestBody", {}), asks)
            refs(operation.get("parameters", []), asks)
    closed = set()
    for name in reached(answers) - reached(asks):
        schema = schemas[name]
        if schema.get("type") == "object" and schema.get("additionalProperties", True) is True:
            schema["additionalProperties"] = False
            closed.add(name)
    return closed


@schemathesis.hook
def before_load_schema(ctx: Any, raw_schema: dict[str, Any]) -> None:
    close_answers(raw_schema)


def _known_ids() -> dict[str, list[str]]:
    """What the test made before the run (``TROUPE_FUZZ_IDS``): a path parameter's name,
    or ``PATH:NAME`` for one path's, -> ids that exist."""
    given = os.environ.get("TROUPE_FUZZ_IDS")
    return json.loads(given) if given else {}


@schemathesis.hook
def map_case(ctx: Any, case: Any) -> Any:
    """A valid request names things that exist: its path parameters are the ids of what
    the test made, so that the answers checked against the document are the full ones (a
    run with its artifacts and facts, a finished sweep's ranking, a connected worker), not
    only 404s. Deletes keep the fuzzer's ids: what they would remove stays for the rest."""
    known = _known_ids()
    meta = case.meta
    if not known or case.operation.method.upper() == "DELETE" or not case.path_parameters or (
            meta is not None and not meta.generation.mode.is_positive):
        return case
    for name, drawn in case.path_parameters.items():
        ids = known.get(f"{case.operation.path}:{name}") or known.get(name)
        if ids:
            case.path_parameters[name] = ids[len(str(drawn)) % len(ids)]
    return case
