"""Target ``any``: the placer picks the worker, across every attached machine."""

from __future__ import annotations

import pytest

from tests.faultproxy import FaultProxy
from tests.helpers import hello, sleeper
from tests.integration.test_workers_functional import CARD, enroll, handshake, read_until, start_agent
from tests.integration.test_workers_functional import hello as hello_frame
from troupe.protocol.events import utc_now

ANYWHERE = {"worker": "any"}


@pytest.fixture
def two_workers(make_server, tmp_path):
    """gpu-a and gpu-b, each with a card of its own (different UUIDs) and its own cpu."""
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agents = []
    for name, uuid in (("gpu-a", "GPU-aaaa"), ("gpu-b", "GPU-bbbb")):
        agent = start_agent(server, tmp_path / name, enroll(server, name=name)["command"], machine=f"m-{name}",
                            cards=({**CARD, "uuid": uuid},))
        read_until(agent, f"connected as {name}")
        agents.append(agent)
    yield server
    for agent in agents:
        agent.terminate()
        agent.wait(30)


def test_any_spreads_runs_over_free_cards_and_the_next_waits_for_a_release(two_workers):
    server = two_workers
    first = server.submit(sleeper(seconds=60), device="auto", target=ANYWHERE)
    assert first["queue_key"] == "any/auto" and first["device"] == "auto"
    second = server.submit(sleeper(seconds=60), device="auto", target=ANYWHERE)["run_id"]
    server.wait_status(first["run_id"], "running")
    server.wait_status(second, "running")
    placed = {server.get(f"/api/runs/{run_id}")["worker"] for run_id in (first["run_id"], second)}
    assert placed == {"gpu-a", "gpu-b"}  # one card each: both run at once
    assert {server.get(f"/api/runs/{r}")["device"] for r in (first["run_id"], second)} == {"cuda:0"}
    third = server.submit(hello(), device="auto", target=ANYWHERE)
    assert third["queue_position"] == 1
    assert server.get(f"/api/runs/{third['run_id']}")["status"] == "queued"  # every card is taken
    freed_at = utc_now()
    server.client.request("POST", f"/api/runs/{first['run_id']}/cancel")
    events = server.events_until_finished(third["run_id"])
    started = next(e for e in events if e["type"] == "run_started")
    freed = server.get(f"/api/runs/{first['run_id']}")["worker"]
    assert started["payload"]["worker"] == freed and started["payload"]["device"] == "cuda:0"
    assert events[-1]["payload"]["status"] == "succeeded" and started["ts"] > freed_at
    # cpu runs for any land on a worker's cpu even while both cards are busy.
    on_cpu = server.submit(hello(), device="cpu", target=ANYWHERE)
    assert on_cpu["queue_key"] == "any/cpu"
    assert server.events_until_finished(on_cpu["run_id"])[-1]["payload"]["status"] == "succeeded"
    server.client.request("POST", f"/api/runs/{second}/cancel")


def test_any_waits_for_a_worker_when_none_was_seen_yet(make_server, tmp_path):
    # #777: a run for any with no eligible worker connected waits (wait false refuses it).
    server = make_server()
    refused = server.submit(hello(), expect=503, target={**ANYWHERE, "wait": False})
    assert refused["error"]["code"] == "worker_offline"
    waiting = server.submit(hello(), target=ANYWHERE)
    row = server.get(f"/api/runs/{waiting['run_id']}")
    assert waiting["queue_key"] == "any/cpu" and row["status"] == "queued"
    assert row["queue_reason"]["code"] == "no_free_worker"
    agent = start_agent(server, tmp_path, enroll(server, name="late")["command"])
    try:
        assert server.events_until_finished(waiting["run_id"])[-1]["payload"]["status"] == "succeeded"
        assert server.get(f"/api/runs/{waiting['run_id']}")["worker"] == "late"
    finally:
        agent.terminate()
        agent.wait(30)


async def test_any_refuses_a_graph_no_seen_worker_could_run_with_the_numbers(make_server):
    server = make_server()
    await handshake(server, hello_frame(name="old-agent", catalog_digest="x", node_types=["core.Constant"]))
    refused = server.submit(hello(), expect=400, target=ANYWHERE)
    assert refused["error"]["code"] == "no_eligible_worker"
    assert "1 seen" in refused["error"]["message"] and "old-agent lacks core.Add" in refused["error"]["message"]


