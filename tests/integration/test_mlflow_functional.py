"""A lab's MLflow script, unchanged, run by ``script.Command`` through the real server and
a real agent with the real MLflow client (``mlflow-skinny``): its metrics are the run's
series with their steps, its params and tags are recorded on the run (the API, ``troupe
show``, the Python client) and its params are keys of ``where`` and ``group_by`` and
columns of the list's values and the client's frame (``params.NAME``), the file it logs
is a stored artifact; on a worker whose link is cut while the script logs, nothing is
lost. A call that is not the run's own (another
run's id, no token) is refused."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import urllib.parse

import apsw
import pytest

import troupe
from tests.faultproxy import FaultProxy
from tests.helpers import graph, node
from tests.integration.test_cli_functional import cli
from tests.integration.test_worker_faults_functional import agent_through, wait_event
from tests.integration.test_workers_functional import worker_state

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mlflow") is None,
                                reason="the MLflow client is not installed (pip install mlflow-skinny: the test extra)")

# Written as a lab writes it for an MLflow server. The gate (a file the test makes) only
# holds it half way, so that the link can be cut while it logs the rest.
SCRIPT = r'''
import os, sys, time
import mlflow

gate = sys.argv[1]
mlflow.log_param("lr", 0.1)
mlflow.set_tag("team", "a")
for step in range(5):
    mlflow.log_metric("loss", 1 / (step + 1), step=step)
if gate != "-":
    deadline = time.monotonic() + 120
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)
for step in range(5, 40):
    mlflow.log_metric("loss", 1 / (step + 1), step=step)
mlflow.log_metrics({"acc": 0.9, "f1": 0.75}, step=39)
mlflow.log_params({"epochs": 40, "optimizer": "adam"})
mlflow.set_tags({"stage": "smoke"})
with open("out.txt", "w") as out:
    out.write("what the script made")
mlflow.log_artifact("out.txt", artifact_path="results")
print("logged", flush=True)
if gate != "-":
    open(gate + ".done", "w").close()
'''
LOSS = [1 / (step + 1) for step in range(40)]
CONTENT = b"what the script made"


def mlflow_graph(gate: str = "-") -> dict:
    return graph(node("train", "script.Command", argv=["{python}", "train.py", "{gate}"], vars={"gate": gate}),
                 name="mlflow")


@pytest.fixture
def script(tmp_path):
    """The script in a folder of its own; the graph runs it there (cwd)."""
    folder = tmp_path / "lab"
    folder.mkdir()
    (folder / "train.py").write_text(SCRIPT)
    return folder


def with_cwd(doc: dict, folder) -> dict:
    doc["nodes"][0]["params"]["cwd"] = str(folder)
    return doc


def check_logged(server, run_id: str) -> dict:
    series = server.get(f"/api/runs/{run_id}/metrics")["series"]
    assert [(p["step"], p["value"]) for p in series["loss"]] == list(enumerate(LOSS))  # each point once, in order
    assert [(p["step"], p["value"]) for p in series["acc"]] == [(39, 0.9)]
    assert [(p["step"], p["value"]) for p in series["f1"]] == [(39, 0.75)]
    run = server.get(f"/api/runs/{run_id}")
    assert run["logged_params"] == {"lr": "0.1", "epochs": "40", "optimizer": "adam"}, run["logged_params"]
    assert run["logged_tags"] == {"team": "a", "stage": "smoke"}, run["logged_tags"]
    assert run["tags"] == []  # the run's own tags are a person's, not the script's
    return run


def stored_file(server, run: dict) -> dict:
    (found,) = [a for a in run["artifacts"] if a["path"] == "mlflow/results/out.txt"]
    return found


def test_an_unchanged_mlflow_script_logs_into_its_run_in_process(make_server, script):
    server = make_server(TROUPE_DATA_ROOTS=str(script.parent))
    run_id = server.submit(with_cwd(mlflow_graph(), script))["run_id"]
    row = server.wait_status(run_id, "succeeded", timeout=90)
    assert row["status"] == "succeeded", row
    run = check_logged(server, run_id)
    artifact = stored_file(server, run)
    assert artifact["kind"] == "mlflow" and artifact["state"] == "stored", artifact
    assert artifact["sha256"] == hashlib.sha256(CONTENT).hexdigest()
    assert server.download(f"/api/runs/{run_id}/artifacts/{artifact['id']}") == CONTENT
    metric = next(e for e in server.get(f"/api/runs/{run_id}/events?tail=1000")["events"] if e["type"] == "metric")
    assert isinstance(metric["payload"]["wall_time"], float)  # the time the script logged it, as MLflow has it

    shown = cli(server, "show", run_id)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "  Logged by the script" in lines, shown.stdout
    for kind, name, value in (("param", "lr", "0.1"), ("param", "optimizer", "adam"), ("tag", "team", "a")):
        assert any(line.split() == [kind, name, value] for line in lines), shown.stdout
    as_json = json.loads(cli(server, "show", run_id, "--json").stdout)
    assert as_json["logged_params"]["epochs"] == "40"

    with troupe.Client(server.url, token=server.token) as client:
        detail = client.get(run_id).detail()
    assert detail.logged_params == {"lr": "0.1", "epochs": "40", "optimizer": "adam"}
    assert detail.logged_tags == {"team": "a", "stage": "smoke"}


def _found(server, where: str) -> list[str]:
    return [r["id"] for r in server.get(f"/api/runs?{urllib.parse.urlencode({'where': where})}")["runs"]]


def test_the_params_a_script_logged_are_keys_to_find_and_group_its_runs(make_server, script):
    """``params.NAME``, as MLflow's filters name a logged param: found as a number where
    it reads as one, or as the text MLflow sent; grouped; searched; listed among the keys;
    and indexed again by the migration of a database that had them before."""
    server = make_server(TROUPE_DATA_ROOTS=str(script.parent))
    run_id = server.submit(with_cwd(mlflow_graph(), script))["run_id"]
    assert server.wait_status(run_id, "succeeded", timeout=90)["status"] == "succeeded"
    other = server.submit(graph(node("a", "core.Constant", value=0.1)))["run_id"]  # a node's param, not logged
    server.wait_status(other, "succeeded")

    def check() -> None:
        for where in ("params.lr = 0.1", "params.lr = '0.1'", "params.lr < 0.5", "params.epochs >= 40",
                      "params.optimizer = 'adam'", "params.optimizer ~ 'ad'", "params.lr in (0.1, 0.2)",
                      "params.lr = 0.1 and metric.loss < 0.1"):
            assert _found(server, where) == [run_id], where
        for where in ("params.lr = 0.2", "params.lr > 0.1", "params.optimizer != 'adam'", "a.value = 0.2"):
            assert _found(server, where) == [], where
        assert _found(server, "a.value = 0.1") == [other]  # the node's param is no logged one
        keys = {k["key"]: k for k in server.get("/api/runs/keys")["keys"]}
        assert (keys["params.lr"]["kind"], keys["params.lr"]["runs"]) == ("logged", 1)
        groups = server.get("/api/runs?group_by=params.optimizer&metric=loss")["groups"]
        assert [(g["value"], g["runs"], g.get("metric", {}).get("runs")) for g in groups] == \
            [("adam", 1, 1), (None, 1, 0)]
        assert [r["id"] for r in server.get("/api/runs?q=adam")["runs"]] == [run_id]
        valued = {row["id"]: row for row in server.get("/api/runs?values=true")["runs"]}
        assert valued[run_id]["logged_params"] == {"lr": "0.1", "epochs": "40", "optimizer": "adam"}
        assert valued[other]["logged_params"] == {} and valued[other]["params"] == {"a.value": 0.1}
        assert "lr" not in valued[run_id]["params"] and "train.vars.gate" in valued[run_id]["params"]  # the graph's
        with troupe.Client(server.url, token=server.token) as client:  # a notebook's frame, as MLflow's
            frame = client.runs_frame(where="params.lr < 0.5")
        assert list(frame["id"]) == [run_id]
        assert (frame["params.lr"][0], frame["params.optimizer"][0]) == ("0.1", "adam")

    check()
    unknown = server.client.request("GET", "/api/runs?where=params.momentum%20%3D%201")
    assert unknown[0] == 400 and unknown[1]["error"]["code"] == "where_unknown_key", unknown
    assert "logged param momentum" in unknown[1]["error"]["message"]
    found = cli(server, "ls", "--where", "params.lr = 0.1", "-q")
    assert found.stdout.split() == [run_id], found.stderr
    grouped = cli(server, "ls", "--group-by", "params.optimizer")
    assert [line.split() for line in grouped.stdout.splitlines()][:2] == [["PARAMS.OPTIMIZER", "RUNS"], ["adam", "1"]]
    keys = cli(server, "ls", "--keys")
    assert any(line.split() == ["params.lr", "logged", "1"] for line in keys.stdout.splitlines()), keys.stdout

    server.stop()  # a database from before params.NAME: the index holds no logged param
    conn = apsw.Connection(str(server.home / "troupe.db"))
    conn.execute("DELETE FROM run_params WHERE key IN (SELECT id FROM index_keys WHERE kind = 'logged')")
    conn.execute("DELETE FROM index_keys WHERE kind = 'logged'")
    conn.execute("PRAGMA user_version = 29")
    conn.close()
    server = make_server(server.home, TROUPE_DATA_ROOTS=str(script.parent))
    check()


def test_a_worker_runs_it_with_its_link_cut_while_it_logs_and_nothing_is_lost(make_server, script, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1", TROUPE_WORKER_RESUME_GRACE_S="90")
    proxy = FaultProxy(int(server.url.rsplit(":", 1)[1])).start()
    agent = agent_through(server, proxy, tmp_path, TROUPE_DATA_ROOTS=str(script.parent))
    gate = script / "gate"
    try:
        run_id = server.submit(with_cwd(mlflow_graph(str(gate)), script), target={"worker": "gpu-a"})["run_id"]
        wait_event(server, run_id, "metric")  # it logs, through the link
        proxy.cut()
        server.wait_status(run_id, "disconnected", timeout=60)
        gate.touch()  # the rest is logged while the control plane cannot be reached
        server.poll_until(lambda: (script / "gate.done").exists(), timeout=90)
        assert worker_state(server, "gpu-a")["state"] == "disconnected"
        proxy.restore()
        row = server.wait_status(run_id, "succeeded", timeout=90)
        assert row["status"] == "succeeded", row
        run = check_logged(server, run_id)
        events = server.get(f"/api/runs/{run_id}/events?tail=1000")["events"]
        assert [e["seq"] for e in events] == list(range(events[0]["seq"], events[0]["seq"] + len(events)))
        server.poll_until(lambda: stored_file(server, server.get(f"/api/runs/{run_id}"))["state"] == "stored",
                          timeout=60)  # sent from the agent's outbox once the link was back
        artifact = stored_file(server, server.get(f"/api/runs/{run_id}"))
        assert artifact["sha256"] == hashlib.sha256(CONTENT).hexdigest()
        assert server.download(f"/api/runs/{run_id}/artifacts/{artifact['id']}") == CONTENT
        assert run["worker"] == "gpu-a"
    finally:
        agent.terminate()
        agent.wait(30)
        proxy.close()


REFUSED = r'''
import json, os, urllib.request

def call(path, body, token):
    request = urllib.request.Request(os.environ["MLFLOW_TRACKING_URI"] + "/api/2.0/mlflow/" + path,
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)

run, token = os.environ["MLFLOW_RUN_ID"], os.environ["MLFLOW_TRACKING_TOKEN"]
found = {
    "no_token": call("runs/log-parameter", {"run_id": run, "key": "x", "value": "1"}, "wrong"),
    "other_run": call("runs/log-parameter", {"run_id": "f" * 32, "key": "x", "value": "1"}, token),
    "new_run": call("runs/create", {"experiment_id": "0"}, token),
    "first": call("runs/log-parameter", {"run_id": run, "key": "lr", "value": "0.1"}, token),
    "changed": call("runs/log-parameter", {"run_id": run, "key": "lr", "value": "0.2"}, token),
    "negative_step": call("runs/log-metric", {"run_id": run, "key": "loss", "value": 1, "timestamp": 0, "step": -1},
                          token),
}
print(json.dumps({k: [status, body.get("error_code")] for k, (status, body) in found.items()}), flush=True)
'''


def test_calls_that_are_not_the_runs_own_are_refused_as_mlflow_refuses_them(make_server, script):
    (script / "refused.py").write_text(REFUSED)
    server = make_server(TROUPE_DATA_ROOTS=str(script.parent))
    doc = graph(node("probe", "script.Command", argv=["{python}", "refused.py"], cwd=str(script)), name="refused")
    run_id = server.submit(doc)["run_id"]
    assert server.wait_status(run_id, "succeeded", timeout=60)["status"] == "succeeded"
    events = server.get(f"/api/runs/{run_id}/events?tail=1000")["events"]
    printed = "".join(e["payload"].get("text", "") for e in events if e["type"] == "console")
    found = json.loads(next(line for line in printed.splitlines() if line.startswith("{")))
    assert found == {"no_token": [401, "UNAUTHENTICATED"], "other_run": [404, "RESOURCE_DOES_NOT_EXIST"],
                     "new_run": [404, "ENDPOINT_NOT_FOUND"], "first": [200, None],
                     "changed": [400, "INVALID_PARAMETER_VALUE"], "negative_step": [200, None]}, found
    run = server.get(f"/api/runs/{run_id}")
    assert run["logged_params"] == {"lr": "0.1"}  # the first value stays, as in MLflow
    codes = [e["payload"].get("code") for e in events if e["type"] == "warning"]
    assert codes.count("mlflow_not_recorded") == 2, codes  # runs/create, and the point no series holds
    assert "loss" not in server.get(f"/api/runs/{run_id}/metrics")["series"]
