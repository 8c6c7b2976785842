"""The environment fingerprint (issue 16, point 4): taken by the process that executes
the run, the server for its own runs and the run's child on a worker; equal digests mean
equal environments, and a comparison lists the fields that differ."""

from __future__ import annotations

from tests.helpers import hello
from tests.integration.test_workers_functional import enroll, read_until, start_agent


def test_both_paths_record_what_executed_them_and_a_comparison_finds_what_differs(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    local = server.submit(hello())["run_id"]
    again = server.submit(hello())["run_id"]
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"])
    try:
        read_until(agent, "connected as gpu-a")
        remote = server.submit(hello(), target={"worker": "gpu-a"})["run_id"]
        for run_id in (local, again, remote):
            events = server.events_until_finished(run_id)
            assert events[-1]["payload"]["status"] == "succeeded"
            assert not any(e["type"] == "environment" for e in events)  # a fact of the run, not a log event
    finally:
        agent.terminate()
        agent.wait(30)
    mine = server.get(f"/api/runs/{local}")["execution_facts"]
    theirs = server.get(f"/api/runs/{remote}")["execution_facts"]
    assert (mine["fingerprint_source"], theirs["fingerprint_source"]) == ("control_plane", "run_process")
    assert mine["fingerprint"]["schema"] == 2 and mine["fingerprint"]["torch"]["version"].startswith("2.13.0")
    assert {p["name"] for p in mine["fingerprint"]["packs"]} >= {"core", "torch"}
    same = server.get(f"/api/runs/{local}/fingerprint?against={again}")
    assert same["fingerprint_digest"] == same["against"]["fingerprint_digest"] and same["against"]["differs"] == {}
    compared = server.get(f"/api/runs/{local}/fingerprint?against={remote}")
    differs = compared["against"]["differs"]
    assert compared["fingerprint_digest"] != compared["against"]["fingerprint_digest"]
    assert differs["env.CUDA_VISIBLE_DEVICES"]["other"] == ""  # the child sees only its run's cards: none
    assert "packs.core.digest" not in differs  # one checkout, one code
    status, reply = server.client.request("GET", f"/api/runs/{local}/fingerprint?against=nope")
    assert (status, reply["error"]["pointer"]) == (400, "?against")
