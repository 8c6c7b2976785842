"""A worker's card shared by memory budget (issue 14), through the real server, a real
agent with a simulated 24 GiB card and real run children."""

from __future__ import annotations

import json
import math

import pytest

from tests.helpers import graph, hello, node, sleeper
from tests.integration.test_hardening_functional import closed_for_breaking_the_protocol, forger
from tests.integration.test_workers_functional import CARD, enroll, read_until, start_agent
from troupe.protocol import worker as wire

GIB = 1024
CARD24 = {**CARD, "uuid": "GPU-s24", "name": "Sim 24G", "memory_total_mib": 24 * GIB, "memory_free_mib": 24 * GIB}


def share(server, worker="gpu-a", device="cuda:0", sharing="memory", reserved_mib=0, expect=200):
    status, reply = server.client.request("PUT", f"/api/workers/{worker}/devices/{device}",
                                          {"sharing": sharing, "reserved_mib": reserved_mib})
    assert status == expect, reply
    return reply


def card_row(server, worker="gpu-a"):
    row = next(w for w in server.get("/api/workers")["workers"] if w["name"] == worker)
    return row["cards"][0]


@pytest.fixture
def shared_card(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"], cards=(CARD24,))
    read_until(agent, "connected as gpu-a")
    yield server
    agent.terminate()
    agent.wait(30)


def test_three_budgets_pack_one_card_a_fourth_is_refused_or_waits_and_any_waits_for_room(shared_card):
    server = shared_card
    assert card_row(server)["sharing"] == "exclusive"
    assert share(server)["uuid"] == "GPU-s24"
    on_card = {"worker": "gpu-a", "memory_gib": 6}
    # The third names flavor gpu-small, whose budget is 6 GiB too.
    packed = [server.submit(sleeper(seconds=60), device="cuda:0", target=target)["run_id"]
              for target in (on_card, on_card, {"worker": "gpu-a", "flavor": "gpu-small"})]
    for run_id in packed:
        server.wait_status(run_id, "running")  # slot counting would run one at a time
    card = card_row(server)
    assert card["sharing"] == "memory" and card["total_mib"] == 24 * GIB and card["free_mib"] == 24 * GIB
    assert card["budgets"] == {run_id: 6 * GIB for run_id in packed}
    assert card["promised_mib"] == 3 * (6 * GIB + 500)

    refused = server.submit(hello(), expect=503, device="cuda:0", target=on_card)["error"]
    assert refused["code"] == "memory_busy" and "4644 MiB of room" in refused["message"]
    assert refused["details"]["room_mib"] == 24 * GIB - 3 * (6 * GIB + 500)
    assert len(server.get("/api/runs?status=queued")["runs"]) == 0  # nothing was stored

    waiting = server.submit(hello(), device="cuda:0", target={**on_card, "wait": True})["run_id"]
    # 1 GiB would fit now, but runs for a card start in their order: it is not let past.
    behind = server.submit(hello(), expect=503, device="cuda:0", target={"worker": "gpu-a", "memory_gib": 1})
    assert behind["error"]["details"]["waiting"] == 1 and behind["error"]["details"]["room_mib"] >= 1024 + 500
    anywhere = server.submit(hello(), device="auto", target={"worker": "any", "memory_gib": 6})["run_id"]
    queued = {r["id"]: r for r in server.get("/api/runs?status=queued")["runs"]}
    assert queued[waiting]["queue_reason"]["code"] == "memory_busy"
    assert queued[anywhere]["queue_reason"]["code"] == "no_free_worker"

    server.client.request("POST", f"/api/runs/{packed[0]}/cancel")
    events = server.events_until_finished(waiting)  # first in line for the card
    assert events[-1]["payload"]["status"] == "succeeded"
    started = next(e for e in events if e["type"] == "run_started")
    assert started["payload"]["memory_budget_mib"] == 6 * GIB
    logs = [e["payload"]["message"] for e in events if e["type"] == "log"]
    assert any("6144 MiB could not be applied: this machine has no CUDA" in line for line in logs), logs
    assert server.events_until_finished(anywhere)[-1]["payload"]["status"] == "succeeded"
    for run_id in packed[1:]:
        server.client.request("POST", f"/api/runs/{run_id}/cancel")


def test_refusals_no_budget_too_large_and_a_budget_in_this_server(shared_card):
    server = shared_card
    share(server, reserved_mib=2 * GIB)
    none = server.submit(hello(), expect=400, device="cuda:0", target={"worker": "gpu-a"})["error"]
    assert none["code"] == "memory_budget_required" and "memory_gib" in none["message"]
    large = server.submit(hello(), expect=400, device="cuda:0", target={"worker": "gpu-a", "memory_gib": 22})
    assert large["error"]["code"] == "memory_budget_too_large"
    assert large["error"]["details"]["reserved_mib"] == 2 * GIB and "24576 MiB" in large["error"]["message"]
    local = server.submit(hello(), expect=400, target={"memory_gib": 2})["error"]
    assert (local["code"], local["pointer"]) == ("memory_budget_needs_worker", "/options/target/memory_gib")
    assert server.submit(hello(), expect=400, target={"worker": "local", "memory_gib": 2})["error"]["code"] == \
        "memory_budget_needs_worker"
    for bad in ({"sharing": "half"}, {"sharing": "memory", "reserved_mib": -1}, {"reserved_mib": 1}):
        status, reply = server.client.request("PUT", "/api/workers/gpu-a/devices/cuda:0", bad)
        assert status == 400 and reply["error"]["code"] == "invalid_request", reply
    assert share(server, device="cpu", expect=404)["error"]["code"] == "device_not_found"
    assert share(server, worker="nobody", expect=404)["error"]["code"] == "worker_not_found"
    status, _ = server.anonymous.request("PUT", "/api/workers/gpu-a/devices/cuda:0", {"sharing": "memory"})
    assert status == 401


def test_a_budget_comes_from_the_last_measured_peak_plus_20_percent(shared_card):
    server = shared_card
    measured = server.submit(hello(), device="cuda:0", target={"worker": "gpu-a"})["run_id"]  # exclusive card
    assert server.events_until_finished(measured)[-1]["payload"]["status"] == "succeeded"
    first = server.get(f"/api/runs/{measured}")
    assert first["peak_memory_mib"] > 0 and first["peak_memory_exact"] is True
    assert first["memory_budget_mib"] is None
    share(server)
    graph = hello()
    graph["name"] = "the same graph under another name"
    derived = server.submit(graph, device="cuda:0", target={"worker": "gpu-a"})["run_id"]
    server.events_until_finished(derived)
    row = server.get(f"/api/runs/{derived}")
    assert row["memory_budget_mib"] == math.ceil(first["peak_memory_mib"] * 1.2)
    assert row["memory_budget_source"] == "measured"
    local = server.submit(hello())["run_id"]  # in this server: a peak, not exact
    server.events_until_finished(local)
    assert server.get(f"/api/runs/{local}")["peak_memory_exact"] is False


def test_one_policy_and_one_ledger_for_a_card_two_workers_offer(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agents = []
    for name in ("gpu-a", "gpu-b"):
        agent = start_agent(server, tmp_path / name, enroll(server, name=name)["command"], machine=f"m-{name}",
                            cards=(CARD24,))
        read_until(agent, f"connected as {name}")
        agents.append(agent)
    try:
        share(server, worker="gpu-a")
        assert card_row(server, "gpu-b")["sharing"] == "memory"  # set through gpu-a, one card
        for worker in ("gpu-a", "gpu-b", "gpu-a"):
            run_id = server.submit(sleeper(seconds=60), device="cuda:0",
                                   target={"worker": worker, "memory_gib": 6})["run_id"]
            server.wait_status(run_id, "running")
        refused = server.submit(hello(), expect=503, device="cuda:0", target={"worker": "gpu-b", "memory_gib": 6})
        assert refused["error"]["details"]["promised_mib"] == 3 * (6 * GIB + 500)
    finally:
        for agent in agents:
            agent.terminate()
            agent.wait(30)


def test_running_out_of_memory_under_a_measured_budget_grows_the_next_one(shared_card):
    # Without CUDA here, a node raising torch's words stands for the allocator's refusal.
    server = shared_card
    greedy = graph(node("f", "core.Fail", message="CUDA out of memory. Tried to allocate 30.00 GiB"))
    first = server.submit(greedy, device="cuda:0", target={"worker": "gpu-a"})["run_id"]  # exclusive: no budget
    server.events_until_finished(first)
    peak = server.get(f"/api/runs/{first}")["peak_memory_mib"]
    share(server)
    second = server.submit(greedy, device="cuda:0", target={"worker": "gpu-a"})["run_id"]
    events = server.events_until_finished(second)
    row = server.get(f"/api/runs/{second}")
    budget = math.ceil(peak * 1.2)
    assert (row["memory_budget_mib"], row["memory_budget_source"], row["out_of_memory"]) == (budget, "measured", True)
    assert f"out of memory under the run's budget of {budget} MiB" in events[-1]["payload"]["error"]
    third = server.submit(greedy, device="cuda:0", target={"worker": "gpu-a"})["run_id"]
    server.events_until_finished(third)
    grown = server.get(f"/api/runs/{third}")["memory_budget_mib"]
    assert grown >= math.ceil(budget * 1.2)
    declared = server.submit(greedy, device="cuda:0", target={"worker": "gpu-a", "memory_gib": 1})["run_id"]
    server.events_until_finished(declared)
    fourth = server.submit(greedy, device="cuda:0", target={"worker": "gpu-a"})["run_id"]
    server.events_until_finished(fourth)
    # A declared budget that ran out neither grows the next one nor forgets the one that failed.
    assert server.get(f"/api/runs/{fourth}")["memory_budget_mib"] == \
        max(math.ceil(server.get(f"/api/runs/{declared}")["peak_memory_mib"] * 1.2), math.ceil(grown * 1.2))


async def test_another_agents_heartbeat_cannot_move_the_free_memory_of_a_card_it_did_not_report(shared_card):
    server = shared_card
    share(server)
    session, ws = await forger(server)
    try:
        # A same-machine socket says the real agent's card has nothing free, and names one
        # no agent has: neither is its card, so neither counts.
        await ws.send_str(wire.Heartbeat(frame_no=1, free_mib={CARD24["uuid"]: 0, "GPU-nobody": 0}).model_dump_json())
        assert isinstance(wire.parse_frame((await ws.receive(timeout=10)).data), wire.Ack)
        admitted = server.submit(hello(), device="cuda:0", target={"worker": "gpu-a", "memory_gib": 6, "wait": False})
        assert server.events_until_finished(admitted["run_id"])[-1]["payload"]["status"] == "succeeded"
        # More cards than a machine has is a broken frame: the socket is closed.
        many = json.dumps({"type": "heartbeat", "frame_no": 2, "free_mib": {f"GPU-{i}": 1 for i in range(65)}})
        await ws.send_str(many)
        await closed_for_breaking_the_protocol(ws)
    finally:
        await session.close()


def test_a_waiting_run_that_more_reserved_memory_makes_never_fit_fails_and_blocks_no_one(shared_card):
    server = shared_card
    share(server)
    on_card = {"worker": "gpu-a", "memory_gib": 6}
    packed = [server.submit(sleeper(seconds=60), device="cuda:0", target=on_card)["run_id"] for _ in range(3)]
    for run_id in packed:
        server.wait_status(run_id, "running")
    waiting = server.submit(hello(), device="cuda:0", target={**on_card, "wait": True})["run_id"]
    share(server, reserved_mib=20000)  # 6 GiB and its context can never fit the 4576 MiB left
    row = server.wait_status(waiting, "failed")
    assert "memory_budget_too_large" in row["error"] and "20000 MiB reserved" in row["error"], row["error"]
    for run_id in packed:
        server.client.request("POST", f"/api/runs/{run_id}/cancel")
    small = server.submit(hello(), device="cuda:0", target={"worker": "gpu-a", "memory_gib": 1, "wait": True})["run_id"]
    assert server.events_until_finished(small)[-1]["payload"]["status"] == "succeeded"  # nothing stuck ahead


def test_a_card_whose_strictest_provider_leaves_starts_the_runs_waiting_for_it(make_server, tmp_path):
    # One card offered by two workers: its limit is the smaller of theirs (gpu-a's 1).
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1",
                         TROUPE_RUN_QUEUE_MAX_CONCURRENT="gpu-a/cuda:0=1,gpu-b/cuda:0=2")
    agents = {}
    for name in ("gpu-a", "gpu-b"):
        agents[name] = start_agent(server, tmp_path / name, enroll(server, name=name)["command"],
                                   machine=f"m-{name}", cards=(CARD24,))
        read_until(agents[name], f"connected as {name}")
    try:
        on_b = {"worker": "gpu-b", "devices": ["cuda:0"]}
        first = server.submit(sleeper(seconds=60), target=on_b)["run_id"]
        server.wait_status(first, "running")
        second = server.submit(hello(), target=on_b)["run_id"]
        server.poll_until(lambda: server.get(f"/api/runs/{second}")["queue_reason"] is not None)
        assert server.get(f"/api/runs/{second}")["status"] == "queued"
        agents["gpu-a"].terminate()
        agents["gpu-a"].wait(30)
        # gpu-b's limit of 2 holds now: the second run starts without waiting for the first.
        assert server.wait_status(second, "succeeded", timeout=30)["status"] == "succeeded"
        assert server.get(f"/api/runs/{first}")["status"] == "running"
        server.client.request("POST", f"/api/runs/{first}/cancel")
    finally:
        for agent in agents.values():
            if agent.poll() is None:
                agent.terminate()
                agent.wait(30)