def test_any_and_local_are_not_worker_names(make_server):
    server = make_server()
    for word in ("any", "local"):
        status, reply = server.client.request("POST", "/api/workers/enrollments", {"name": word})
        assert status == 400 and reply["error"]["pointer"] == "/name"


def test_a_same_machine_worker_shares_the_servers_cpu_quota(make_server, tmp_path):
    # #842 for the cpu: an agent on the server's own machine (same machine id) offers the
    # cpu the server runs on; at limit 1 only one run uses it, local or on the worker.
    server = make_server(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="1")
    here = server.get("/api/info")["machine_id"]
    join = enroll(server, name="beside")["command"]
    local = server.submit(sleeper(seconds=60))["run_id"]
    server.wait_status(local, "running")  # before the agent attaches: it counts all the same
    agent = start_agent(server, tmp_path, join, machine=here)
    try:
        read_until(agent, "connected as beside")
        # Asked before, the server says the worker run would wait, by the same books it admits by.
        said = server.get("/api/queue-prediction?queue_key=beside/cpu")
        assert not said["starts"] and said["reason"]["code"] == "device_busy", said
        assert "the CPU that" in said["reason"]["message"] and here not in said["reason"]["message"]
        remote = server.submit(hello(), target={"worker": "beside"})["run_id"]
        assert server.get(f"/api/runs/{remote}")["status"] == "queued"  # the one cpu slot is taken
        freed_at = utc_now()
        server.client.request("POST", f"/api/runs/{local}/cancel")
        assert server.events_until_finished(remote)[-1]["payload"]["status"] == "succeeded"
        assert server.get(f"/api/runs/{remote}")["started_at"] > freed_at  # it waited for the slot
        # The other way round: a worker run holds the cpu and a local run waits for it.
        remote = server.submit(sleeper(seconds=60), target={"worker": "beside"})["run_id"]
        server.wait_status(remote, "running")
        said = server.get("/api/queue-prediction?queue_key=cpu")
        assert (said["starts"], said["reason"]["code"]) == (False, "device_busy"), said  # its queue is empty
        local = server.submit(hello())["run_id"]
        assert server.get(f"/api/runs/{local}")["status"] == "queued"
        freed_at = utc_now()
        server.client.request("POST", f"/api/runs/{remote}/cancel")
        assert server.events_until_finished(local)[-1]["payload"]["status"] == "succeeded"
        assert server.get(f"/api/runs/{local}")["started_at"] > freed_at
        assert server.get("/api/queue-prediction?queue_key=cpu")["starts"] is True
        status, reply = server.client.request("GET", "/api/queue-prediction?queue_key=Not%20a%20key")
        assert (status, reply["error"]["pointer"]) == (400, "?queue_key")
    finally:
        agent.terminate()
        agent.wait(30)


def test_a_same_machine_worker_reports_mps_and_shares_the_servers_mps_quota(make_server, tmp_path):
    # Decision log 2026-10-18: the same machine's mps:0 is one quota, the server's and
    # its worker's, as its cpu is.
    server = make_server(TROUPE_SIMULATED_ACCELERATORS="mps:0")
    here = server.get("/api/info")["machine_id"]
    agent = start_agent(server, tmp_path, enroll(server, name="beside")["command"], machine=here, cards=(), mps=True)
    try:
        read_until(agent, "connected as beside")
        slots = {s["device"]: s for s in server.get("/api/workers")["workers"][0]["slots"]}
        assert slots["mps:0"]["physical_id"] == f"mps:0@{here}"
        local = server.submit(sleeper(seconds=60), device="mps")["run_id"]
        server.wait_status(local, "running")
        remote = server.submit(hello(), device="mps", target={"worker": "beside"})
        assert remote["queue_key"] == "beside/mps:0" and not remote["warnings"]
        row = server.get(f"/api/runs/{remote['run_id']}")
        assert row["status"] == "queued" and row["queue_reason"]["code"] == "device_busy"
        server.client.request("POST", f"/api/runs/{local}/cancel")
        assert server.events_until_finished(remote["run_id"])[-1]["payload"]["status"] == "succeeded"
    finally:
        agent.terminate()
        agent.wait(30)


