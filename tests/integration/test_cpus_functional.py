"""Declared cpus through the real server: nodes that do not fit wait, visibly."""

from __future__ import annotations

from tests.helpers import Server, graph


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


def test_declaring_more_cpus_than_the_server_lends_is_cut_down_with_a_warning(make_server):
    # 003: a graph written for a cluster has to run on a laptop.
    server = make_server(TROUPE_CPUS="2")
    reply = server.submit(sleepers((0, 1), (0, 3)))
    assert reply["warnings"] == ["node z1 asks for 3 cpus; this server lends (TROUPE_CPUS) 2: cut down to 2"]
    events = server.events_until_finished(reply["run_id"])
    warning = next(e for e in events if e["type"] == "warning")
    assert (warning["node_id"], warning["payload"]["code"]) == ("z1", "resources_cut_down")
    assert events[-1]["payload"]["status"] == "succeeded"
    assert server.get(f"/api/runs/{reply['run_id']}")["graph"]["nodes"][1]["resources"] == {"cpus": 3}  # as sent
    assert server.get("/api/info")["limits"]["cpus"] == 2


def _without_operator_caps(server):
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        server.env.pop(name, None)
    return server.start()


def test_a_node_that_declares_nothing_gets_its_share_of_the_cpus_as_thread_cap(tmp_path):
    server = _without_operator_caps(Server(tmp_path / "home", TROUPE_CPUS="4", TROUPE_MAX_PARALLEL_NODES="2"))
    try:
        run_id = server.submit(graph(
            {"id": "free", "type": "core.Sleep", "params": {"seconds": 0}},
            {"id": "held", "type": "core.Sleep", "params": {"seconds": 0}, "resources": {"cpus": 3}},
        ))["run_id"]
        started = {e["node_id"]: e["payload"] for e in server.events_until_finished(run_id)
                   if e["type"] == "node_started"}
        # TROUPE_CPUS / TROUPE_MAX_PARALLEL_NODES, not all of TROUPE_CPUS; declared cpus win.
        assert started["free"]["threads"] == 2 and started["held"]["threads"] == 3
    finally:
        server.kill()


def test_an_operators_own_thread_cap_still_wins(make_server):
    server = make_server(TROUPE_CPUS="4", TROUPE_MAX_PARALLEL_NODES="2", OMP_NUM_THREADS="3")
    run_id = server.submit(graph({"id": "free", "type": "core.Sleep", "params": {"seconds": 0}}))["run_id"]
    started = [e for e in server.events_until_finished(run_id) if e["type"] == "node_started"]
    assert started[0]["payload"]["threads"] == 3


def test_a_node_waiting_for_cpus_holds_no_slot_of_its_run(make_server):
    # One slot per run: a node waiting for cpus that another run holds must not keep
    # its run's undeclared node from running (resources are claimed before a slot).
    server = make_server(TROUPE_CPUS="2", TROUPE_MAX_PARALLEL_NODES="1")
    holder = server.submit(sleepers((3, 2)))["run_id"]
    for kind, data in server.client.stream(f"/api/runs/{holder}/stream", read_timeout=30):
        if kind == "run_event" and data["type"] == "node_started":
            break
    waiter = server.submit(graph(
        {"id": "needs", "type": "core.Sleep", "params": {"seconds": 0}, "resources": {"cpus": 2}},
        {"id": "quick", "type": "core.Sleep", "params": {"seconds": 0}},
    ))["run_id"]
    events = server.events_until_finished(waiter)
    assert events[-1]["payload"]["status"] == "succeeded"
    order = [(e["type"], e["node_id"]) for e in events if e["node_id"]]
    # It waited for the cpus (whether the ledger's answer or the 0 s node came first is a
    # race), and its run's one slot went to the other node meanwhile.
    assert ("node_queued", "needs") in order
    assert order.index(("node_finished", "quick")) < order.index(("node_started", "needs"))
    # ... and "quick" ran while the holder still held the cpus, not after.
    quick_done = next(e["ts"] for e in events if e["type"] == "node_finished" and e["node_id"] == "quick")
    holder_done = server.events_until_finished(holder)[-1]["ts"]
    assert quick_done < holder_done
