"""Target ``any``: the placer picks the worker, across every attached machine."""

from __future__ import annotations

import pytest

from tests.helpers import hello, sleeper
from tests.integration.test_workers_functional import CARD, enroll, handshake, read_until, start_agent
from tests.integration.test_workers_functional import hello as hello_frame

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
    server.client.request("POST", f"/api/runs/{first['run_id']}/cancel")
    events = server.events_until_finished(third["run_id"])
    started = next(e for e in events if e["type"] == "run_started")
    freed = server.get(f"/api/runs/{first['run_id']}")["worker"]
    assert started["payload"]["worker"] == freed and started["payload"]["device"] == "cuda:0"
    assert events[-1]["payload"]["status"] == "succeeded"
    # cpu runs for any land on a worker's cpu even while both cards are busy.
    on_cpu = server.submit(hello(), device="cpu", target=ANYWHERE)
    assert on_cpu["queue_key"] == "any/cpu"
    assert server.events_until_finished(on_cpu["run_id"])[-1]["payload"]["status"] == "succeeded"
    server.client.request("POST", f"/api/runs/{second}/cancel")


def test_any_refuses_at_once_when_no_worker_has_every_node_type(make_server):
    server = make_server()
    nobody = server.submit(hello(), expect=400, target=ANYWHERE)
    assert nobody["error"]["code"] == "no_eligible_worker" and "0 seen" in nobody["error"]["message"]


async def test_any_skips_a_degraded_worker(make_server):
    server = make_server()
    await handshake(server, hello_frame(name="old-agent", catalog_digest="x", node_types=["core.Constant"]))
    refused = server.submit(hello(), expect=400, target=ANYWHERE)
    assert refused["error"]["code"] == "no_eligible_worker" and "old-agent" in refused["error"]["message"]


def test_any_and_local_are_not_worker_names(make_server):
    server = make_server()
    for word in ("any", "local"):
        status, reply = server.client.request("POST", "/api/workers/enrollments", {"name": word})
        assert status == 400 and reply["error"]["pointer"] == "/name"
