"""A bounded, seeded schemathesis run over the whole OpenAPI document of a real server:
no request it generates gets a 5xx, and server and schema agree (every check but
``positive_data_acceptance``: a graph that fits the schema may still be refused for what
it means, such as an edge to a node that does not exist, which a schema cannot say)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ST = Path(sys.executable).with_name("st")


@pytest.mark.timeout(300)
def test_a_seeded_fuzz_of_every_route_finds_no_5xx_and_no_disagreement(make_server):
    if not ST.exists() and shutil.which("st") is None:
        pytest.skip("schemathesis is not installed (make test installs it with the test extras)")
    # No capacity refusal (503) by chance: the fuzzer may submit many interactive runs at once.
    server = make_server(TROUPE_SIMULATED_ACCELERATORS="cuda:0", TROUPE_RUN_INTERACTIVE_MAX_CONCURRENT="1000")
    result = subprocess.run(
        [str(ST if ST.exists() else shutil.which("st")), "run", f"{server.url}/api/openapi.json",
         "-H", f"Authorization: Bearer {server.token}", "--max-examples", "8", "--seed", "1",
         "--checks", "all", "--exclude-checks", "positive_data_acceptance", "--phases", "examples,fuzzing",
         "--no-color"],
        capture_output=True, text=True, timeout=280)
    tail = result.stdout[-4000:]
    assert result.returncode == 0, tail
    assert " passed" in tail and "failures" not in tail.split("SUMMARY")[-1], tail