def test_a_local_cpu_run_waiting_for_a_shared_cpu_never_holds_back_a_card(make_server, tmp_path):
    # 002: two keys never wait for each other. The cpu is shared with a same-machine
    # worker whose run holds it; a local cpu run waits for it, and a local cuda:0 run
    # submitted behind it starts at once on its free card.
    server = make_server(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="1", TROUPE_SIMULATED_ACCELERATORS="cuda:0")
    here = server.get("/api/info")["machine_id"]
    agent = start_agent(server, tmp_path, enroll(server, name="beside")["command"], machine=here)
    try:
        read_until(agent, "connected as beside")
        remote = server.submit(sleeper(seconds=60), target={"worker": "beside"})["run_id"]
        server.wait_status(remote, "running")
        on_cpu = server.submit(sleeper(seconds=1), device="cpu")["run_id"]
        on_card = server.submit(hello(), device="cuda:0")["run_id"]
        assert server.events_until_finished(on_card)[-1]["payload"]["status"] == "succeeded"
        assert server.get(f"/api/runs/{on_cpu}")["status"] == "queued"  # still waiting for the cpu
        server.client.request("POST", f"/api/runs/{remote}/cancel")
        assert server.events_until_finished(on_cpu)[-1]["payload"]["status"] == "succeeded"
    finally:
        agent.terminate()
        agent.wait(30)


