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
