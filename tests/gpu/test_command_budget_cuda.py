"""A ``script.Command`` on a shared card (issue 38): its program is not the run's
process, so the run's allocator cap does not reach it. The run child watches the
program's group through NVML and stops it past the budget, as an out-of-memory failure;
``troupe.cap_memory()`` lets a script hold its own allocator to the budget instead.

The path up to the card (agent, sharing, admission, the budget in the program's
environment) runs everywhere on a simulated card; the NVML watch needs a real one."""

from __future__ import annotations

import sys

import pytest

from tests.gpu.cards import CUDA_REASON, start_agent
from tests.helpers import graph, node

GREEDY = r'''
import json, os, sys, time, torch
import troupe
mode = sys.argv[1]
if mode == "capped":
    troupe.cap_memory()
print(json.dumps({"budget": os.environ.get("TROUPE_MEMORY_BUDGET_MIB")}), flush=True)
if torch.cuda.is_available():
    held = [torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda") for _ in range(24)]  # 1.5 GiB
time.sleep(3)
'''


def _command(folder, mode: str) -> dict:
    return graph(node("job", "script.Command", argv=[sys.executable, "greedy.py", mode], cwd=str(folder)),
                 name="greedy", device="cuda")


def _run(server, worker: str, folder, mode: str) -> dict:
    status, reply = server.client.request("PUT", f"/api/workers/{worker}/devices/cuda:0", {"sharing": "memory"})
    assert status == 200, reply
    run_id = server.submit(_command(folder, mode), target={"worker": worker, "memory_gib": 0.5})["run_id"]
    server.events_until_finished(run_id, timeout=300)
    return server.get(f"/api/runs/{run_id}")


def test_the_budget_reaches_a_command_on_a_simulated_card(make_server, tmp_path):
    (tmp_path / "greedy.py").write_text(GREEDY)
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agent = start_agent(server, tmp_path, "gpu-sim", simulated=1, TROUPE_DATA_ROOTS=str(tmp_path))
    try:
        row = _run(server, "gpu-sim", tmp_path, "uncapped")
        events = server.get(f"/api/runs/{row['id']}/events?tail=200")["events"]
        console = "".join(e["payload"].get("text", "") for e in events if e["type"] == "console")
        assert '{"budget": "512"}' in console, console
    finally:
        agent.terminate()
        agent.wait(30)


@pytest.mark.skipif(CUDA_REASON is not None, reason=CUDA_REASON or "")
@pytest.mark.timeout(600)
def test_a_command_past_its_budget_is_stopped_and_a_capped_one_fails_in_torch(make_server, tmp_path):
    (tmp_path / "greedy.py").write_text(GREEDY)
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agent = start_agent(server, tmp_path, "gpu-real", TROUPE_DATA_ROOTS=str(tmp_path))
    try:
        watched = _run(server, "gpu-real", tmp_path, "uncapped")
        assert watched["status"] == "failed" and "over the run's memory budget of 512 MiB" in watched["error"], watched
        capped = _run(server, "gpu-real", tmp_path, "capped")
        assert capped["status"] == "failed" and "CUDA out of memory" in capped["error"], capped
    finally:
        agent.terminate()
        agent.wait(30)
