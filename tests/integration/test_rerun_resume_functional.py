"""Rerun and resume (issue 26, points 2 and 3), through the real server: a run queued
again from another, linked both ways; a seeded deterministic training stopped after an
epoch and resumed from its checkpoint ends exactly, to the last bit, where the same
training run without a stop ends; and each refusal leaves nothing queued."""

from __future__ import annotations

from tests.helpers import hello, sleeper
from tests.integration.test_training_functional import quick_digits, series
from tests.integration.test_workers_functional import enroll, read_until, start_agent

# Enough epochs after the third that a cancel sent when its checkpoint is stored lands
# before the last one on a loaded machine (an epoch of the quick digits is 30-150 ms).
EPOCHS = 20


def _cancel_after_epoch(server, run_id: str, epoch: int) -> None:
    """Cancels the run once the checkpoint of ``epoch`` is stored (its training state is
    the last of its two files)."""
    for kind, data in server.client.stream(f"/api/runs/{run_id}/stream", read_timeout=180):
        if kind != "run_event":
            continue
        if data["type"] == "artifact" and data["payload"]["path"] == f"checkpoints/trainer-epoch-{epoch}.state.pt":
            server.client.request("POST", f"/api/runs/{run_id}/cancel")
        if data["type"] == "run_finished":
            return


def _ending(server, run_id: str) -> dict[str, list[float]]:
    return {name: series(server, run_id, name) for name in ("train_loss", "val_loss", "eval_loss", "eval_accuracy")}


def test_a_rerun_is_a_new_run_linked_both_ways(make_server):
    server = make_server()
    graph = hello()
    graph["name"] = "greeting"
    first = server.submit(graph)["run_id"]
    assert server.events_until_finished(first)[-1]["payload"]["status"] == "succeeded"
    status, again = server.client.request("POST", f"/api/runs/{first}/rerun", {})
    assert status == 201 and again["status"] == "queued" and again["run_id"] != first, again
    assert server.events_until_finished(again["run_id"])[-1]["payload"]["status"] == "succeeded"
    row = server.get(f"/api/runs/{again['run_id']}")
    assert (row["rerun_of"], row["name"], row["resumed_from"]) == (first, "greeting", None)
    assert server.get(f"/api/runs/{first}")["reruns"] == [again["run_id"]]
    # Refusals leave nothing queued: no checkpoint, an active run, an unknown run.
    runs_before = len(server.get("/api/runs")["runs"])
    status, reply = server.client.request("POST", f"/api/runs/{first}/rerun", {"resume": True})
    assert (status, reply["error"]["code"]) == (409, "no_checkpoint"), reply
    busy = server.submit(sleeper(30))["run_id"]
    status, reply = server.client.request("POST", f"/api/runs/{busy}/rerun", {"resume": True})
    assert (status, reply["error"]["code"]) == (409, "run_active"), reply
    status, reply = server.client.request("POST", f"/api/runs/{'0' * 32}/rerun", {})
    assert (status, reply["error"]["code"]) == (404, "run_not_found")
    status, reply = server.client.request("POST", f"/api/runs/{first}/rerun", {"resume": "yes"})
    assert (status, reply["error"]["pointer"]) == (400, "/resume")
    assert len(server.get("/api/runs")["runs"]) == runs_before + 1  # only the sleeper
    server.client.request("POST", f"/api/runs/{busy}/cancel")


def test_a_stopped_training_resumed_ends_exactly_where_one_without_a_stop_ends(make_server):
    server = make_server()
    graph = quick_digits(epochs=EPOCHS, checkpoint_every=1)
    straight = server.submit(graph, seed=11, deterministic=True)["run_id"]
    assert server.events_until_finished(straight, timeout=240)[-1]["payload"]["status"] == "succeeded"

    stopped = server.submit(graph, seed=11, deterministic=True)["run_id"]
    _cancel_after_epoch(server, stopped, 3)
    assert server.get(f"/api/runs/{stopped}")["status"] == "cancelled"
    done = len(series(server, stopped, "train_loss"))
    assert 3 <= done < EPOCHS
    status, resumed = server.client.request("POST", f"/api/runs/{stopped}/rerun", {"resume": True})
    assert status == 201, resumed
    events = server.events_until_finished(resumed["run_id"], timeout=240)
    assert events[-1]["payload"]["status"] == "succeeded", events[-3:]
    row = server.get(f"/api/runs/{resumed['run_id']}")
    point = row["resumed_from"]
    weights = next(a for a in server.get(f"/api/runs/{stopped}")["artifacts"] if a["id"] == point["artifact_id"])
    assert point["run_id"] == stopped and point["epoch"] >= 3 and point["sha256"] == weights["sha256"]
    assert weights["path"] == f"checkpoints/trainer-epoch-{point['epoch']}.pt"
    # Its series go on from the next epoch, and end to the last bit as the straight run's.
    epochs = [e["payload"]["epoch"] for e in events if e["type"] == "metric" and e["payload"]["name"] == "train_loss"]
    assert epochs == list(range(point["epoch"] + 1, EPOCHS + 1))
    straight_end, resumed_end = _ending(server, straight), _ending(server, resumed["run_id"])
    assert resumed_end["train_loss"] == straight_end["train_loss"][point["epoch"]:]
    assert resumed_end["val_loss"] == straight_end["val_loss"][point["epoch"]:]
    assert resumed_end["eval_loss"] == straight_end["eval_loss"] and resumed_end["eval_accuracy"] == \
        straight_end["eval_accuracy"]
    provenance = [e["payload"] for e in events if e["type"] == "provenance"]
    assert any(p.get("sha256") == weights["sha256"] for p in provenance), provenance


