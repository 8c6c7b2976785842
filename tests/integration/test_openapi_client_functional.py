"""The OpenAPI document is what a client nobody here wrote needs (issue 40): every route
of the server is in it, each with an operationId and a tag, and a client generated from
it by openapi-python-client lists runs and reads a sweep, a study, a run's metrics and
the workers as typed objects, through a real server.

openapi-python-client pins an older typer than troupe's CLI wants, so it lives in a
virtual environment of its own, ``.venv-openapi`` (``make test`` makes it)."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap

import pytest

from tests.helpers import REPO, hello
from tests.integration.test_workers_functional import enroll, read_until, start_agent
from web.app import ROUTE_TABLES
from web.openapi import openapi_document

TOOL = REPO / ".venv-openapi" / "bin"


def _documented_form(path: str) -> str:
    """``/api/workers/{name:[^/]+}/drain`` as the document writes it: ``/api/workers/{name}/drain``."""
    return re.sub(r"\{(\w+):[^{}]*(?:\{[^{}]*\}[^{}]*)*\}", r"{\1}", path)


def test_every_route_is_in_the_document_with_an_operation_id_a_tag_and_its_answer():
    document = openapi_document("test")
    routes = {(route.method.lower(), _documented_form(route.path)) for table in ROUTE_TABLES for route in table}
    documented = {(method, path) for path, ops in document["paths"].items() for method in ops}
    assert routes - documented == set()
    for path, ops in document["paths"].items():
        for method, op in ops.items():
            assert op["operationId"] and op["tags"], (method, path)
            if path == "/ws/worker":  # a websocket: it answers 101 and speaks protocol.worker's frames
                assert "101" in op["responses"]
                continue
            answers = [code for code in op["responses"] if code.startswith("2")]
            assert answers and all("content" in op["responses"][code] for code in answers), (method, path)


CLIENT_SCRIPT = textwrap.dedent('''
    import json, sys
    from troupe_client import AuthenticatedClient
    from troupe_client.api.runs import get_runs, get_runs_run_id_metrics
    from troupe_client.api.studies import get_studies_study_id
    from troupe_client.api.sweeps import get_sweeps_sweep_id
    from troupe_client.api.workers import get_workers
    from troupe_client.models import RunList, RunMetrics, StudyDetail, SweepDetail, WorkerList

    url, token, run_id, sweep_id, study_id = sys.argv[1:]
    client = AuthenticatedClient(base_url=url, token=token)
    runs = get_runs.sync(client=client)
    sweep = get_sweeps_sweep_id.sync(sweep_id, client=client)
    study = get_studies_study_id.sync(study_id, client=client)
    metrics = get_runs_run_id_metrics.sync(run_id, client=client)
    workers = get_workers.sync(client=client)
    for value, kind in ((runs, RunList), (sweep, SweepDetail), (study, StudyDetail), (metrics, RunMetrics),
                        (workers, WorkerList)):
        assert isinstance(value, kind), (kind.__name__, value)
    print(json.dumps({
        "runs": [row.id for row in runs.runs],
        "sweep": [variant.objective_value for variant in sweep.variants],
        "study": [attempt.status for attempt in study.attempts],
        "metrics": [point.value for point in metrics.series["val_loss"]],
        "workers": [(worker.name, worker.state) for worker in workers.workers],
    }))
''')


@pytest.mark.timeout(300)
def test_a_generated_client_reads_runs_a_sweep_a_study_metrics_and_workers_as_typed_objects(make_server, tmp_path):
    if not (TOOL / "openapi-python-client").exists():
        pytest.skip("needs openapi-python-client in .venv-openapi (make test makes it)")
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"])
    try:
        read_until(agent, "connected as gpu-a")
        run_id = server.submit(hello())["run_id"]
        server.wait_status(run_id, "succeeded")
        status, sweep = server.client.request("POST", "/api/sweeps", {
            "base_graph": hello(), "objective": {"metric": "val_loss", "direction": "minimize"},
            "sweep_spec": {"method": "grid", "params": [{"node_id": "a", "param": "value", "values": [1, 2]}]}})
        assert status == 201, sweep
        status, study = server.client.request("POST", "/api/studies", {
            "base_graph": hello(), "objective": {"metric": "val_loss", "direction": "minimize"},
            "variants": [{"name": "one", "params": [{"node_id": "a", "param": "value", "value": 1}]}]})
        assert status == 201, study
        for row in server.get("/api/runs?status=queued,running&limit=500")["runs"]:
            server.wait_status(row["id"], "succeeded")
        spec = tmp_path / "openapi.json"
        spec.write_text(json.dumps(server.get("/api/openapi.json")))
        made = subprocess.run([str(TOOL / "openapi-python-client"), "generate", "--path", str(spec), "--meta", "none",
                               "--output-path", str(tmp_path / "troupe_client")], capture_output=True, text=True,
                              timeout=240)
        assert made.returncode == 0, made.stdout + made.stderr
        ran = subprocess.run([str(TOOL / "python"), "-c", CLIENT_SCRIPT, server.url, server.token, run_id,
                              sweep["sweep_id"], study["id"]], capture_output=True, text=True, timeout=60,
                             cwd=tmp_path)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        read = json.loads(ran.stdout)
        assert run_id in read["runs"] and sorted(read["sweep"]) == [4.0, 5.0] and read["metrics"] == [5.0]
        assert read["study"] == ["succeeded"] and read["workers"] == [["gpu-a", "connected"]]
    finally:
        agent.terminate()
        agent.wait(30)
