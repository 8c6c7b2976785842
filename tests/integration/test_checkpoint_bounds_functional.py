"""Checkpoints in bounds (issue 65, section 4), through the real server, a real agent and
the CLI: a script that saves each epoch with ``keep_checkpoints: 2`` keeps two files in
its run's folder, in the worker's outbox and on the server (or in the S3 bucket), the
others let go (their rows say removed, their bytes 404), and a resume still goes on
from the newest;
``keep_best`` keeps the best by its series beside them; a TrainingLoop keeps its newest
weights and training state and resumes from them; ``show`` says it in one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.faultproxy import FaultProxy
from tests.helpers import graph, node
from tests.integration.test_artifact_outbox_functional import _kept
from tests.integration.test_cli_functional import cli
from tests.integration.test_rerun_resume_functional import _cancel_after_epoch
from tests.integration.test_training_functional import quick_digits
from tests.integration.test_worker_faults_functional import agent_through, wait_event
from tests.integration.test_workers_functional import enroll, read_until, start_agent, worker_state
from tests.s3_server import client, s3_server

# Five epochs, val_loss best at the second; then it waits until its checkpoint folder
# holds as many files as it was told to expect, says which, and exits as told.
SCRIPT = r'''
import json, os, sys, time
folder = os.environ["TROUPE_CHECKPOINT_DIR"]
resume = os.environ.get("TROUPE_RESUME_FROM")
if resume:
    print(json.dumps({"result": os.path.basename(resume) + ": " + open(resume).read()}), flush=True)
    sys.exit(0)
for epoch, loss in enumerate([0.9, 0.2, 0.5, 0.6, 0.7], 1):
    print(json.dumps({"metric": "val_loss", "value": loss, "step": epoch}), flush=True)
    with open(os.path.join(folder, f".epoch-{epoch}.pt.tmp"), "w") as out:
        out.write(f"weights of epoch {epoch}")
    os.rename(os.path.join(folder, f".epoch-{epoch}.pt.tmp"), os.path.join(folder, f"epoch-{epoch}.pt"))
    time.sleep(0.3)
deadline = time.time() + 60
while len(os.listdir(folder)) > int(sys.argv[1]) and time.time() < deadline:
    time.sleep(0.1)
print("held " + json.dumps(sorted(os.listdir(folder))), flush=True)
sys.exit(3 if sys.argv[2] == "fail" else 0)
'''


def _command(folder: Path, expect: int, end: str, **bounds) -> dict:
    return graph(node("train", "script.Command", argv=["{python}", "epochs.py", str(expect), end], cwd=str(folder),
                      **bounds), name="bounded")


@pytest.fixture
def lab(tmp_path):
    folder = tmp_path / "lab"
    folder.mkdir()
    (folder / "epochs.py").write_text(SCRIPT)
    return folder


def _held_line(server, run_id: str) -> list[str]:
    events = server.get(f"/api/runs/{run_id}/events?tail=1000")["events"]
    text = "".join(e["payload"].get("text", "") for e in events if e["type"] == "console")
    return json.loads(text.split("held ", 1)[1].splitlines()[0])


def _on_server(server, run_id: str) -> list[str]:
    return sorted(os.listdir(server.home / "runs" / run_id / "checkpoints"))


def test_keep_checkpoints_and_keep_best_in_process(make_server, lab):
    server = make_server(TROUPE_DATA_ROOTS=str(lab.parent))
    run_id = server.submit(_command(lab, 3, "ok", keep_checkpoints=2, keep_best="val_loss"))["run_id"]
    assert server.wait_status(run_id, "succeeded", timeout=90)["status"] == "succeeded"
    kept = ["epoch-2.pt", "epoch-4.pt", "epoch-5.pt"]  # the newest two and the best
    assert _held_line(server, run_id) == kept and _on_server(server, run_id) == kept
    row = server.get(f"/api/runs/{run_id}")
    assert sorted(a["path"] for a in row["artifacts"]) == [f"checkpoints/{name}" for name in kept]
    summary = row["checkpoints"]
    assert (summary["count"], summary["removed"], summary["newest"]["path"]) == (3, 2, "checkpoints/epoch-5.pt")
    assert (summary["best"]["path"], summary["best"]["value"], summary["best"]["epoch"]) == \
        ("checkpoints/epoch-2.pt", 0.2, 2)
    removed = [e["payload"]["path"] for e in server.get(f"/api/runs/{run_id}/events?tail=1000")["events"]
               if e["type"] == "artifact_removed"]
    assert removed == ["checkpoints/epoch-1.pt", "checkpoints/epoch-3.pt"]
    gone = min(a["id"] for a in row["artifacts"]) - 1  # epoch-1's row: stored first, then let go
    status, reply = server.client.request("GET", f"/api/runs/{run_id}/artifacts/{gone}")
    assert (status, reply["error"]["code"]) == (404, "artifact_removed"), reply
    shown = cli(server, "show", run_id)
    assert "3 kept" in shown.stdout and "best epoch-2.pt (val_loss 0.2)" in shown.stdout, shown.stdout
    assert "checkpoints/epoch-4.pt" not in shown.stdout  # one line, not a row per file
    assert "checkpoints/epoch-4.pt" in cli(server, "show", run_id, "--artifacts").stdout


@pytest.fixture
def plane(make_server, tmp_path, lab):
    home = tmp_path / "home"
    settings = {"TROUPE_WORKER_HEARTBEAT_S": "1", "TROUPE_DATA_ROOTS": str(lab.parent)}
    server = make_server(home, **settings)
    proxy = FaultProxy(int(server.url.rsplit(":", 1)[1])).start()

    def restart():
        again = make_server(home, **settings)
        proxy.upstream_port = int(again.url.rsplit(":", 1)[1])
        return again

    yield server, proxy, restart
    proxy.close()


@pytest.mark.timeout(300)
def test_keep_checkpoints_leaves_two_on_the_worker_in_its_outbox_and_on_the_server_and_resumes(plane, lab,
                                                                                                tmp_path):
    server, proxy, restart = plane
    agent = agent_through(server, proxy, tmp_path, TROUPE_DATA_ROOTS=str(lab.parent))
    try:
        run_id = server.submit(_command(lab, 2, "fail", keep_checkpoints=2), target={"worker": "gpu-a"})["run_id"]
        wait_event(server, run_id, "node_started")
        server.kill()  # its checkpoints wait in the worker's outbox
        newest = {"checkpoints/epoch-4.pt", "checkpoints/epoch-5.pt"}
        server.poll_until(lambda: set(_kept(tmp_path, run_id)) == newest, timeout=120)
        again = restart()
        again.wait_until(lambda: (worker_state(again, "gpu-a") or {}).get("state") == "connected", timeout=60)
        assert again.events_until_finished(run_id, timeout=120)[-1]["payload"]["status"] == "failed"
        assert _held_line(again, run_id) == ["epoch-4.pt", "epoch-5.pt"]  # the run's folder on the worker
        again.poll_until(lambda: {a["path"] for a in again.get(f"/api/runs/{run_id}")["artifacts"]
                                  if a["state"] == "stored"} == newest, timeout=60)
        assert {a["path"] for a in again.get(f"/api/runs/{run_id}")["artifacts"]} == newest
        assert _on_server(again, run_id) == ["epoch-4.pt", "epoch-5.pt"]
        assert again.get(f"/api/runs/{run_id}")["checkpoints"]["removed"] == 3
        resumed = cli(again, "rerun", run_id, "--resume", timeout=120)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        new_id = resumed.stdout.split("Run ID")[1].split()[0]
        console = again.events_until_finished(new_id, timeout=120)
        assert console[-1]["payload"]["status"] == "succeeded"
        assert again.get(f"/api/runs/{new_id}")["resumed_from"]["epoch"] == 5
        (result,) = [e["payload"]["outputs"]["result"] for e in console if e["type"] == "node_finished"]
        assert result.endswith(": weights of epoch 5"), result  # TROUPE_RESUME_FROM held the newest
    finally:
        agent.terminate()
        agent.wait(30)


def test_a_training_loop_keeps_its_newest_two_epochs_and_resumes_from_them(make_server):
    server = make_server()
    stopped = server.submit(quick_digits(epochs=8, checkpoint_every=1, keep_checkpoints=2), seed=3)["run_id"]
    _cancel_after_epoch(server, stopped, 4)
    assert server.get(f"/api/runs/{stopped}")["status"] == "cancelled"
    names = sorted(a["path"].rsplit("/", 1)[1] for a in server.get(f"/api/runs/{stopped}")["artifacts"]
                   if a["kind"] in ("checkpoint", "training_state"))
    newest = max(int(name.split("-")[2].split(".")[0]) for name in names)
    assert newest >= 4 and names == sorted(f"trainer-epoch-{k}{end}" for k in (newest - 1, newest)
                                           for end in (".pt", ".state.pt")), names
    assert _on_server(server, stopped) == names
    status, resumed = server.client.request("POST", f"/api/runs/{stopped}/rerun", {"resume": True})
    assert status == 201, resumed
    assert server.events_until_finished(resumed["run_id"], timeout=240)[-1]["payload"]["status"] == "succeeded"
    assert server.get(f"/api/runs/{resumed['run_id']}")["resumed_from"]["epoch"] == newest


def test_keep_checkpoints_leaves_two_in_the_bucket(make_server, lab, tmp_path):
    with s3_server() as s3:
        server = make_server(TROUPE_WORKER_HEARTBEAT_S="1", TROUPE_DATA_ROOTS=str(lab.parent), **s3)
        agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"],
                            TROUPE_DATA_ROOTS=str(lab.parent))
        try:
            read_until(agent, "connected as gpu-a")
            run_id = server.submit(_command(lab, 2, "ok", keep_checkpoints=2), target={"worker": "gpu-a"})["run_id"]
            assert server.wait_status(run_id, "succeeded", timeout=90)["status"] == "succeeded"
        finally:
            agent.terminate()
            agent.wait(30)
        listed = client(s3).list_objects_v2(Bucket="troupe-lab", Prefix=f"lab/artifacts/{run_id}/")
        assert sorted(item["Key"].rsplit("/", 1)[1] for item in listed.get("Contents", [])) == \
            ["epoch-4.pt", "epoch-5.pt"]
        row = server.get(f"/api/runs/{run_id}")
        assert {(a["path"], a["backend"]) for a in row["artifacts"]} == \
            {("checkpoints/epoch-4.pt", "s3"), ("checkpoints/epoch-5.pt", "s3")}
        assert row["checkpoints"]["removed"] == 3
