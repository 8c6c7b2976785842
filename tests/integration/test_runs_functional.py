"""Submitting, following, reading and deleting runs through the real HTTP API."""

from __future__ import annotations

import http.client
from urllib.parse import urlsplit

from tests.helpers import edge, graph, hello, node


def test_hello_succeeds_with_events_metrics_and_final_loss(shared_server):
    reply = shared_server.submit(hello())
    assert reply["status"] == "queued"
    assert reply["device"] == "cpu" and reply["queue_key"] == "cpu" and reply["lane"] == "queued"
    assert len(reply["run_id"]) == 32
    events = shared_server.events_until_finished(reply["run_id"])
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[0]["type"] == "run_queued" and events[-1]["payload"]["status"] == "succeeded"
    row = shared_server.get(f"/api/runs/{reply['run_id']}")
    assert row["status"] == "succeeded" and row["final_loss"] == 5.0
    assert row["started_at"] and row["finished_at"] and row["queue_position"] is None
    metrics = shared_server.get(f"/api/runs/{reply['run_id']}/metrics")
    assert metrics["series"]["val_loss"][0]["value"] == 5.0
    status, csv = shared_server.client.request("GET", f"/api/runs/{reply['run_id']}/metrics?format=csv")
    assert status == 200
    lines = csv.strip().splitlines() if isinstance(csv, str) else []
    assert lines[0] == "series,step,value,ts" and lines[1].startswith("val_loss,1,5.0,")


def test_final_loss_falls_back_to_train_loss(shared_server):
    g = graph(node("c", "core.Constant", value=0.25), node("m", "core.LogMetric", name="train_loss"),
              edges=(edge("c", "value", "m", "value"),))
    run_id = shared_server.submit(g)["run_id"]
    shared_server.events_until_finished(run_id)
    assert shared_server.get(f"/api/runs/{run_id}")["final_loss"] == 0.25


def test_failing_node_fails_the_run_with_its_error(shared_server):
    g = graph(node("boom", "core.Fail", message="no good"))
    run_id = shared_server.submit(g)["run_id"]
    events = shared_server.events_until_finished(run_id)
    failed = [e for e in events if e["type"] == "node_failed"]
    assert failed and failed[0]["node_id"] == "boom" and "no good" in failed[0]["payload"]["error"]
    row = shared_server.get(f"/api/runs/{run_id}")
    assert row["status"] == "failed" and "no good" in row["error"]


def test_list_is_newest_first_and_pages_with_cursor(shared_server):
    ids = [shared_server.submit(hello(), )["run_id"] for _ in range(3)]
    for run_id in ids:
        shared_server.events_until_finished(run_id)
    first = shared_server.get("/api/runs?limit=2")
    assert [r["id"] for r in first["runs"]] == ids[::-1][:2]
    assert first["next_cursor"]
    second = shared_server.get(f"/api/runs?limit=2&cursor={first['next_cursor']}")
    assert second["runs"][0]["id"] == ids[0]
    succeeded = shared_server.get("/api/runs?status=succeeded&limit=500")
    assert all(r["status"] == "succeeded" for r in succeeded["runs"])


def test_delete_removes_a_finished_run_and_refuses_an_active_one(shared_server):
    run_id = shared_server.submit(hello())["run_id"]
    shared_server.events_until_finished(run_id)
    status, _ = shared_server.client.request("DELETE", f"/api/runs/{run_id}")
    assert status == 200
    status, reply = shared_server.client.request("GET", f"/api/runs/{run_id}")
    assert status == 404 and reply["error"]["code"] == "run_not_found"
    status, _ = shared_server.client.request("GET", f"/api/runs/{run_id}/events")
    assert status == 404
    active = shared_server.submit(graph(node("z", "core.Sleep", seconds=30)))["run_id"]
    status, reply = shared_server.client.request("DELETE", f"/api/runs/{active}")
    assert status == 409 and reply["error"]["code"] == "run_active"
    shared_server.client.request("POST", f"/api/runs/{active}/cancel")
    shared_server.wait_status(active, "cancelled")


