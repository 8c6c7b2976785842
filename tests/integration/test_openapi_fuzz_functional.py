"""A bounded, seeded schemathesis run over the whole OpenAPI document of a real server:
no request it generates gets a 5xx, server and schema agree, and every answer declares
every field it has. Schemathesis's own ``positive_data_acceptance`` is replaced by
``valid_requests_are_answered`` (tests/schemathesis_hooks.py): a request the document calls
valid may still be answered 401, 404 or 409, or refused for what it means against the
catalog (an edge to a node that does not exist), which no schema can say; any other 4xx is
a disagreement. Its ``not_a_server_error`` by ``no_unplanned_server_error``: the 503s the
document states (not now: a busy lane, an offline worker) are answers, any other 5xx a
defect. Every answer is checked against the document's schema for it (response
conformance), with the schemas only answers use closed: a field the server sends that
the document does not name fails it. So that the answers are full ones, the server holds
one of everything first (runs with metrics, an artifact and recorded outputs, a worker's
run, a sweep, a study, a plugin job, an upload, a session, an editor's cache), and valid
requests name them. The worker's websocket is not HTTP and is left out."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import graph, hello, node
from tests.integration.test_uploads_functional import upload
from tests.integration.test_workers_functional import enroll, read_until, start_agent

ST = Path(sys.executable).with_name("st")
_OBJECTIVE = {"metric": "val_loss", "direction": "minimize"}
# A script that leaves a checkpoint: the run gets an artifact, and prints a line.
_CHECKPOINT = "import os; open(os.environ['TROUPE_CHECKPOINT_DIR'] + '/c.pt', 'w').write('x'); print('saved')"


def one_of_everything(server: Any, tmp_path: Path) -> tuple[dict[str, list[str]], Any]:
    """Makes what the answers describe and returns its ids (by path parameter, or
    ``PATH:NAME`` where a path needs one thing in particular) and the worker's agent."""
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"])
    read_until(agent, "connected as gpu-a")
    client = server.client
    made = [server.submit(hello())["run_id"],
            server.submit(graph(node("s", "script.Command", argv=["{python}", "-c", _CHECKPOINT])),
                          record_outputs=True)["run_id"],
            server.submit(hello(), target={"worker": "gpu-a"})["run_id"],
            server.submit(hello(), lane="interactive", editor_session="e0")["run_id"]]
    status, sweep = client.request("POST", "/api/sweeps", {
        "base_graph": hello(), "objective": _OBJECTIVE,
        "sweep_spec": {"method": "grid", "params": [{"node_id": "a", "param": "value", "values": [1, 2]}]}})
    assert status == 201, sweep
    study = {"base_graph": hello(), "objective": _OBJECTIVE,
             "variants": [{"name": "one", "params": [{"node_id": "a", "param": "value", "value": 1}]}]}
    status, made_study = client.request("POST", "/api/studies", study)
    assert status == 201, made_study
    status, job = client.request("POST", "/api/plugins/grader/jobs", {"kind": "study", "spec": study,
                                                                       "idempotency_key": "k"})
    assert status == 201, job
    for row in server.get("/api/runs?status=queued,running&limit=500")["runs"]:
        server.wait_status(row["id"], "succeeded")
    status, stored = upload(server, b"a,b\n1,2\n")
    assert status == 201, stored
    session = server.session(uses=2)
    status, named = session.request("PUT", "/api/sessions/me", {"name": "fuzz"})
    assert status == 200, named
    artifacts = server.get(f"/api/runs/{made[1]}")["artifacts"]
    return {
        "run_id": made, "sweep_id": [sweep["sweep_id"]], "study_id": [made_study["id"]], "plugin_id": ["grader"],
        "job_id": [job["id"]], "file_id": [stored["file_id"]], "session": ["e0"], "device": ["cuda:0"],
        "/api/runs/{run_id}/artifacts/{artifact_id}:run_id": [made[1]],
        "/api/runs/{run_id}/artifacts/{artifact_id}:artifact_id": [str(a["id"]) for a in artifacts],
        "/api/runs/{run_id}/outputs/{node_id}:run_id": [made[1]], "node_id": ["s"],
        "/api/flavors/{name}:name": ["gpu-small"], "/api/workers/{name}/drain:name": ["gpu-a"],
        "/api/workers/{name}/devices/{device}:name": ["gpu-a"],
    }, agent


@pytest.mark.timeout(400)
def test_a_seeded_fuzz_of_every_route_finds_no_5xx_no_disagreement_and_no_undeclared_field(make_server, tmp_path):
    if not ST.exists() and shutil.which("st") is None:
        pytest.skip("schemathesis is not installed (make test installs it with the test extras)")
    # No capacity refusal (503) by chance: the fuzzer may submit many interactive runs at once.
    server = make_server(TROUPE_SIMULATED_ACCELERATORS="cuda:0", TROUPE_RUN_INTERACTIVE_MAX_CONCURRENT="1000",
                         TROUPE_WORKER_HEARTBEAT_S="1")
    ids, agent = one_of_everything(server, tmp_path)
    try:
        result = subprocess.run(
            [str(ST if ST.exists() else shutil.which("st")), "run", f"{server.url}/api/openapi.json",
             "-H", f"Authorization: Bearer {server.token}", "--max-examples", "12", "--seed", "1",
             "--checks", "all", "--exclude-checks", "positive_data_acceptance,not_a_server_error",
             "--exclude-path", "/ws/worker", "--phases", "examples,fuzzing",
             "--no-color"],
            capture_output=True, text=True, timeout=360, cwd=Path(__file__).resolve().parents[2],
            env={**os.environ, "SCHEMATHESIS_HOOKS": "tests.schemathesis_hooks",
                 "TROUPE_FUZZ_TALLY": str(tmp_path / "tally"), "TROUPE_FUZZ_IDS": json.dumps(ids)})
    finally:
        agent.terminate()
        agent.wait(30)
    tail = result.stdout[-30000:]  # the failing operation is named far above the summary
    assert result.returncode == 0, tail
    assert "failures" not in tail.split("SUMMARY")[-1], tail
    statuses = (tmp_path / "tally").read_text().split()
    assert len(statuses) > 100 and "400" in statuses and "201" in statuses  # the check saw refusals and successes
