"""Per-key FIFO queues, positions, cancel, and lanes, through the real server."""

from __future__ import annotations

import pytest

from tests.helpers import graph, hello, node, sleeper


def positions(server, ids):
    rows = {r["id"]: r for r in server.get("/api/runs?limit=500")["runs"]}
    return [rows[i]["queue_position"] for i in ids]


def test_positions_count_only_the_runs_ahead_on_the_same_key(make_server):
    server = make_server(TROUPE_SIMULATED_ACCELERATORS="cuda:0", TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="1")
    cpu = [server.submit(sleeper(device="cpu"))["run_id"] for _ in range(3)]
    gpu = [server.submit(sleeper(device="cuda"))["run_id"] for _ in range(2)]
    server.wait_status(cpu[0], "running")
    server.wait_status(gpu[0], "running")
    assert positions(server, cpu) == [None, 1, 2]
    assert positions(server, gpu) == [None, 1]
    reply = server.submit(sleeper(device="cuda:0"))
    assert reply["queue_key"] == "cuda:0" and reply["queue_position"] == 2
    queues = {q["queue_key"]: q for q in server.get("/api/queues")["queues"]}
    assert queues["cpu"] == {"queue_key": "cpu", "limit": 1, "running": 1, "queued": 2, "state": "ok", "reason": None,
                             "shares": None}  # no worker shares the server's cpu
    assert queues["cuda:0"]["limit"] == 1 and queues["cuda:0"]["queued"] == 2


def test_a_queued_run_says_what_it_waits_for(make_server):
    server = make_server(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="1")
    first, second = (server.submit(sleeper())["run_id"] for _ in range(2))
    server.wait_status(first, "running")
    rows = {r["id"]: r for r in server.get("/api/runs")["runs"]}
    assert rows[first]["queue_reason"] is None
    assert rows[second]["queue_reason"] == {"code": "slots_busy",
                                            "message": "#1 in line for cpu: 1 of 1 slots busy"}
    assert server.get(f"/api/runs/{second}")["queue_reason"]["code"] == "slots_busy"


def test_a_run_waiting_at_the_seed_gate_is_queued_not_running(make_server):
    # The cpu queue has a free slot and hands the second run on, but the placer holds it
    # at the seed gate: it counts as queued, and says so.
    server = make_server(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="2")
    seeded = server.submit(sleeper(), seed=7)["run_id"]
    server.wait_status(seeded, "running")
    said = server.get("/api/queue-prediction?queue_key=cpu&seeded=false")  # asked before it is queued
    assert not said["starts"] and said["reason"]["code"] == "seed_gate", said
    waiting = server.submit(sleeper())["run_id"]
    row = server.get(f"/api/runs/{waiting}")
    assert row["status"] == "queued"
    assert row["queue_reason"]["code"] == "seed_gate" and "seeded run" in row["queue_reason"]["message"]
    queues = {q["queue_key"]: q for q in server.get("/api/queues")["queues"]}
    assert queues["cpu"]["running"] == 1 and queues["cpu"]["queued"] == 1
    # The held run takes the second slot: a third run waits for a slot, both busy.
    third = server.submit(sleeper())["run_id"]
    busy = "2 of 2 slots busy (1 by a run that waits to start)"
    assert server.get(f"/api/runs/{third}")["queue_reason"] == {"code": "slots_busy",
                                                                 "message": f"#2 in line for cpu: {busy}"}
    said = server.get("/api/queue-prediction?queue_key=cpu")["reason"]
    assert said == {"code": "slots_busy", "message": f"#3 in line for cpu: {busy}"}, said


def test_cancel_queued_removes_it_and_followers_move_up(make_server):
    server = make_server(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="1")
    ids = [server.submit(sleeper())["run_id"] for _ in range(3)]
    server.wait_status(ids[0], "running")
    status, reply = server.client.request("POST", f"/api/runs/{ids[1]}/cancel")
    assert status == 200 and reply["status"] == "cancelled"
    row = server.get(f"/api/runs/{ids[1]}")
    assert row["status"] == "cancelled" and row["started_at"] is None
    events = server.get(f"/api/runs/{ids[1]}/events")["events"]
    assert [e["type"] for e in events] == ["run_queued", "run_finished"]
    assert events[-1]["payload"]["status"] == "cancelled"
    assert positions(server, ids[2:]) == [1]
    status, reply = server.client.request("POST", f"/api/runs/{ids[1]}/cancel")
    assert status == 409 and reply["error"]["code"] == "run_finished"


def test_cancel_running_stops_cooperatively_and_frees_the_slot(make_server):
    server = make_server(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="1")
    first = server.submit(sleeper(seconds=60))["run_id"]
    second = server.submit(hello())["run_id"]
    server.wait_status(first, "running")
    status, reply = server.client.request("POST", f"/api/runs/{first}/cancel")
    assert status == 200 and reply["status"] == "running"
    events = server.events_until_finished(first)
    assert events[-1]["payload"]["status"] == "cancelled"
    row = server.get(f"/api/runs/{first}")
    assert row["status"] == "cancelled" and row["started_at"] is not None
    assert server.events_until_finished(second)[-1]["payload"]["status"] == "succeeded"


def test_fifo_within_a_key(make_server):
    server = make_server(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="1")
    ids = [server.submit(graph(node("z", "core.Sleep", seconds=0.05)))["run_id"] for _ in range(5)]
    server.events_until_finished(ids[-1])
    started = [server.get(f"/api/runs/{i}")["started_at"] for i in ids]
    assert started == sorted(started)


