"""The warm pool (issue 17, point 1): an agent started with --warm N keeps N run
children with torch imported. A run takes one and the pool refills; a seeded run gives
the same numbers as in a fresh child; a run that sets environment variables of its own
starts cold; the pool's memory shows in GET /api/workers. (The guarantees of a fresh
child, warm or not, are in test_worker_runs_functional, run both ways.)"""

from __future__ import annotations

import sys
import types

from subprocess_runner.child import cuda_touched
from tests.helpers import hello
from tests.integration.test_training_functional import quick_digits
from tests.integration.test_worker_runs_functional import wait_warm
from tests.integration.test_workers_functional import enroll, read_until, start_agent, worker_state


def test_runs_take_warm_children_and_the_pool_refills(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    warm = start_agent(server, tmp_path / "warm", enroll(server, name="warm")["command"] + " --warm 1",
                       machine="warm")
    cold = start_agent(server, tmp_path / "cold", enroll(server, name="cold")["command"], machine="cold")
    try:
        read_until(warm, "connected as warm")
        read_until(cold, "connected as cold")
        wait_warm(server, "warm", 1)
        pool = worker_state(server, "warm")["warm_pool"]
        assert pool["size"] == 1 and pool["rss_mib"] > 100  # torch is imported in it
        assert worker_state(server, "cold")["warm_pool"] is None

        losses = {}
        for name in ("warm", "cold"):
            run_id = server.submit(quick_digits(epochs=1), seed=7, target={"worker": name})["run_id"]
            assert server.events_until_finished(run_id, timeout=120)[-1]["payload"]["status"] == "succeeded"
            row = server.get(f"/api/runs/{run_id}")
            assert row["execution_facts"]["started_warm"] is (name == "warm")
            losses[name] = row["final_loss"]
        assert losses["warm"] == losses["cold"]  # the run's seed, not the child's history

        wait_warm(server, "warm", 1)  # refilled in the background
        graph = hello()
        graph["nodes"][0]["resources"] = {"env": {"TROUPE_TEST_MARK": "1"}}
        run_id = server.submit(graph, target={"worker": "warm"})["run_id"]
        assert server.events_until_finished(run_id, timeout=60)[-1]["payload"]["status"] == "succeeded"
        assert server.get(f"/api/runs/{run_id}")["execution_facts"]["started_warm"] is False
        assert worker_state(server, "warm")["warm_pool"]["ready"] == 1  # left for the next run
    finally:
        for agent in (warm, cold):
            agent.terminate()
            agent.wait(30)


def test_a_child_that_finds_cuda_initialised_is_unfit(monkeypatch):
    initialised = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: True))
    monkeypatch.setitem(sys.modules, "torch", initialised)
    assert "initialised" in (cuda_touched() or "")
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(
        cuda=types.SimpleNamespace(is_initialized=lambda: False)))
    assert cuda_touched() is None
