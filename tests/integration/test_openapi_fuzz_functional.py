"""A bounded, seeded schemathesis run over the whole OpenAPI document of a real server:
no request it generates gets a 5xx, and server and schema agree. Schemathesis's own
``positive_data_acceptance`` is replaced by ``valid_requests_are_answered``
(tests/schemathesis_hooks.py): a request the document calls valid may still be answered
401, 404 or 409, or refused for what it means against the catalog (an edge to a node
that does not exist), which no schema can say; any other 4xx is a disagreement. Its
``not_a_server_error`` by ``no_unplanned_server_error``: the 503s the document states
(not now: a busy lane, an offline worker) are answers, any other 5xx a defect. Every
answer is checked against the document's schema for it (response conformance); the
worker's websocket is not HTTP and is left out."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ST = Path(sys.executable).with_name("st")


@pytest.mark.timeout(300)
def test_a_seeded_fuzz_of_every_route_finds_no_5xx_and_no_disagreement(make_server, tmp_path):
    if not ST.exists() and shutil.which("st") is None:
        pytest.skip("schemathesis is not installed (make test installs it with the test extras)")
    # No capacity refusal (503) by chance: the fuzzer may submit many interactive runs at once.
    server = make_server(TROUPE_SIMULATED_ACCELERATORS="cuda:0", TROUPE_RUN_INTERACTIVE_MAX_CONCURRENT="1000")
    result = subprocess.run(
        [str(ST if ST.exists() else shutil.which("st")), "run", f"{server.url}/api/openapi.json",
         "-H", f"Authorization: Bearer {server.token}", "--max-examples", "12", "--seed", "1",
         "--checks", "all", "--exclude-checks", "positive_data_acceptance,not_a_server_error",
         "--exclude-path", "/ws/worker", "--phases", "examples,fuzzing",
         "--no-color"],
        capture_output=True, text=True, timeout=280, cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "SCHEMATHESIS_HOOKS": "tests.schemathesis_hooks",
             "TROUPE_FUZZ_TALLY": str(tmp_path / "tally")})
    tail = result.stdout[-30000:]  # the failing operation is named far above the summary
    assert result.returncode == 0, tail
    assert "failures" not in tail.split("SUMMARY")[-1], tail
    statuses = (tmp_path / "tally").read_text().split()
    assert len(statuses) > 100 and "400" in statuses and "201" in statuses  # the check saw refusals and successes
