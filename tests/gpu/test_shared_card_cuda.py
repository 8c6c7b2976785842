"""On a real CUDA card (issue 14): three budgeted runs share it, and a run that exceeds
its budget fails alone with an out-of-memory error while its neighbours finish. A real
agent reads the card through NVML; each run's child caps its allocator at its budget.

These need a CUDA build of torch and a card; elsewhere they skip, saying so."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO, base_env, edge, graph, node, troupe_cmd
from tests.integration.test_workers_functional import enroll, read_until


def _cuda_reason() -> str | None:
    """Why these cannot run here, or None. torch is asked in a child process: importing
    it into pytest's own would change what the in-process tests see."""
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception as exc:  # no library or no driver: no card to share
        return f"needs a CUDA card with NVML: {type(exc).__name__}: {exc}"
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True, timeout=120)
    if probe.stdout.strip() != "True":
        return "needs a CUDA build of torch (torch.cuda.is_available() is false here)"
    return None


REASON = _cuda_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def trainer(hidden: str, epochs: int) -> dict:
    return graph(
        node("data", "torch.SyntheticClassification", n=4096, features=256, classes=10),
        node("loader", "torch.DataLoader", batch_size=256),
        node("mlp", "torch.MLP", hidden=hidden),
        node("train", "torch.TrainingLoop", epochs=epochs),
        edges=(edge("data", "train", "loader", "dataset"), edge("data", "train", "mlp", "data"),
               edge("mlp", "model", "train", "model"), edge("loader", "loader", "train", "train")),
        device="cuda")


@pytest.mark.timeout(600)
def test_three_budgeted_runs_share_the_card_and_an_over_budget_one_fails_alone(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    env = base_env(server.home, XDG_CONFIG_HOME=str(tmp_path / "config"), XDG_STATE_HOME=str(tmp_path / "state"),
                   CUDA_VISIBLE_DEVICES="0")
    command = enroll(server, name="gpu-real")["command"].split()[1:]
    agent = subprocess.Popen(troupe_cmd(*command), cwd=REPO, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        read_until(agent, "connected as gpu-real")
        status, reply = server.client.request("PUT", "/api/workers/gpu-real/devices/cuda:0", {"sharing": "memory"})
        assert status == 200, reply
        on_card = {"worker": "gpu-real", "memory_gib": 2}
        neighbours = [server.submit(trainer("256,128", epochs=30), target=on_card)["run_id"] for _ in range(3)]
        for run_id in neighbours:
            server.wait_status(run_id, "running", timeout=120)
        # 8192 x 8192 float32 weights alone are 256 MiB: over a 128 MiB budget.
        greedy = server.submit(trainer("8192,8192", epochs=1), target={"worker": "gpu-real", "memory_gib": 0.125,
                                                                       "wait": True})["run_id"]
        ended = server.events_until_finished(greedy, timeout=300)[-1]["payload"]
        assert ended["status"] == "failed" and "out of memory under the run's budget of 128 MiB" in ended["error"]
        assert server.get(f"/api/runs/{greedy}")["out_of_memory"] is True
        for run_id in neighbours:
            assert server.events_until_finished(run_id, timeout=300)[-1]["payload"]["status"] == "succeeded"
            row = server.get(f"/api/runs/{run_id}")
            assert row["peak_memory_exact"] is True and 0 < row["peak_memory_mib"] <= 2048, json.dumps(row)[:300]
    finally:
        agent.terminate()
        agent.wait(30)
