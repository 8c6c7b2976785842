"""Declared cpus through the real server: nodes that do not fit wait, visibly."""

from __future__ import annotations

from tests.helpers import graph


def sleepers(*seconds_and_cpus):
    nodes = [{"id": f"z{i}", "type": "core.Sleep", "params": {"seconds": s}, "resources": {"cpus": c}}
             for i, (s, c) in enumerate(seconds_and_cpus)]
    return graph(*nodes)


def test_a_node_that_does_not_fit_waits_and_says_why(make_server):
    server = make_server(TROUPE_CPUS="1")
    run_id = server.submit(sleepers((0.3, 1), (0.3, 1)))["run_id"]
    events = server.events_until_finished(run_id)
    assert events[-1]["payload"]["status"] == "succeeded"
    order = [(e["type"], e["node_id"]) for e in events if e["node_id"]]
    queued = next(e for e in events if e["type"] == "node_queued")
    waiter = queued["node_id"]
    holder = "z0" if waiter == "z1" else "z1"
    assert queued["payload"]["cpus"] == 1 and "0 of 1 free" in queued["payload"]["reason"]
    assert order.index(("node_finished", holder)) < order.index(("node_started", waiter))


def test_resources_show_holders_and_waiters(make_server):
    server = make_server(TROUPE_CPUS="1")
    run_id = server.submit(sleepers((30, 1), (30, 1)))["run_id"]
    for kind, data in server.client.stream(f"/api/runs/{run_id}/stream", read_timeout=30):
        if kind == "run_event" and data["type"] == "node_queued":
            break
    cpus = server.get("/api/resources")["cpus"]
    assert cpus["total"] == 1 and cpus["free"] == 0
    assert len(cpus["holders"]) == 1 and len(cpus["waiters"]) == 1
    assert cpus["holders"][0]["run_id"] == run_id
    server.client.request("POST", f"/api/runs/{run_id}/cancel")
    assert server.events_until_finished(run_id)[-1]["payload"]["status"] == "cancelled"
    cpus = server.get("/api/resources")["cpus"]
    assert cpus["free"] == 1 and cpus["waiters"] == []


def test_declaring_more_cpus_than_the_server_lends_is_refused(make_server):
    server = make_server(TROUPE_CPUS="2")
    error = server.submit(sleepers((0, 1), (0, 3)), expect=400)["error"]
    assert error["code"] == "cpus_unavailable" and error["pointer"] == "/graph/nodes/1/resources/cpus"
    assert server.get("/api/info")["limits"]["cpus"] == 2