def test_a_worker_training_resumed_on_its_worker_ends_exactly_as_one_without_a_stop(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"])
    try:
        read_until(agent, "connected as gpu-a")
        on_worker = {"worker": "gpu-a"}
        graph = quick_digits(epochs=EPOCHS, checkpoint_every=1)
        straight = server.submit(graph, seed=11, deterministic=True, target=on_worker)["run_id"]
        assert server.events_until_finished(straight, timeout=240)[-1]["payload"]["status"] == "succeeded"
        stopped = server.submit(graph, seed=11, deterministic=True, target=on_worker)["run_id"]
        _cancel_after_epoch(server, stopped, 2)  # its files came through the worker's outbox
        status, resumed = server.client.request("POST", f"/api/runs/{stopped}/rerun", {"resume": True})
        assert status == 201 and resumed["queue_key"] == "gpu-a/cpu", resumed
        assert server.events_until_finished(resumed["run_id"], timeout=240)[-1]["payload"]["status"] == "succeeded"
        point = server.get(f"/api/runs/{resumed['run_id']}")["resumed_from"]
        assert point["epoch"] >= 2
        straight_end, resumed_end = _ending(server, straight), _ending(server, resumed["run_id"])
        assert resumed_end["train_loss"] == straight_end["train_loss"][point["epoch"]:]
        assert resumed_end["eval_loss"] == straight_end["eval_loss"]
        assert resumed_end["eval_accuracy"] == straight_end["eval_accuracy"]
    finally:
        agent.terminate()
        agent.wait(30)


def test_a_checkpoint_swapped_after_the_rerun_was_asked_for_is_never_trained_on(make_server):
    server = make_server(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="1")
    stopped = server.submit(quick_digits(epochs=EPOCHS, checkpoint_every=1), seed=3)["run_id"]
    _cancel_after_epoch(server, stopped, 2)
    blocker = server.submit(sleeper(60))["run_id"]  # holds the one slot: the resumed run waits
    server.wait_status(blocker, "running")
    status, resumed = server.client.request("POST", f"/api/runs/{stopped}/rerun", {"resume": True})
    assert status == 201 and resumed["status"] == "queued", resumed
    # The run it resumes from cannot be deleted while the resume waits (retention keeps it too).
    status, reply = server.client.request("DELETE", f"/api/runs/{stopped}")
    assert (status, reply["error"]["code"]) == (409, "run_needed") and resumed["run_id"] in reply["error"]["message"]
    point = server.get(f"/api/runs/{resumed['run_id']}")["resumed_from"]
    folder = server.home / "runs" / stopped / "checkpoints"
    named = folder / f"trainer-epoch-{point['epoch']}.pt"
    named.write_bytes((folder / "trainer-epoch-1.pt").read_bytes())  # valid weights, not the recorded ones
    server.client.request("POST", f"/api/runs/{blocker}/cancel")
    row = server.wait_status(resumed["run_id"], "failed", timeout=180)
    assert "checkpoint_unavailable" in row["error"] and "Errno" not in row["error"], row["error"]
    metrics = server.get(f"/api/runs/{resumed['run_id']}/metrics")["series"]
    assert "train_loss" not in metrics  # not one epoch on the swapped weights


def test_a_node_id_that_reads_as_a_path_writes_its_checkpoints_in_its_runs_folder(make_server, tmp_path):
    server = make_server()
    escape = "../../../../escaped"  # from <home>/runs/<id>/checkpoints: beside the server's home
    graph = quick_digits(epochs=1, checkpoint_every=1)
    for node in graph["nodes"]:
        node["id"] = escape if node["id"] == "trainer" else node["id"]
    for edge in graph["edges"]:
        for end in ("source", "target"):
            edge[end] = escape if edge[end] == "trainer" else edge[end]
    student = server.session(uses=1)
    status, made = student.request("POST", "/api/runs", {"graph": graph})
    assert status == 201, made
    assert server.events_until_finished(made["run_id"], timeout=180)[-1]["payload"]["status"] == "succeeded"
    listed = server.get(f"/api/runs/{made['run_id']}")["artifacts"]
    paths = [a["path"] for a in listed if a["kind"] != "tensorboard"]  # (its event files: the same holds, below)
    assert len(paths) == 2 and all(p.startswith("checkpoints/") and ".." not in p.split("/") for p in paths), paths
    assert all(".." not in a["path"].split("/") for a in listed), listed
    assert not list(tmp_path.glob("escaped*"))  # nothing outside the run's folder
    status, again = student.request("POST", f"/api/runs/{made['run_id']}/rerun", {"resume": True})
    assert status == 201, again  # its checkpoint is found under the name it was written with
    # A checkpoint file made a link to itself is refused in words, never a 500.
    weights = next(a for a in server.get(f"/api/runs/{made['run_id']}")["artifacts"] if a["kind"] == "checkpoint")
    looped = server.home / "runs" / made["run_id"] / weights["path"]
    looped.unlink()
    looped.symlink_to(looped.name)
    status, reply = server.client.request("GET", f"/api/runs/{made['run_id']}/artifacts/{weights['id']}")
    assert (status, reply["error"]["code"]) == (409, "artifact_unreachable"), reply
    status, reply = server.client.request("POST", f"/api/runs/{made['run_id']}/rerun", {"resume": True})
    assert status == 409, reply
