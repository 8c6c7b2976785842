"""Figures that tell the truth (issue 62, section 5): every run a sweep or a study makes is
announced ``created`` on the global stream and counted by the run histograms of
``/metrics``; ``wait``, ``attach`` and ``run`` stop at ``--timeout`` however much the
run emits; the queue gauges say when a key's device is busy through another key."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.helpers import REPO, base_env, graph, hello, node, sleeper, troupe_cmd
from tests.integration.test_metrics_truth_functional import _samples, _scrape, _summed
from tests.integration.test_studies_functional import post as post_study
from tests.integration.test_studies_functional import study_body, variants, wait_state
from tests.integration.test_sweeps_functional import post as post_sweep
from tests.integration.test_sweeps_functional import sweep_body, wait_finished
from tests.integration.test_workers_functional import enroll, read_until, start_agent

TERMINAL = {"succeeded", "failed", "cancelled", "interrupted"}


def _finished(server, query: str) -> int:
    runs = server.get(f"/api/runs?{query}&limit=500")["runs"]
    return sum(1 for run in runs if run["status"] in TERMINAL)


def _histogram_counts(server) -> tuple[float, float]:
    samples = _samples(_scrape(server)[1])
    return (_summed(samples, "troupe_run_duration_seconds_count"),
            _summed(samples, "troupe_queue_wait_seconds_count"))


@pytest.mark.timeout(180)
def test_the_run_histograms_count_every_run_a_sweep_finished(make_server):
    server = make_server()
    single = server.submit(hello())["run_id"]
    server.wait_status(single, "succeeded")
    reply = post_sweep(server, sweep_body([{"node_id": "a", "param": "value", "values": [1, 2, 3, 4, 5]}]))
    assert wait_finished(server, reply["sweep_id"])["counts"] == {"succeeded": 5}
    assert _finished(server, f"sweep_id={reply['sweep_id']}") == 5
    assert _histogram_counts(server) == (6, 6)  # the single run and the sweep's five


@pytest.mark.timeout(180)
def test_the_run_histograms_count_every_run_a_study_finished(make_server):
    server = make_server(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="4")
    study = post_study(server, study_body(variants(1, 2, 3), repeats=2))
    done = wait_state(server, study["id"], "finished")
    assert done["used"]["runs"] == 6
    assert _finished(server, f"study_id={study['id']}") == 6
    reply = post_sweep(server, sweep_body([{"node_id": "a", "param": "value", "values": [1, 2]}]))
    wait_finished(server, reply["sweep_id"])
    assert _histogram_counts(server) == (8, 8)


@pytest.mark.timeout(120)
def test_the_global_stream_announces_every_run_of_a_sweep_as_created(make_server):
    server = make_server()
    created: list[str] = []
    ended: set[str] = set()
    sweep_runs: set[str] | None = None
    for kind, data in server.client.stream("/api/stream", read_timeout=60):
        if kind == "hello" and sweep_runs is None:
            reply = post_sweep(server, sweep_body([{"node_id": "a", "param": "value", "values": [1, 2, 3, 4]}]))
            sweep_runs = {run["id"] for run in server.get(f"/api/runs?sweep_id={reply['sweep_id']}&limit=100")["runs"]}
            assert len(sweep_runs) == 4
        elif kind == "run" and data.get("kind") == "created":
            created.append(data["run_id"])
            assert data["status"] == "queued" and data["queue_key"] == "cpu"
        elif kind == "run" and data.get("status") in TERMINAL:
            ended.add(data["run_id"])
        if sweep_runs is not None and sweep_runs <= ended:
            break
    assert sorted(created) == sorted(sweep_runs or ()), "every run of the sweep is announced once"


def _ticker(count: int = 600) -> dict:
    """A run that emits a metric point every 0.1 s for a minute."""
    return graph(node("t", "core.Ticker", count=count, interval=0.1))


def _troupe(server, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(troupe_cmd(*args), cwd=REPO, env=base_env(server.home), capture_output=True, text=True,
                          timeout=timeout)


def _emitting(server) -> str:
    """The id of a running run that has emitted events already (and goes on for a minute)."""
    run_id = server.submit(_ticker())["run_id"]
    for kind, data in server.client.stream(f"/api/runs/{run_id}/stream", read_timeout=30):
        if kind == "run_event" and data["type"] == "metric":
            return run_id
    raise AssertionError(f"{run_id} emitted no metric")


@pytest.mark.timeout(240)
def test_wait_attach_and_run_stop_at_their_timeout_while_the_run_emits(make_server, tmp_path):
    server = make_server()
    run_id = _emitting(server)
    waited = _troupe(server, "wait", run_id, "--timeout", "2")
    assert server.get(f"/api/runs/{run_id}")["status"] == "running"  # it returned before the run ended
    assert waited.returncode == 1, waited.stdout + waited.stderr
    assert "timed out" in waited.stderr and f"{run_id} is running" in waited.stderr
    assert "succeeded" not in waited.stdout + waited.stderr
    as_json = _troupe(server, "wait", run_id, "--timeout", "1", "--json")
    assert as_json.returncode == 1 and '"status": "running"' in as_json.stdout
    attached = _troupe(server, "attach", run_id, "--timeout", "2")
    assert server.get(f"/api/runs/{run_id}")["status"] == "running"
    assert attached.returncode == 1 and "timed out" in attached.stdout, attached.stdout + attached.stderr
    path = tmp_path / "ticker.json"
    path.write_text(json.dumps(_ticker()))
    ran = _troupe(server, "run", str(path), "--timeout", "2")
    assert ran.returncode == 1 and "timed out" in ran.stdout, ran.stdout + ran.stderr
    started = ran.stdout.splitlines()[1].split()[-1]
    assert server.get(f"/api/runs/{started}")["status"] in ("queued", "running")
    for each in (run_id, started):
        server.client.request("POST", f"/api/runs/{each}/cancel")


def _queue_rows(server) -> dict[str, dict]:
    return {row["queue_key"]: row for row in server.get("/api/queues")["queues"]}


def _waits_with_a_slot_free(samples: dict, key: str) -> bool:
    """docs/runs.md's alert, per key: runs wait, and neither the key nor its device is full."""
    def value(name: str) -> float:
        return samples[(name, (("queue_key", key),))]

    return (value("troupe_queue_depth") > 0 and value("troupe_queue_running") < value("troupe_queue_limit")
            and value("troupe_queue_device_running") < value("troupe_queue_device_limit"))


