"""A check for the seeded schemathesis run (tests/integration/test_openapi_fuzz_functional):
a request the OpenAPI document calls valid is never refused for its shape. Loaded by
schemathesis through ``SCHEMATHESIS_HOOKS``.

Answers that are not defects: 401 (the token is the fuzzer's to get right), 404 (an
id that names nothing), 409 (a state that forbids it), and the 400s that judge a graph
against the catalog or a sweep against its graph, or name a worker that never connected,
which no schema can say."""

from __future__ import annotations

import os
from typing import Any

import schemathesis

ANSWERS = frozenset({401, 404, 409})
MEANING_CODES = frozenset({"graph_invalid", "sweep_invalid", "invalid_device", "target_needs_worker",
                           "memory_budget_needs_worker", "unknown_target_option", "flavor_not_found",
                           "upload_not_found", "worker_cannot_grant", "too_many_cpus", "unknown_flavor",
                           "unknown_target", "one_shot_record_outputs"})


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
