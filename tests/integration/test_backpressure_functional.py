"""A node that produces faster than the store writes waits for it: the server's memory
stays bounded, nothing is dropped, and the API keeps answering meanwhile."""

from __future__ import annotations

import threading
import time

import pytest

from tests.helpers import graph, node

POINTS = 250_000


@pytest.mark.timeout(300)
def test_fast_tickers_in_process_are_slowed_not_dropped_and_memory_stays_bounded(make_server):
    server = make_server()
    baseline = server.rss_mib()
    names = ("a", "b", "c", "d")
    flood = graph(*(node(n, "core.Ticker", count=POINTS, interval=0, name=n) for n in names), name="flood")
    run_id = server.submit(flood)["run_id"]
    peak, reads, done = [baseline], [], threading.Event()

    def sample() -> None:  # at a fixed pace, never flooding what it measures
        while not done.is_set():
            peak.append(server.rss_mib())
            started = time.monotonic()
            status, _ = server.client.request("GET", f"/api/runs/{run_id}", timeout=60)
            reads.append((status, time.monotonic() - started))
            done.wait(0.25)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        row = server.wait_status(run_id, "succeeded", timeout=240)
    finally:
        done.set()
        sampler.join(60)
    assert row["status"] == "succeeded"
    series = server.get(f"/api/runs/{run_id}/metrics")["series"]
    for name in names:
        steps = [p["step"] for p in series[name]]
        assert steps == list(range(1, POINTS + 1)), f"{name}: {len(steps)} points"
    assert reads and all(status == 200 for status, _ in reads)
    grown = max(peak) - baseline
    print(f"peak RSS {max(peak):.0f} MiB over a baseline of {baseline:.0f} MiB (+{grown:.0f}); "
          f"{len(reads)} reads of the run meanwhile, slowest {max(s for _, s in reads):.2f} s")
    assert grown < 100, f"the server grew {grown:.0f} MiB"


@pytest.mark.timeout(300)
def test_a_worker_run_on_a_healthy_link_is_slowed_not_dropped(make_server, tmp_path):
    from tests.integration.test_workers_functional import enroll, read_until, start_agent

    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    # A small outbox: a run that emits faster than the control plane acknowledges fills
    # it many times over unless the agent holds the run back.
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"], TROUPE_AGENT_OUTBOX_MB="1")
    points = 100_000
    try:
        read_until(agent, "connected as gpu-a")
        flood = graph(node("a", "core.Ticker", count=points, interval=0, name="a"),
                      node("b", "core.Ticker", count=points, interval=0, name="b"), name="flood")
        run_id = server.submit(flood, target={"worker": "gpu-a"})["run_id"]
        row = server.wait_status(run_id, "succeeded", timeout=240)
    finally:
        agent.terminate()
        agent.wait(30)
    assert row["warnings"] == [], row["warnings"]
    series = server.get(f"/api/runs/{run_id}/metrics")["series"]
    for name in ("a", "b"):
        assert [p["step"] for p in series[name]] == list(range(1, points + 1)), name
    events = server.get(f"/api/runs/{run_id}/events?tail=50")["events"]
    assert not [e for e in events if e["payload"].get("code") == "events_dropped"]


async def test_events_dropped_across_an_outage_are_counted_in_the_runs_warnings(shared_server):
    from tests.helpers import hello
    from tests.integration.test_hardening_functional import assigned, forger
    from troupe.protocol import worker as wire

    session, ws = await forger(shared_server, "outage")
    try:
        run_id = shared_server.submit(hello(), target={"worker": "outage"})["run_id"]
        await assigned(ws)
        for counter, dropped in ((4, 1000), (9, 234)):  # two outages longer than the outbox held
            await ws.send_str(wire.Gap(run_id=run_id, counter=counter, dropped=dropped).model_dump_json())
        await ws.send_str(wire.RunEnded(run_id=run_id, counter=10, status="succeeded").model_dump_json())
        row = shared_server.wait_status(run_id, "succeeded")
    finally:
        await session.close()
    assert len(row["warnings"]) == 1 and "1234 events of this run were dropped" in str(row["warnings"][0])
    events = shared_server.get(f"/api/runs/{run_id}/events")["events"]
    assert [e["payload"]["count"] for e in events if e["payload"].get("code") == "events_dropped"] == [1000, 234]