def test_a_run_on_two_cards_holds_both_and_an_ask_no_worker_can_grant_is_refused(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    cards = ({**CARD, "uuid": "GPU-a0"}, {**CARD, "uuid": "GPU-a1", "index": 1})
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"], cards=cards)
    try:
        read_until(agent, "connected as gpu-a")
        both = server.submit(sleeper(seconds=60), target={"worker": "gpu-a", "devices": ["cuda:0", "cuda:1"]})
        assert both["queue_key"] == "gpu-a/cuda:0"
        server.wait_status(both["run_id"], "running")
        second_card = server.submit(hello(), target={"worker": "gpu-a", "devices": ["cuda:1"]})["run_id"]
        assert server.get(f"/api/runs/{second_card}")["status"] == "queued"
        freed_at = utc_now()
        server.client.request("POST", f"/api/runs/{both['run_id']}/cancel")
        assert server.events_until_finished(second_card)[-1]["payload"]["status"] == "succeeded"
        assert server.get(f"/api/runs/{second_card}")["started_at"] > freed_at  # cuda:1 was held too

        never = server.submit(hello(), expect=400, target={"worker": "gpu-a", "devices": ["cuda:0", "cuda:3"]})
        assert never["error"]["code"] == "worker_cannot_grant"
        assert "asks for 2 devices" in never["error"]["message"] and "offers 2 cards" in never["error"]["message"]
        greedy = hello()
        greedy["nodes"][0]["resources"] = {"cpus": 8}
        cut = server.submit(greedy, target={"worker": "gpu-a"})
        first = greedy["nodes"][0]["id"]
        assert cut["warnings"] == [f"node {first} asks for 8 cpus; worker gpu-a has 2: cut down to 2"]
    finally:
        agent.terminate()
        agent.wait(30)


def test_an_agent_offers_the_cards_its_cuda_visible_devices_shows_and_plain_cuda_is_the_first(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    cards = tuple({**CARD, "uuid": f"GPU-c{i}", "index": i} for i in range(3))
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-c")["command"], cards=cards,
                        CUDA_VISIBLE_DEVICES="GPU-c2,0")
    try:
        read_until(agent, "connected as gpu-c")
        row = next(w for w in server.get("/api/workers")["workers"] if w["name"] == "gpu-c")
        assert row["devices"] == ["cpu", "cuda:2", "cuda:0"]
        plain = server.submit(hello(), device="cuda", target={"worker": "gpu-c"})
        assert (plain["queue_key"], plain["warnings"]) == ("gpu-c/cuda:2", [])
        events = server.events_until_finished(plain["run_id"])
        assert events[-1]["payload"]["status"] == "succeeded"
        assert next(e for e in events if e["type"] == "run_started")["payload"]["device"] == "cuda:2"
        hidden = server.submit(hello(), device="cuda:1", target={"worker": "gpu-c"})
        assert hidden["queue_key"] == "gpu-c/cpu" and "cuda:1" in hidden["warnings"][0]
    finally:
        agent.terminate()
        agent.wait(30)


async def test_any_never_places_a_run_on_a_connected_degraded_worker(make_server, tmp_path):
    import aiohttp

    from troupe.protocol import worker as wire

    server = make_server()
    old = hello_frame(name="aaa-old", catalog_digest="x", node_types=["core.Constant"],
                      inventory=wire.Inventory(cpus=4, cards=[wire.Card(**{**CARD, "uuid": "GPU-old"})]))
    url = server.url.replace("http://", "ws://") + "/ws/worker"
    async with aiohttp.ClientSession() as session, session.ws_connect(
            url, headers={"Authorization": f"Bearer {server.token}"}) as ws:
        await ws.send_str(old)
        assert wire.parse_frame((await ws.receive(timeout=10)).data).degraded is True  # it stays connected
        agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"])
        try:
            read_until(agent, "connected as gpu-a")
            first = server.submit(sleeper(seconds=60), device="auto", target=ANYWHERE)["run_id"]
            second = server.submit(hello(), device="auto", target=ANYWHERE)["run_id"]
            server.wait_status(first, "running")
            server.client.request("POST", f"/api/runs/{first}/cancel")
            # The degraded worker sorts first by name and has a free card, yet both went to gpu-a.
            assert server.events_until_finished(second)[-1]["payload"]["status"] == "succeeded"
            assert [server.get(f"/api/runs/{r}")["worker"] for r in (first, second)] == ["gpu-a", "gpu-a"]
        finally:
            agent.terminate()
            agent.wait(30)


def test_a_local_run_waiting_for_the_cpu_a_worker_shared_starts_when_the_worker_leaves(make_server, tmp_path):
    # The server's cpu allows 2, the agent beside it 1: one quota of 1 while it is there.
    server = make_server(TROUPE_RUN_QUEUE_MAX_CONCURRENT="cpu=2,beside/cpu=1")
    agent = start_agent(server, tmp_path, enroll(server, name="beside")["command"],
                        machine=server.get("/api/info")["machine_id"])
    try:
        read_until(agent, "connected as beside")
        first = server.submit(sleeper(seconds=60))["run_id"]
        server.wait_status(first, "running")
        second = server.submit(hello())["run_id"]
        server.poll_until(lambda: (server.get(f"/api/runs/{second}")["queue_reason"] or {}).get("code")
                          == "device_busy")
        agent.terminate()
        agent.wait(30)
        # The server's own 2 hold again: the second starts beside the first at once.
        assert server.events_until_finished(second)[-1]["payload"]["status"] == "succeeded"
        assert server.get(f"/api/runs/{first}")["status"] == "running"
        server.client.request("POST", f"/api/runs/{first}/cancel")
    finally:
        if agent.poll() is None:
            agent.terminate()
            agent.wait(30)


def test_a_run_a_restarted_server_adopted_holds_the_shared_cpu_until_its_agent_is_back(make_server, tmp_path):
    # One cpu, one slot, shared with the agent beside the server; the agent's run holds it.
    settings = {"TROUPE_RUN_QUEUE_MAX_CONCURRENT": "cpu=1,beside/cpu=1", "TROUPE_WORKER_HEARTBEAT_S": "1"}
    server = make_server(tmp_path / "home", **settings)
    proxy = FaultProxy(int(server.url.rsplit(":", 1)[1])).start()
    agent = start_agent(server, tmp_path, enroll(server, name="beside")["command"].replace(server.url, proxy.url),
                        machine=server.get("/api/info")["machine_id"])
    try:
        read_until(agent, "connected as beside")
        remote = server.submit(sleeper(seconds=60), target={"worker": "beside"})["run_id"]
        server.wait_status(remote, "running")
        proxy.cut()
        server.kill()
        again = make_server(tmp_path / "home", **settings)
        # Its agent is not back yet, but its run is alive: the cpu is still taken.
        local = again.submit(hello())["run_id"]
        again.poll_until(lambda: (again.get(f"/api/runs/{local}")["queue_reason"] or {}).get("code")
                         == "device_busy")
        proxy.upstream_port = int(again.url.rsplit(":", 1)[1])
        proxy.restore()
        again.wait_status(remote, "running", timeout=30)
        assert again.get(f"/api/runs/{local}")["status"] == "queued"
        again.client.request("POST", f"/api/runs/{remote}/cancel")
        assert again.events_until_finished(local)[-1]["payload"]["status"] == "succeeded"
    finally:
        agent.terminate()
        agent.wait(30)
        proxy.close()
