"""A control plane that restarts without stopping its runs (SIGKILL, or ``troupe stop
--leave-worker-runs``) adopts the worker runs still executing; queued runs may survive a
restart in order; studies run their attempts on a worker."""

from __future__ import annotations

import subprocess

import pytest

from tests.faultproxy import FaultProxy
from tests.helpers import REPO, base_env, hello, sleeper, troupe_cmd
from tests.integration.test_studies_functional import post, study_body, variants, wait_state
from tests.integration.test_worker_faults_functional import agent_through, assert_complete, ticker, wait_event
from tests.integration.test_workers_functional import worker_state

ON_CARD = {"worker": "gpu-a", "devices": ["cuda:0"]}


def port_of(server) -> int:
    return int(server.url.rsplit(":", 1)[1])


@pytest.fixture
def behind_proxy(make_server, tmp_path):
    """A server on a fixed home, and an agent that reaches it (and its successor) through
    a proxy whose upstream follows the restart."""
    home = tmp_path / "home"
    settings = {"TROUPE_WORKER_HEARTBEAT_S": "1", "TROUPE_RUN_QUEUE_MAX_CONCURRENT": "gpu-a/cuda:0=3,cpu=1"}
    server = make_server(home, **settings)
    proxy = FaultProxy(port_of(server)).start()
    agent = agent_through(server, proxy, tmp_path)

    def restart(**extra: str):
        again = make_server(home, **settings, **extra)
        proxy.upstream_port = port_of(again)
        again.wait_until(lambda: (worker_state(again, "gpu-a") or {}).get("state") == "connected")
        return again

    yield server, restart
    agent.terminate()
    agent.wait(30)
    proxy.close()


def test_a_sigkilled_control_plane_adopts_its_worker_runs(behind_proxy):
    server, restart = behind_proxy
    fast = server.submit(ticker(100, interval=0.1), target=ON_CARD)["run_id"]
    slow = [server.submit(ticker(40, interval=0.25), target=ON_CARD)["run_id"] for _ in range(2)]
    for run_id in (fast, *slow):
        wait_event(server, run_id, "metric")
    server.kill()
    again = restart()
    # The card's three slots are held by the adopted runs: a new run waits behind them.
    behind = again.submit(hello(), target=ON_CARD)
    assert behind["queue_position"] == 1
    finished = [again.wait_status(run_id, "succeeded", timeout=60) for run_id in (fast, *slow)]
    assert_complete(again, fast, 100)
    for run_id in slow:
        assert_complete(again, run_id, 40)
    started = again.wait_status(behind["run_id"], "succeeded")["started_at"]
    assert started >= min(row["finished_at"] for row in finished)
    adopted = again.get(f"/api/runs/{fast}/events")["events"]
    assert "worker_adopting" in [e["payload"].get("code") for e in adopted if e["type"] == "warning"]


def test_stop_leaving_worker_runs_then_start_adopts_them_and_keeps_the_queue(behind_proxy):
    server, restart = behind_proxy
    remote = server.submit(ticker(60, interval=0.1), target=ON_CARD)["run_id"]
    local = server.submit(sleeper(30))["run_id"]
    queued = [server.submit(hello(), device="cpu")["run_id"] for _ in range(3)]  # behind the sleeper
    wait_event(server, remote, "metric")
    server.wait_status(local, "running")
    result = subprocess.run(troupe_cmd("stop", "--leave-worker-runs"), cwd=REPO, env=base_env(server.home),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "worker runs go on" in result.stdout
    assert server.proc.wait(30) == 0
    again = restart()
    assert again.get(f"/api/runs/{local}")["status"] == "interrupted"  # in-process runs stop as usual
    assert again.wait_status(remote, "succeeded", timeout=60)
    assert_complete(again, remote, 60)
    for run_id in queued:
        assert again.wait_status(run_id, "succeeded")["error"] is None


def test_queued_runs_survive_a_restart_in_order_when_asked(make_server, tmp_path):
    home = tmp_path / "restore"
    settings = {"TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU": "1", "TROUPE_RUN_QUEUE_RESTORE": "1"}
    server = make_server(home, **settings)
    running = server.submit(sleeper())["run_id"]
    queued = [server.submit(hello())["run_id"] for _ in range(3)]
    server.wait_status(running, "running")
    server.kill()
    again = make_server(home, **settings)
    assert again.get(f"/api/runs/{running}")["status"] == "interrupted"
    rows = [again.wait_status(run_id, "succeeded") for run_id in queued]
    starts = [row["started_at"] for row in rows]
    assert starts == sorted(starts)  # in their FIFO order


def test_a_study_runs_its_attempts_on_the_named_worker_within_its_budget(behind_proxy):
    server, _ = behind_proxy
    body = study_body(variants(1, 2, 3), repeats=1, budget={"max_runs": 2, "max_parallel_runs": 1},
                      options={"target": {"worker": "gpu-a"}})
    study = post(server, body)
    halted = wait_state(server, study["id"], "halted")
    assert halted["halt_reason"] == "budget_max_runs" and halted["used"]["runs"] == 2
    for attempt in halted["attempts"]:
        run = server.get(f"/api/runs/{attempt['run_id']}")
        assert run["worker"] == "gpu-a" and run["queue_key"] == "gpu-a/cpu" and run["status"] == "succeeded"


def test_a_study_for_an_unknown_worker_is_refused_like_a_run(behind_proxy):
    server, _ = behind_proxy
    reply = post(server, study_body(variants(1), options={"target": {"worker": "nope"}}), expect=400)
    assert reply["error"]["code"] == "unknown_target" and reply["error"]["pointer"] == "/options/target/worker"


def test_an_adopted_run_still_counts_against_its_sessions_max_running(behind_proxy):
    server, restart = behind_proxy
    student = server.session(uses=1, max_running=1)
    ran = [student.request("POST", "/api/runs", {"graph": ticker(count), "options": {"target": ON_CARD}})[1]["run_id"]
           for count in (60, 5)]
    wait_event(server, ran[0], "metric")
    server.poll_until(lambda: (server.get(f"/api/runs/{ran[1]}")["queue_reason"] or {}).get("code")
                      == "session_at_limit")
    server.kill()
    again = restart(TROUPE_RUN_QUEUE_RESTORE="1")
    # The card has slots free, but the adopted run is the session's one at once.
    again.poll_until(lambda: (again.get(f"/api/runs/{ran[1]}")["queue_reason"] or {}).get("code")
                     == "session_at_limit")
    first = again.wait_status(ran[0], "succeeded", timeout=60)
    assert again.wait_status(ran[1], "succeeded", timeout=60)["started_at"] >= first["finished_at"]
