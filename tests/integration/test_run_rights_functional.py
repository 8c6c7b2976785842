"""Every route that makes runs asks one rule whether the session may run each node type
of the graph that would execute (troupe/web/run_rights.py): the test walks every operation of
the OpenAPI document that makes runs as a class session with a ``script.Command`` graph
and expects 403 on each. Rerunning, resuming and resuming a study ask it of the stored
graph: the teacher's run and halted study of a command are refused to a class session,
and the command (which appends a line to a marker file each time it runs) never runs
again. A ``POST`` of the document that answers a run, sweep, study or job, or takes a
graph, is on one of the two lists below, so a route added later cannot be missed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import graph, node

pytestmark = pytest.mark.timeout(180)

SCRIPT = r'''
import os, sys
with open(sys.argv[1], "a") as marker:
    marker.write("ran\n")
folder = os.environ["TROUPE_CHECKPOINT_DIR"]
with open(os.path.join(folder, ".c.pt.tmp"), "wb") as out:
    out.write(b"weights")
os.rename(os.path.join(folder, ".c.pt.tmp"), os.path.join(folder, "c-epoch-1.pt"))
'''

# operationId -> what the walk sends there (below); each must answer 403 to a class session.
MAKES_RUNS = ("create_runs", "rerun_runs_run_id", "create_sweeps", "create_studies", "resume_studies_study_id",
              "create_plugins_plugin_id_jobs")
# POSTs that answer a run, sweep or study, or take a graph, but start nothing: why.
STARTS_NOTHING = {
    "cancel_runs_run_id": "ends a run",
    "cancel_sweeps_sweep_id": "ends a sweep's runs",
    "cancel_studies_study_id": "ends a study",
    "create_export": "writes the graph as a script; runs nothing",
    "create_estimates": "estimates the graph's memory; runs nothing",
}
CREATION_REPLIES = {"RunCreated", "SweepCreated", "StudyDetail", "PluginJobRow"}
MADE_IDS = {"run_id", "sweep_id", "study_id"}


def command_graph(lab: Path, marker: Path) -> dict[str, Any]:
    return graph(node("train", "script.Command", argv=["{python}", "job.py", "{marker}"],
                      vars={"marker": str(marker)}, cwd=str(lab)),
                 node("c", "core.Constant", value=1.0), name="command")


def _refs(schema: Any) -> set[str]:
    """Every schema a schema names, however deep."""
    if isinstance(schema, dict):
        own = {schema["$ref"].rsplit("/", 1)[-1]} if "$ref" in schema else set()
        return own.union(*(_refs(v) for v in schema.values()))
    if isinstance(schema, list):
        return set().union(*(_refs(v) for v in schema))
    return set()


def _closure(names: set[str], schemas: dict[str, Any]) -> set[str]:
    seen: set[str] = set()
    while names - seen:
        name = (names - seen).pop()
        seen.add(name)
        names |= _refs(schemas.get(name, {}))
    return seen


def run_making_posts(document: dict[str, Any]) -> dict[str, str]:
    """operationId -> path of each POST that answers a run, sweep, study or job, or takes
    a graph: those that could make runs."""
    schemas = document["components"]["schemas"]
    found = {}
    for path, operations in document["paths"].items():
        op = operations.get("post")
        if op is None:
            continue
        replies = set().union(*(_refs(r) for s, r in op["responses"].items() if s.startswith("2")))
        answers = {key for name in replies for key in schemas.get(name, {}).get("properties", {})}
        takes = _closure(_refs(op.get("requestBody", {})), schemas)
        if replies & CREATION_REPLIES or answers & MADE_IDS or "Graph" in takes:
            found[op["operationId"]] = path
    return found


def test_every_route_that_makes_runs_refuses_a_class_session_a_command(make_server, tmp_path):
    lab, marker = tmp_path / "lab", tmp_path / "marker.txt"
    lab.mkdir()
    (lab / "job.py").write_text(SCRIPT)
    server = make_server(TROUPE_DATA_ROOTS=str(tmp_path))
    posts = run_making_posts(server.get("/api/openapi.json"))
    assert set(posts) <= set(MAKES_RUNS) | set(STARTS_NOTHING), \
        f"a POST that may make runs is on neither list: {sorted(set(posts) - set(MAKES_RUNS) - set(STARTS_NOTHING))}"
    assert set(MAKES_RUNS) <= set(posts), sorted(set(MAKES_RUNS) - set(posts))  # the list is not stale
    command = command_graph(lab, marker)

    # What the teacher may run: a run of the command, a study of it halted after one attempt.
    teachers_run = server.submit(command)["run_id"]
    assert server.wait_status(teachers_run, "succeeded", timeout=60)["status"] == "succeeded"
    study_body = {"name": "study", "base_graph": command, "variants": [{"name": "a"}], "repeats": 3,
                  "objective": {"metric": "loss", "direction": "minimize"}, "budget": {"max_runs": 1}}
    status, study = server.client.request("POST", "/api/studies", study_body)
    assert status == 201, study
    server.poll_until(lambda: server.get(f"/api/studies/{study['id']}")["state"] == "halted", timeout=60)
    assert marker.read_text().splitlines() == ["ran", "ran"]

    sweep = {"base_graph": command, "objective": {"metric": "loss", "direction": "minimize"},
             "sweep_spec": {"method": "grid", "params": [{"node_id": "c", "param": "value", "values": [1, 2]}]}}
    tries: dict[str, list[tuple[str, dict[str, Any], str | None]]] = {  # (path, body, pointer)
        "create_runs": [("/api/runs", {"graph": command}, "/graph/nodes/0/type"),
                        ("/api/runs", {"graph": command, "options": {"lane": "interactive"}}, "/graph/nodes/0/type"),
                        ("/api/runs", {"graph": command, "options": {"editor_session": "ed-1", "lane": "interactive"}},
                         "/graph/nodes/0/type")],
        "rerun_runs_run_id": [(f"/api/runs/{teachers_run}/rerun", {}, ""),
                              (f"/api/runs/{teachers_run}/rerun", {"resume": True}, "")],
        "create_sweeps": [("/api/sweeps", sweep, "/base_graph/nodes/0/type")],
        "create_studies": [("/api/studies", {**study_body, "budget": {}}, "/base_graph/nodes/0/type")],
        "resume_studies_study_id": [(f"/api/studies/{study['id']}/resume", {"budget": {"max_runs": 3}}, "")],
        # A plugin's jobs are the teacher's (a class session may not make one at all).
        "create_plugins_plugin_id_jobs": [("/api/plugins/grader/jobs", {
            "kind": "study", "spec": {**study_body, "budget": {}}, "idempotency_key": "k"}, None)],
    }
    assert set(tries) == set(MAKES_RUNS)
    student = server.session(uses=1)
    for operation, attempts in tries.items():
        for path, body, pointer in attempts:
            status, reply = student.request("POST", path, body)
            assert status == 403, (operation, path, status, reply)
            error = reply["error"]
            if pointer is None:
                assert error["code"] == "not_allowed", (operation, reply)
                continue
            assert error["code"] == "privileged_node" and error["pointer"] == pointer, (operation, reply)
            assert error["node_id"] == "train" and "on the machine that runs it" in error["message"], reply

    # Nothing was made, and the command never ran again.
    runs = server.get("/api/runs?grouped=false&limit=500")["runs"]
    assert len(runs) == 2, [(r["id"], r["name"]) for r in runs]
    halted = server.get(f"/api/studies/{study['id']}")
    assert halted["state"] == "halted" and halted["used"]["runs"] == 1, halted
    assert server.get("/api/sweeps")["sweeps"] == [] and len(server.get("/api/studies")["studies"]) == 1
    assert marker.read_text().splitlines() == ["ran", "ran"]

    # The teacher may: the study resumes and its command runs twice more.
    status, reply = server.client.request("POST", f"/api/studies/{study['id']}/resume", {"budget": {"max_runs": 3}})
    assert status == 200, reply
    server.poll_until(lambda: server.get(f"/api/studies/{study['id']}")["state"] == "finished", timeout=90)
    assert marker.read_text().splitlines() == ["ran"] * 4
