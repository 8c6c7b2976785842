"""DDP inside a worker run's process (issue 17, point 2; #792), on the CPU with gloo
through the documented test-only switch TROUPE_DDP_CPU_RANKS: one run, one event log,
the same final weights on every rank, its ranks started by a child the zygote forked; a
killed rank fails the run (of a fresh child), naming the rank, within seconds. The real
path (NCCL, one rank per card) is in tests/gpu."""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path

from tests.integration.test_training_functional import quick_digits
from tests.integration.test_worker_runs_functional import wait_warm
from tests.integration.test_workers_functional import enroll, read_until, start_agent


def _ddp_agent(server, tmp_path, flags: str = ""):
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"] + flags, TROUPE_DDP_CPU_RANKS="2")
    read_until(agent, "connected as gpu-a")
    return agent


def _joined(server, run_id: str) -> dict:
    for kind, data in server.client.stream(f"/api/runs/{run_id}/stream", read_timeout=180):
        if kind == "run_event" and data["type"] == "log" and "ddp" in data["payload"]:
            return data["payload"]["ddp"]
        if kind == "run_event" and data["type"] == "run_finished":
            break
    raise AssertionError(f"run {run_id} never said its ranks joined")


def test_two_ranks_train_one_model_in_one_run(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agent = _ddp_agent(server, tmp_path, " --warm 1")  # the run's child forked from the zygote starts the ranks
    try:
        wait_warm(server, "gpu-a", 1)
        run_id = server.submit(quick_digits(epochs=3, strategy="ddp"), target={"worker": "gpu-a"}, seed=5)["run_id"]
        events = server.events_until_finished(run_id, timeout=240)
        assert events[-1]["payload"]["status"] == "succeeded", events[-3:]
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        assert sum(e["type"] == "run_finished" for e in events) == 1
        losses = [e["payload"] for e in events if e["type"] == "metric" and e["payload"]["name"] == "train_loss"]
        assert [m["step"] for m in losses] == [1, 2, 3] and all(m["ranks"] == 2 for m in losses)  # one log
        ddp = [e["payload"]["ddp"] for e in events if e["type"] == "log" and "ddp" in e["payload"]]
        assert ddp[0]["world"] == 2 and len(set(ddp[0]["pids"])) == 2
        weights = ddp[-1]["weights"]
        assert len(weights) == 2 and weights[0] == weights[1]  # the same final weights on both ranks
        assert not [e for e in events if e["payload"].get("code") == "ddp_not_available"]
        row = server.get(f"/api/runs/{run_id}")
        assert row["final_loss"] is not None and row["execution_facts"]["started_warm"] is True
        # The ranks met in a folder of the run's own; the run's whole folder is gone once its
        # process has left, a moment after its end went up (nothing grows on a worker).
        server.poll_until(lambda: not list(Path(tempfile.gettempdir()).glob(f"troupe-run-{run_id}-*")), 10)
    finally:
        agent.terminate()
        agent.wait(30)


def test_a_killed_rank_fails_the_run_naming_it(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agent = _ddp_agent(server, tmp_path)
    try:
        run_id = server.submit(quick_digits(epochs=500, strategy="ddp"), target={"worker": "gpu-a"})["run_id"]
        ranks = _joined(server, run_id)
        killed = time.monotonic()
        os.kill(ranks["pids"][1], signal.SIGKILL)
        ended = server.events_until_finished(run_id, timeout=60)[-1]["payload"]
        took = time.monotonic() - killed
        assert ended["status"] == "failed", ended
        assert "DDP rank 1 of 2 died (signal SIGKILL)" in ended["error"]
        assert took < 15, f"the run took {took:.1f} s to fail after its rank died"  # not a collective's timeout
        print(f"a killed rank failed its run {took:.2f} s later")
        after = server.submit(quick_digits(epochs=1), target={"worker": "gpu-a"})["run_id"]
        assert server.events_until_finished(after, timeout=120)[-1]["payload"]["status"] == "succeeded"
    finally:
        agent.terminate()
        agent.wait(30)
