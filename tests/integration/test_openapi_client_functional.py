"""The OpenAPI document is what a client nobody here wrote needs (issues 40 and 63): every
route of the server is in it, each with an operationId and a tag; openapi-spec-validator
takes the document a server serves; and openapi-python-client generates every operation
from it without a warning, and the client it makes starts a sweep, a study, a plugin job
and a login link, reads runs, a sweep's and a study's ranking, a run's metrics (as JSON
and as CSV text) and the workers as typed objects, through a real server. The streams are
under ``x-streams``, never a call a generated client would make and wait on for ever.

openapi-python-client pins an older typer than troupe's CLI wants, so it lives in a
virtual environment of its own, ``.venv-openapi`` (``make test`` makes it)."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap

import pytest
from openapi_spec_validator import validate

from tests.helpers import REPO, hello
from tests.integration.test_workers_functional import enroll, read_until, start_agent
from troupe.web import streams
from troupe.web.app import ROUTE_TABLES
from troupe.web.openapi import openapi_document

TOOL = REPO / ".venv-openapi" / "bin"


def _documented_form(path: str) -> str:
    """``/api/workers/{name:[^/]+}/drain`` as the document writes it: ``/api/workers/{name}/drain``."""
    return re.sub(r"\{(\w+):[^{}]*(?:\{[^{}]*\}[^{}]*)*\}", r"{\1}", path)


def _routes(tables) -> set[tuple[str, str]]:
    return {(route.method.lower(), _documented_form(route.path)) for table in tables for route in table}


def test_every_route_is_in_the_document_with_an_operation_id_a_tag_and_its_answer():
    document = openapi_document("test")
    documented = {(method, path) for path, ops in document["paths"].items() for method in ops}
    in_streams = {(method, path) for path, ops in document["x-streams"].items() for method in ops}
    assert _routes(ROUTE_TABLES) - documented - in_streams == set()
    # A stream is under x-streams (3.2's form: text/event-stream, one event per item), never
    # an operation a 3.1 client would call and read to an end it does not have.
    assert in_streams == _routes([streams.routes]) and not in_streams & documented
    for path, ops in document["x-streams"].items():
        assert ops["get"]["operationId"] and "itemSchema" in ops["get"]["responses"]["200"]["content"][
            "text/event-stream"], path
    for path, ops in document["paths"].items():
        for method, op in ops.items():
            assert op["operationId"] and op["tags"], (method, path)
            if path == "/ws/worker":  # a websocket: it answers 101 and speaks troupe.protocol.worker's frames
                assert "101" in op["responses"]
                continue
            answers = [code for code in op["responses"] if code.startswith("2")]
            assert answers and all("content" in op["responses"][code] for code in answers), (method, path)
            # One media type an answer (a file's may be named as bytes too): a generated call
            # reads JSON as JSON and a table as text.
            kinds = {kind for code in answers for kind in op["responses"][code]["content"]}
            assert len(kinds - {"application/octet-stream"}) <= 1 and kinds, (method, path, kinds)
            assert not ("text/csv" in kinds and "application/json" in kinds), (method, path, kinds)


def test_the_served_document_passes_openapi_spec_validator(make_server):
    server = make_server(TROUPE_MAX_SWEEP_RUNS="12", TROUPE_MAX_SWEEP_PARAMS="3", TROUPE_MAX_SWEEP_DOMAIN="9")
    document = json.loads(json.dumps(server.get("/api/openapi.json")))
    validate(document)  # raises, naming the first problem, where the document is not valid OpenAPI 3.1
    assert document["components"]["schemas"]["SweepSpec"]["properties"]["params"]["maxItems"] == 3


SUBMIT_SCRIPT = textwrap.dedent('''
    import json, sys
    from troupe_client import AuthenticatedClient
    from troupe_client.api.login import create_login_links
    from troupe_client.api.studies import create_plugins_plugin_id_jobs, create_studies
    from troupe_client.api.sweeps import create_sweeps
    from troupe_client.models import (Graph, LoginLinkCreated, NewLoginLink, Objective, ObjectiveDirection,
                                      PluginJob, PluginJobRow, StudyDetail, SubmitStudy, SubmitSweep, SweepCreated,
                                      SweepParam, SweepSpec, SweepSpecMethod)

    url, token, graph = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    client = AuthenticatedClient(base_url=url, token=token)
    objective = Objective(metric="val_loss", direction=ObjectiveDirection.MINIMIZE)
    swept = SweepSpec(method=SweepSpecMethod.GRID, params=[SweepParam(node_id="a", param="value", values=[1, 2])])
    sweep = create_sweeps.sync(client=client, body=SubmitSweep(base_graph=Graph.from_dict(graph), objective=objective,
                                                               sweep_spec=swept))
    study = {"base_graph": graph, "objective": {"metric": "val_loss", "direction": "minimize"},
             "variants": [{"name": name, "params": [{"node_id": "a", "param": "value", "value": value}]}
                          for name, value in (("one", 1), ("two", 2))]}
    made = create_studies.sync(client=client, body=SubmitStudy.from_dict(study))
    job = create_plugins_plugin_id_jobs.sync("grader", client=client, body=PluginJob.from_dict(
        {"kind": "study", "spec": study, "idempotency_key": "nightly"}))
    link = create_login_links.sync(client=client, body=NewLoginLink(uses=2))
    for value, kind in ((sweep, SweepCreated), (made, StudyDetail), (job, PluginJobRow), (link, LoginLinkCreated)):
        assert isinstance(value, kind), (kind.__name__, value)
    print(json.dumps({"sweep": sweep.sweep_id, "study": made.id, "job": job.study_id, "link": [link.kind, link.uses]}))
''')

READ_SCRIPT = textwrap.dedent('''
    import json, sys
    from troupe_client import AuthenticatedClient
    from troupe_client.api.runs import get_runs, get_runs_run_id_metrics, get_runs_run_id_metrics_csv
    from troupe_client.api.studies import get_studies_study_id, get_studies_study_id_ranking_csv
    from troupe_client.api.sweeps import get_sweeps_sweep_id, get_sweeps_sweep_id_ranking_csv
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
    tables = [get_runs_run_id_metrics_csv.sync(run_id, client=client),
              get_sweeps_sweep_id_ranking_csv.sync(sweep_id, client=client),
              get_studies_study_id_ranking_csv.sync(study_id, client=client)]
    assert all(isinstance(table, str) for table in tables), tables
    print(json.dumps({
        "runs": [row.id for row in runs.runs],
        "sweep": [(v.rank, v.params["a.value"], v.objective_value) for v in sweep.variants],
        "best": [sweep.best.run_id, sweep.best.objective_value],
        "study": [(entry.variant, entry.rank, entry.objective_value) for entry in study.ranking],
        "metrics": [point.value for point in metrics.series["val_loss"]],
        "workers": [(worker.name, worker.state, worker.devices) for worker in workers.workers],
        "tables": [table.splitlines()[0] for table in tables],
    }))
''')


def _generated(tmp_path, server) -> None:
    """A client generated from the served document into ``tmp_path/troupe_client``, with
    nothing left out: openapi-python-client says nothing beyond that it generates (its
    post-hooks, ruff, are off: that tool is not this test's to have)."""
    spec = tmp_path / "openapi.json"
    spec.write_text(json.dumps(server.get("/api/openapi.json")))
    config = tmp_path / "generator.yaml"
    config.write_text("post_hooks: []\n")
    made = subprocess.run([str(TOOL / "openapi-python-client"), "generate", "--path", str(spec), "--meta", "none",
                           "--config", str(config), "--output-path", str(tmp_path / "troupe_client")],
                          capture_output=True, text=True, timeout=240)
    said = made.stdout + made.stderr
    assert made.returncode == 0, said
    assert "warning" not in said.lower() and "unable" not in said.lower(), said
    api = tmp_path / "troupe_client" / "api"
    assert not (api / "runs" / "get_runs_run_id_stream.py").exists() and not (api / "runs" / "get_stream.py").exists()


def _client(tmp_path, script: str, *args: str) -> dict:
    ran = subprocess.run([str(TOOL / "python"), "-c", script, *args], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return json.loads(ran.stdout)


@pytest.mark.timeout(300)
def test_a_generated_client_starts_a_sweep_and_a_study_and_reads_their_ranking_as_typed_objects(make_server,
                                                                                                  tmp_path):
    if not (TOOL / "openapi-python-client").exists():
        pytest.skip("needs openapi-python-client in .venv-openapi (make test makes it)")
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"])
    try:
        read_until(agent, "connected as gpu-a")
        run_id = server.submit(hello())["run_id"]
        server.wait_status(run_id, "succeeded")
        _generated(tmp_path, server)
        made = _client(tmp_path, SUBMIT_SCRIPT, server.url, server.token, json.dumps(hello()))
        assert made["link"] == ["class", 2]
        for row in server.get("/api/runs?status=queued,running&limit=500")["runs"]:
            server.wait_status(row["id"], "succeeded")
        assert server.get(f"/api/studies/{made['job']}")["state"] == "finished"
        read = _client(tmp_path, READ_SCRIPT, server.url, server.token, run_id, made["sweep"], made["study"])
        assert run_id in read["runs"] and read["metrics"] == [5.0]
        assert read["sweep"] == [[1, 1.0, 4.0], [2, 2.0, 5.0]] and read["best"][1] == 4.0
        assert read["study"] == [["one", 1, 4.0], ["two", 2, 5.0]]
        assert read["workers"] == [["gpu-a", "connected", ["cpu", "cuda:0"]]]
        assert read["tables"] == ["series,step,value,ts", "index,rank,status,objective_value,a.value,run_id",
                                  "variant,rank,objective_value,std,repeats,unranked_reason,a.value"]
    finally:
        agent.terminate()
        agent.wait(30)