def test_interactive_lane_needs_an_editor_session(shared_server):
    status, reply = shared_server.client.request(
        "POST", "/api/runs", {"graph": hello(), "options": {"lane": "interactive"}}
    )
    assert status == 400 and reply["error"]["pointer"] == "/options/editor_session"


def test_interactive_lane_limits_refuse_at_once_and_release_with_the_graph(make_server):
    server = make_server(TROUPE_RUN_INTERACTIVE_MAX_CONCURRENT="2", TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="1")
    blocker = server.submit(sleeper())["run_id"]  # fills the cpu queue: interactive bypasses it
    server.wait_status(blocker, "running")
    one = server.submit(sleeper(), lane="interactive", editor_session="tab-1")
    assert one["lane"] == "interactive" and one["queue_position"] is None
    server.wait_status(one["run_id"], "running")
    busy = server.submit(hello(), expect=503, lane="interactive", editor_session="tab-1")
    assert busy["error"]["code"] == "editor_session_busy"
    server.submit(sleeper(), lane="interactive", editor_session="tab-2")
    full = server.submit(hello(), expect=503, lane="interactive", editor_session="tab-3")
    assert full["error"]["code"] == "interactive_lane_full"
    # The lane and session counters come back as soon as the graph ends: a client that
    # saw run_finished and submits again at once is never refused.
    server.client.request("POST", f"/api/runs/{one['run_id']}/cancel")
    server.events_until_finished(one["run_id"])
    again = server.submit(hello(), lane="interactive", editor_session="tab-1")
    assert server.events_until_finished(again["run_id"])[-1]["payload"]["status"] == "succeeded"


def test_rerun_after_run_finished_is_never_refused(make_server):
    server = make_server()
    for _ in range(20):
        run = server.submit(hello(), lane="interactive", editor_session="editor")
        assert server.events_until_finished(run["run_id"])[-1]["payload"]["status"] == "succeeded"


def test_seed_gate_refuses_interactive_beside_a_seeded_run(make_server):
    server = make_server()
    seeded = server.submit(sleeper(), seed=7)["run_id"]
    server.wait_status(seeded, "running")
    refused = server.submit(hello(), expect=503, lane="interactive", editor_session="e")
    assert refused["error"]["code"] == "seed_gate_closed"
    # A queued run waits for the seeded one rather than starting beside it.
    follower = server.submit(hello())["run_id"]
    assert server.get(f"/api/runs/{follower}")["status"] == "queued"
    server.client.request("POST", f"/api/runs/{seeded}/cancel")
    assert server.events_until_finished(follower)[-1]["payload"]["status"] == "succeeded"


def test_seeded_run_waits_for_running_ones(make_server):
    server = make_server(TROUPE_SIMULATED_ACCELERATORS="cuda:0")
    other = server.submit(sleeper(device="cuda:0"))["run_id"]
    server.wait_status(other, "running")
    seeded = server.submit(hello(), seed=3)["run_id"]
    row = server.get(f"/api/runs/{seeded}")
    assert row["status"] == "queued"
    server.client.request("POST", f"/api/runs/{other}/cancel")
    events = server.events_until_finished(seeded)
    assert events[-1]["payload"]["status"] == "succeeded"
    started = next(e for e in events if e["type"] == "run_started")
    assert started["payload"]["seed"] == 3


@pytest.mark.parametrize("device, key, warned", [("cuda", "cuda:0", False), ("mps", "cpu", True),
                                                 ("cuda:7", "cpu", True), ("auto", "cuda:0", False)])
def test_device_resolution(shared_server, device, key, warned):
    reply = shared_server.submit(hello(), device=device)
    assert reply["queue_key"] == key
    assert bool(reply["warnings"]) == warned
    events = shared_server.events_until_finished(reply["run_id"])
    assert any(e["type"] == "warning" for e in events) == warned


def test_device_comes_from_the_graph_settings_when_options_have_none(shared_server):
    g = hello()
    g["settings"] = {"device": "cuda:1"}
    assert shared_server.submit(g)["queue_key"] == "cuda:1"
    g["settings"] = {"device": "tpu"}
    bad = shared_server.submit(g, expect=400)
    assert bad["error"]["pointer"] == "/graph/settings/device"


def test_plain_cuda_follows_the_current_device(make_server):
    # 002: on a multi-card machine plain cuda is the process's current device, which
    # CUDA_VISIBLE_DEVICES sets (its first entry), not always cuda:0.
    server = make_server(TROUPE_SIMULATED_ACCELERATORS="cuda:0,cuda:1,cuda:2", CUDA_VISIBLE_DEVICES="2,1")
    assert server.get("/api/info")["devices"] == ["cpu", "cuda:2", "cuda:1"]
    for device in ("cuda", "auto", "cuda:2"):
        reply = server.submit(hello(), device=device)
        assert (reply["queue_key"], reply["warnings"]) == ("cuda:2", []), device
        assert server.events_until_finished(reply["run_id"])[-1]["payload"]["status"] == "succeeded"
    assert server.submit(hello(), device="cuda:1")["queue_key"] == "cuda:1"
    hidden = server.submit(hello(), device="cuda:0")  # a card this server may not use
    assert hidden["queue_key"] == "cpu" and "cuda:0" in hidden["warnings"][0]
