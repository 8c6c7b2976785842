"""``script.Command`` through the real server, a real agent and the CLI: a lab's script
runs as a node in-process and on a worker, what it prints is its console (stdout and
stderr told apart), its metric lines are points, the file it renames into
TROUPE_CHECKPOINT_DIR is a stored checkpoint, its last result line feeds the next node;
a non-zero exit fails the run with stderr's tail; cancel leaves no process of its group;
a placeholder with no value is a 400; a class session is refused it; a sweep and --set
address its vars."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from tests.helpers import edge, graph, node
from tests.integration.test_cli_functional import cli
from tests.integration.test_workers_functional import enroll, read_until, start_agent

SCRIPT = r'''
import json, os, subprocess, sys, time
mode, lr = sys.argv[1], float(sys.argv[2])
for step in range(1, 4):
    print(json.dumps({"metric": "loss", "value": lr * step, "step": step}), flush=True)
    print(f"warming {step}", file=sys.stderr, flush=True)
print(json.dumps({"progress": 3, "total": 3}), flush=True)
folder = os.environ["TROUPE_CHECKPOINT_DIR"]
with open(os.path.join(folder, ".c.pt.tmp"), "wb") as out:
    out.write(b"weights")
os.rename(os.path.join(folder, ".c.pt.tmp"), os.path.join(folder, "c.pt"))
if mode == "fail":
    print("it broke", file=sys.stderr, flush=True)
    sys.exit(3)
if mode == "hang":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(json.dumps({"pids": [os.getpid(), child.pid]}), flush=True)
    time.sleep(600)
print(json.dumps({"result": lr}), flush=True)
'''


def command_graph(folder, mode: str = "ok", lr: float = 0.5) -> dict:
    return graph(node("train", "script.Command", argv=["{python}", "job.py", "{mode}", "{lr}"],
                      vars={"mode": mode, "lr": lr}, cwd=str(folder)),
                 node("final", "core.LogMetric", name="final"),
                 edges=(edge("train", "result", "final", "value"),), name="command")


@pytest.fixture
def lab(tmp_path):
    folder = tmp_path / "lab"
    folder.mkdir()
    (folder / "job.py").write_text(SCRIPT)
    return folder


def _series(server, run_id: str, name: str) -> list[float]:
    return [p["value"] for p in server.get(f"/api/runs/{run_id}/metrics")["series"][name]]


def _check_succeeded(server, run_id: str, lr: float = 0.5) -> None:
    assert _series(server, run_id, "loss") == [lr, lr * 2, lr * 3]
    assert _series(server, run_id, "final") == [lr]  # the result line fed the next node
    events = server.get(f"/api/runs/{run_id}/events?tail=1000")["events"]
    streams = {(e["payload"].get("stream"), line) for e in events if e["type"] == "console"
               for line in e["payload"].get("text", "").splitlines()}
    assert ("stderr", "warming 2") in streams and ("stdout", json.dumps({"result": lr})) in streams, streams
    (checkpoint,) = [a for a in server.get(f"/api/runs/{run_id}")["artifacts"] if a["path"].endswith("c.pt")]
    assert checkpoint["state"] == "stored" and checkpoint["sha256"] == hashlib.sha256(b"weights").hexdigest()


def test_a_script_runs_in_process_with_its_console_metrics_checkpoint_and_result(make_server, lab):
    server = make_server(TROUPE_DATA_ROOTS=str(lab.parent))
    run_id = server.submit(command_graph(lab))["run_id"]
    assert server.wait_status(run_id, "succeeded", timeout=60)["status"] == "succeeded"
    _check_succeeded(server, run_id)
    failed = server.submit(command_graph(lab, mode="fail"))["run_id"]
    row = server.wait_status(failed, "failed", timeout=60)
    assert "exited with status 3" in row["error"] and "it broke" in row["error"], row["error"]


def test_cancel_leaves_no_process_of_the_scripts_group(make_server, lab):
    server = make_server(TROUPE_DATA_ROOTS=str(lab.parent))
    run_id = server.submit(command_graph(lab, mode="hang"))["run_id"]
    pids: list[int] = []

    def said_pids() -> bool:
        for e in server.get(f"/api/runs/{run_id}/events?tail=200")["events"]:
            for line in e["payload"].get("text", "").splitlines() if e["type"] == "console" else ():
                if line.startswith('{"pids"'):
                    pids.extend(json.loads(line)["pids"])
                    return True
        return False

    server.poll_until(said_pids, timeout=60)
    assert all(_alive(pid) for pid in pids), pids
    assert server.client.request("POST", f"/api/runs/{run_id}/cancel")[0] == 200
    server.wait_status(run_id, "cancelled", timeout=60)
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids), pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    # A zombie (a child the script left, now init's) waits to be read: it runs nothing.
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_placeholder_without_a_value_is_refused_and_a_class_session_is_refused_the_node(make_server, lab):
    server = make_server(TROUPE_DATA_ROOTS=str(lab.parent))
    doc = command_graph(lab)
    doc["nodes"][0]["params"]["argv"] = ["{python}", "job.py", "{mode}", "{rate}"]
    error = server.submit(doc, expect=400)["error"]
    assert error["pointer"] == "/graph/nodes/0/params/argv/3" and "{rate}" in error["message"], error
    doc["nodes"][0]["params"]["argv"] = ["{python}", "job.py", "{{'a': 1}"]  # a lone brace: said how to write one
    error = server.submit(doc, expect=400)["error"]
    assert error["pointer"] == "/graph/nodes/0/params/argv/2" and "is written {{ or }}" in error["message"], error
    status, reply = server.session(uses=1).request("POST", "/api/runs", {"graph": command_graph(lab)})
    assert status == 403 and reply["error"]["code"] == "privileged_node", reply


def test_a_script_runs_on_a_worker_too(make_server, lab, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"], TROUPE_DATA_ROOTS=str(lab.parent))
    try:
        read_until(agent, "connected as gpu-a")
        run_id = server.submit(command_graph(lab), target={"worker": "gpu-a"})["run_id"]
        assert server.wait_status(run_id, "succeeded", timeout=90)["status"] == "succeeded"
        _check_succeeded(server, run_id)
    finally:
        agent.terminate()
        agent.wait(30)


def test_a_sweep_and_set_address_the_scripts_vars(make_server, lab, tmp_path):
    server = make_server(TROUPE_DATA_ROOTS=str(lab.parent))
    spec = {"name": "lr", "base_graph": command_graph(lab),
            "sweep_spec": {"method": "grid", "params": [{"node_id": "train", "param": "vars.lr",
                                                         "values": [0.2, 0.1]}]},
            "objective": {"metric": "final", "direction": "minimize"}}
    status, made = server.client.request("POST", "/api/sweeps", spec)
    assert status == 201, made
    runs = server.get(f"/api/runs?sweep_id={made['sweep_id']}")["runs"]
    for run in runs:
        server.wait_status(run["id"], "succeeded", timeout=60)
    result = server.get(f"/api/sweeps/{made['sweep_id']}")
    assert [(v["rank"], v["objective_value"]) for v in result["variants"]] == [(1, 0.1), (2, 0.2)], result
    assert result["best"]["params"] == {"train.vars.lr": 0.1}
    path = tmp_path / "command.json"
    path.write_text(json.dumps(command_graph(lab)))
    ran = cli(server, "run", str(path), "--set", "train.vars.lr=0.25")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    run_id = ran.stdout.split("Run ID")[1].split()[0]
    assert _series(server, run_id, "final") == [0.25]
    bad = cli(server, "run", str(path), "--set", "train.nothing.lr=1")
    assert bad.returncode == 2


def test_the_example_training_script_runs_from_a_label(make_server):
    from tests.helpers import EXAMPLES

    server = make_server(TROUPE_MOUNT_PATH=str(EXAMPLES))  # label data: the examples folder
    doc = json.loads((EXAMPLES / "scripts" / "train_digits.json").read_text())
    doc["nodes"][0]["params"]["vars"]["epochs"] = 2
    run_id = server.submit(doc, seed=3)["run_id"]
    assert server.wait_status(run_id, "succeeded", timeout=120)["status"] == "succeeded"
    assert len(_series(server, run_id, "val_loss")) == 2
    assert _series(server, run_id, "progress") == [0.5, 1.0]
    paths = sorted(a["path"] for a in server.get(f"/api/runs/{run_id}")["artifacts"])
    assert paths == ["checkpoints/epoch-1.pt", "checkpoints/epoch-2.pt"], paths


@pytest.mark.timeout(240)
def test_a_seeded_script_cancelled_and_resumed_ends_as_one_never_stopped(make_server):
    from tests.helpers import EXAMPLES

    server = make_server(TROUPE_MOUNT_PATH=str(EXAMPLES))
    doc = json.loads((EXAMPLES / "scripts" / "train_digits.json").read_text())
    doc["nodes"][0]["params"]["vars"]["epochs"] = 12
    doc["nodes"][0]["params"]["argv"] += ["--pause", "{pause}"]
    doc["nodes"][0]["params"]["vars"]["pause"] = 0.2  # time to cancel it half way
    straight = server.submit(doc, seed=5)["run_id"]
    assert server.wait_status(straight, "succeeded", timeout=120)["status"] == "succeeded"
    stopped = server.submit(doc, seed=5)["run_id"]
    for kind, data in server.client.stream(f"/api/runs/{stopped}/stream", read_timeout=120):
        if kind == "run_event" and data["type"] == "artifact" and data["payload"]["path"].endswith("epoch-3.pt"):
            server.client.request("POST", f"/api/runs/{stopped}/cancel")
        if kind == "run_event" and data["type"] == "run_finished":
            break
    assert server.get(f"/api/runs/{stopped}")["status"] == "cancelled"
    resumed = cli(server, "rerun", stopped, "--resume", timeout=120)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    run_id = resumed.stdout.split("Run ID")[1].split()[0]
    epoch = server.get(f"/api/runs/{run_id}")["resumed_from"]["epoch"]
    assert 3 <= epoch < 12
    ended = [p["step"] for p in server.get(f"/api/runs/{run_id}/metrics")["series"]["val_loss"]]
    assert ended == list(range(epoch + 1, 13))
    assert _series(server, run_id, "val_loss") == _series(server, straight, "val_loss")[epoch:]
    assert _series(server, run_id, "train_loss") == _series(server, straight, "train_loss")[epoch:]
    # Read as one training: the stopped run's points up to the checkpoint, then the resumed run's.
    chain = server.get(f"/api/runs/{run_id}/metrics?lineage=true")
    assert [p["value"] for p in chain["series"]["val_loss"]] == _series(server, straight, "val_loss")
    assert [p["run_id"] for p in chain["series"]["val_loss"]] == [stopped] * epoch + [run_id] * (12 - epoch)
    assert chain["resumed"] == [{"run_id": run_id, "from_step": epoch + 1}]
    shown = cli(server, "show", run_id[:8])
    assert "Metrics, with the runs it resumes" in shown.stdout and f"{stopped} from epoch {epoch}" in shown.stdout


def test_a_script_may_call_the_public_helper_instead_of_printing_json(make_server, lab):
    (lab / "helped.py").write_text("import troupe\nfor step in (1, 2):\n    troupe.metric('loss', step / 4, step)\n"
                                   "troupe.progress(2, 2)\ntroupe.result(0.75)\n")
    server = make_server(TROUPE_DATA_ROOTS=str(lab.parent))
    doc = command_graph(lab)
    doc["nodes"][0]["params"].update(argv=["{python}", "helped.py"], vars={})
    run_id = server.submit(doc)["run_id"]
    assert server.wait_status(run_id, "succeeded", timeout=60)["status"] == "succeeded"
    assert _series(server, run_id, "loss") == [0.25, 0.5] and _series(server, run_id, "final") == [0.75]


ODD = r'''
import json
for line in ('{"metric": "x", "value": 1, "step": 1e400}',  # a step past any integer
             '{"metric": "x", "value": 1%s}' % ("0" * 400),  # a value past any float
             '{"progress": 1e400, "total": 1}',
             '{"progress": 1, "total": 1%s}' % ("0" * 400),
             '{"metric": "\\ud800", "value": 1}',  # a name that is not text
             '{"result": %s}' % ("[" * 5000 + "]" * 5000)):  # past what a JSON reader takes
    print(line, flush=True)
for step in range(1, 3001):  # more than a pipe holds: only a reader that goes on lets it end
    print(json.dumps({"metric": "loss", "value": step / 4, "step": step}))
print(json.dumps({"result": json.loads("[" * 700 + "1" + "]" * 700)}))  # deep, and readable
'''


def test_lines_no_point_can_hold_are_warnings_and_the_scripts_output_keeps_being_read(make_server, lab):
    (lab / "odd.py").write_text(ODD)
    server = make_server(TROUPE_DATA_ROOTS=str(lab.parent))
    doc = graph(node("train", "script.Command", argv=["{python}", "odd.py"], cwd=str(lab)), name="odd")
    run_id = server.submit(doc)["run_id"]
    row = server.wait_status(run_id, "succeeded", timeout=60)
    assert row["status"] == "succeeded", row.get("error")
    assert len(_series(server, run_id, "loss")) == 3000
    events = server.get(f"/api/runs/{run_id}/events?tail=100000")["events"]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))  # no batch of them lost
    warnings = [e["payload"] for e in events if e["type"] == "warning"]
    assert [w["code"] for w in warnings] == ["line_not_read"] * 4 + ["event_rejected"], warnings
