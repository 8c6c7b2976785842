"""Recorded outputs of worker runs (issue 16, point 2; #789): they stay on the worker and
are read through its connection; with the worker gone the read is a 503, never an empty
answer; the worker applies TROUPE_RECORDED_OUTPUTS_KEEP to what it keeps."""

from __future__ import annotations

from tests.helpers import hello
from tests.integration.test_workers_functional import enroll, read_until, start_agent


def test_a_worker_runs_outputs_are_read_through_its_connection(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"], TROUPE_RECORDED_OUTPUTS_KEEP="1")
    try:
        read_until(agent, "connected as gpu-a")
        first = server.submit(hello(), target={"worker": "gpu-a"}, record_outputs=True)["run_id"]
        events = server.events_until_finished(first, timeout=90)
        assert events[-1]["payload"]["status"] == "succeeded"
        finished = {e["node_id"]: e["payload"]["outputs"] for e in events if e["type"] == "node_finished"}
        read = server.get(f"/api/runs/{first}/outputs")
        assert read["record_outputs"] is True and read["outputs"] == finished
        assert read["outputs"]["s"] == {"sum": 5}
        assert server.get(f"/api/runs/{first}/outputs/s") == {"run_id": first, "node_id": "s", "outputs": {"sum": 5}}

        second = server.submit(hello(), target={"worker": "gpu-a"}, record_outputs=True)["run_id"]
        assert server.events_until_finished(second, timeout=90)[-1]["payload"]["status"] == "succeeded"
        assert server.get(f"/api/runs/{second}/outputs")["outputs"]["s"] == {"sum": 5}
        # The worker keeps one run's outputs (its own TROUPE_RECORDED_OUTPUTS_KEEP).
        assert server.get(f"/api/runs/{first}/outputs")["outputs"] == {}
        status, reply = server.client.request("GET", f"/api/runs/{first}/outputs/s")
        assert (status, reply["error"]["code"]) == (404, "outputs_not_found")
    finally:
        agent.terminate()
        agent.wait(30)
    server.poll_until(lambda: server.get("/api/workers")["workers"][0]["state"] == "disconnected")
    for path in (f"/api/runs/{second}/outputs", f"/api/runs/{second}/outputs/s"):
        status, reply = server.client.request("GET", path)
        assert (status, reply["error"]["code"]) == (503, "worker_offline"), reply