def test_meta_routes_answer(shared_server):
    info = shared_server.get("/api/info")
    assert info["name"] == "troupe" and "cpu" in info["devices"]
    assert info["capabilities"]["workers"] is True and info["capabilities"]["sweeps"] is True
    # The server sets a short GIL switch interval and never imports torch itself.
    assert info["runtime"] == {"switch_interval_s": 0.0005, "torch_imported": False}
    nodes = {n["type"] for n in shared_server.get("/api/nodes")["nodes"]}
    assert {"core.Constant", "core.Add", "core.Multiply", "core.Sleep", "core.Fail", "core.LogMetric",
            "core.Print"} <= nodes
    examples = shared_server.get("/api/examples")["examples"]
    assert "hello" in {e["name"] for e in examples}
    doc = shared_server.get("/api/openapi.json")
    assert "/api/runs" in doc["paths"] and "SubmitRun" in doc["components"]["schemas"]
    status, text = shared_server.client.request("GET", "/metrics")
    assert status == 200 and "troupe_runs{state=\"succeeded\"}" in text


def test_stream_replays_from_after_without_gaps_or_duplicates(shared_server):
    run_id = shared_server.submit(hello())["run_id"]
    everything = shared_server.events_until_finished(run_id)
    later = []
    for kind, data in shared_server.client.stream(f"/api/runs/{run_id}/stream?after=3", read_timeout=10):
        if kind == "run_event":
            later.append(data)
    assert later == everything[3:]


def test_stream_of_an_unknown_run_is_a_404_and_a_finished_run_streams_its_whole_log(shared_server):
    status, reply = shared_server.client.request("GET", "/api/runs/" + "0" * 32 + "/stream")
    assert status == 404 and reply["error"]["code"] == "run_not_found"
    run_id = shared_server.submit(hello())["run_id"]
    everything = shared_server.events_until_finished(run_id)
    # Everything is already stored: one replay, the stream ends after run_finished.
    again = [data for kind, data in shared_server.client.stream(f"/api/runs/{run_id}/stream", read_timeout=10)
             if kind == "run_event"]
    assert again == everything and again[-1]["type"] == "run_finished"
    # After the last seq there is nothing left to send, yet the stream opens (and waits).
    conn = http.client.HTTPConnection(urlsplit(shared_server.url).netloc, timeout=10)
    try:
        conn.request("GET", f"/api/runs/{run_id}/stream?after={len(everything)}",
                     headers={"Authorization": f"Bearer {shared_server.token}"})
        response = conn.getresponse()
        assert response.status == 200 and response.getheader("Content-Type") == "text/event-stream"
    finally:
        conn.close()


def test_global_stream_announces_created_and_status_changes(shared_server):
    seen, run_id = [], None
    for kind, data in shared_server.client.stream("/api/stream", read_timeout=30):
        if kind == "hello":
            run_id = shared_server.submit(hello())["run_id"]
        elif kind == "run" and data["run_id"] == run_id:
            seen.append((data["kind"], data.get("status")))
            if data.get("status") == "succeeded":
                break
    # hello's few quick nodes are walked as it starts: its row goes from queued to its end
    # in one write, and a status is announced as it is committed.
    assert seen == [("created", "queued"), ("status", "succeeded")]


def test_prometheus_metrics_count_queues_and_runs(shared_server):
    run_id = shared_server.submit(graph(node("z", "core.Sleep", seconds=30)), device="cuda:1")["run_id"]
    waiting = shared_server.submit(graph(node("z", "core.Sleep", seconds=30)), device="cuda:1")["run_id"]
    shared_server.wait_status(run_id, "running")
    status, text = shared_server.client.request("GET", "/metrics")
    assert status == 200
    assert 'troupe_queue_depth{queue_key="cuda:1"} 1.0' in text
    assert 'troupe_queue_running{queue_key="cuda:1"} 1.0' in text
    assert 'troupe_runs{state="running"}' in text and 'troupe_workers{state="connected"} 0.0' in text
    for rid in (waiting, run_id):
        shared_server.client.request("POST", f"/api/runs/{rid}/cancel")
    shared_server.wait_status(run_id, "cancelled")
