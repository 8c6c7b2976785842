"""The artifact outbox (issue 26, point 1), through a real server, a real agent and a
proxy that follows the server across restarts: a worker run's checkpoints written while
the control plane is down are all stored once it is back, with the sha256 of the
worker's files; so are those an agent killed with SIGKILL still held, once it starts
again. A file is removed from the outbox only once stored."""

from __future__ import annotations

import copy
import hashlib
import json
import signal
from pathlib import Path

import pytest

from tests.faultproxy import FaultProxy
from tests.integration.test_training_functional import DIGITS
from tests.integration.test_worker_faults_functional import agent_through, wait_event
from tests.integration.test_workers_functional import read_until, start_agent, worker_state

SETTINGS = {"TROUPE_WORKER_HEARTBEAT_S": "1"}
FILES = 7  # three epochs: weights and training state of each; the loop's TensorBoard event file


def _late_training(epochs: int = 3) -> dict:
    """The digits training with a pause before its loop: time to take the server away."""
    graph = copy.deepcopy(DIGITS)
    for node in graph["nodes"]:
        if node["id"] == "trainer":
            node["params"].update(epochs=epochs, checkpoint_every=1)
    graph["nodes"].append({"id": "pause", "type": "core.Sleep", "params": {"seconds": 1.5}})
    for edge in graph["edges"]:
        if edge["source"] == "train_loader" and edge["target"] == "trainer":
            edge.update(target="pause", target_port="x")
    graph["edges"].append({"source": "pause", "source_port": "x", "target": "trainer", "target_port": "train"})
    return graph


def _outbox(tmp_path: Path) -> Path:
    return tmp_path / "state" / "troupe" / "artifact-outbox" / "gpu-a"


def _kept(tmp_path: Path, run_id: str) -> dict[str, str]:
    """What the outbox holds for the run: path -> sha256 of the file itself."""
    kept = {}
    for index in (_outbox(tmp_path) / run_id).glob("*/entry.json"):
        if index.parent.name.startswith("."):
            continue  # still being made by the run's child: whole only once renamed
        entry = json.loads(index.read_text())
        kept[entry["path"]] = hashlib.sha256((index.parent / "data").read_bytes()).hexdigest()
        assert kept[entry["path"]] == entry["sha256"]
    return kept


@pytest.fixture
def plane(make_server, tmp_path):
    home = tmp_path / "home"
    server = make_server(home, **SETTINGS)
    proxy = FaultProxy(int(server.url.rsplit(":", 1)[1])).start()

    def restart():
        again = make_server(home, **SETTINGS)
        proxy.upstream_port = int(again.url.rsplit(":", 1)[1])
        return again

    yield server, proxy, restart
    proxy.close()


def _stored(server, run_id: str) -> dict[str, str]:
    return {a["path"]: a["sha256"] for a in server.get(f"/api/runs/{run_id}")["artifacts"] if a["state"] == "stored"}


@pytest.mark.timeout(300)
def test_checkpoints_written_while_the_control_plane_is_down_are_stored_once_it_is_back(plane, tmp_path):
    server, proxy, restart = plane
    agent = agent_through(server, proxy, tmp_path)
    try:
        run_id = server.submit(_late_training(), target={"worker": "gpu-a"})["run_id"]
        wait_event(server, run_id, "node_started")
        server.kill()  # the run goes on on its worker, its files wait in the outbox
        server.poll_until(lambda: len(_kept(tmp_path, run_id)) == FILES, timeout=120)
        kept = _kept(tmp_path, run_id)
        again = restart()
        again.wait_until(lambda: (worker_state(again, "gpu-a") or {}).get("state") == "connected", timeout=60)
        assert again.events_until_finished(run_id, timeout=120)[-1]["payload"]["status"] == "succeeded"
        again.poll_until(lambda: _stored(again, run_id) == kept, timeout=60)
        again.poll_until(lambda: not (_outbox(tmp_path) / run_id).exists(), timeout=30)  # removed once stored
        for artifact in again.get(f"/api/runs/{run_id}")["artifacts"]:
            assert hashlib.sha256(again.download(f"/api/runs/{run_id}/artifacts/{artifact['id']}")).hexdigest() \
                == kept[artifact["path"]]
    finally:
        agent.terminate()
        agent.wait(30)


@pytest.mark.timeout(300)
def test_an_agent_killed_before_its_uploads_sends_them_when_it_starts_again(plane, tmp_path):
    server, proxy, restart = plane
    agent = agent_through(server, proxy, tmp_path)
    again_agent = None
    try:
        run_id = server.submit(_late_training(), target={"worker": "gpu-a"})["run_id"]
        wait_event(server, run_id, "node_started")
        server.kill()
        server.poll_until(lambda: len(_kept(tmp_path, run_id)) >= 2, timeout=120)
        agent.send_signal(signal.SIGKILL)  # between a checkpoint's write and its upload
        agent.wait(30)
        kept = _kept(tmp_path, run_id)
        again = restart()
        again_agent = start_agent(again, tmp_path, f"troupe agent start --url {proxy.url} --name gpu-a")
        read_until(again_agent, "connected as gpu-a")
        # It sent what its outbox held before it took new work.
        assert set(kept) <= set(_stored(again, run_id)) and all(_stored(again, run_id)[p] == s for p, s in kept.items())
        assert not any((_outbox(tmp_path) / run_id).glob("*/entry.json"))
    finally:
        for process in (agent, again_agent):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(30)