@pytest.mark.timeout(180)
def test_queue_gauges_say_a_key_waits_for_the_device_it_shares_with_a_same_machine_worker(make_server, tmp_path):
    server = make_server(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="2")
    here = server.get("/api/info")["machine_id"]
    agent = start_agent(server, tmp_path, enroll(server, name="beside")["command"], machine=here)
    try:
        read_until(agent, "connected as beside")
        remote = [server.submit(sleeper(seconds=60), target={"worker": "beside"})["run_id"] for _ in range(2)]
        for run_id in remote:
            server.wait_status(run_id, "running")
        local = [server.submit(sleeper(seconds=0.1))["run_id"] for _ in range(3)]
        server.poll_until(lambda: _queue_rows(server)["cpu"]["queued"] == 3)
        rows = _queue_rows(server)
        # The key's own counts read as a free slot; its device says it is held through the worker's key.
        assert (rows["cpu"]["running"], rows["cpu"]["limit"]) == (0, 2)
        share = {"device": f"cpu@{here}", "queue_keys": ["beside/cpu", "cpu"],
                 "limit": min(rows["cpu"]["limit"], rows["beside/cpu"]["limit"]), "running": 2}
        assert rows["cpu"]["shares"] == share and rows["beside/cpu"]["shares"] == share
        samples = _samples(_scrape(server)[1])
        for key in ("cpu", "beside/cpu"):
            assert samples[("troupe_queue_device_running", (("queue_key", key),))] == 2
            assert samples[("troupe_queue_device_limit", (("queue_key", key),))] == share["limit"]
            assert samples[("troupe_queue_shared_device", (("device", f"cpu@{here}"), ("queue_key", key)))] == 1
            assert not _waits_with_a_slot_free(samples, key)
        assert samples[("troupe_queue_depth", (("queue_key", "cpu"),))] == 3  # the existing series stay
        for run_id in remote:
            server.client.request("POST", f"/api/runs/{run_id}/cancel")
        for run_id in local:
            server.wait_status(run_id, "succeeded", timeout=60)
        agent.terminate()
        agent.wait(30)
        server.poll_until(lambda: _queue_rows(server)["cpu"]["shares"] is None)  # the worker gone: its own quota
        samples = _samples(_scrape(server)[1])
        assert not any(name == "troupe_queue_shared_device" for name, _ in samples)
        assert samples[("troupe_queue_device_limit", (("queue_key", "cpu"),))] == 2
    finally:
        agent.terminate()
        agent.wait(30)
