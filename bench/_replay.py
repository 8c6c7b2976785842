"""The resilience figures of ``bench/worker.py``: how fast a worker run's log resumes after
its link is cut, and how many events per second one agent relays (each persisted before
it is published) against the same graph in-process.

The agent dials the server through the tests' fault-injecting proxy on 127.0.0.1, so a
cut is real: every connection closes and new ones are refused until the restore.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from bench._http import Conn
from bench._measure import BenchError
from bench._troupe import ts_seconds


def ticker(count: int, interval: float) -> dict[str, Any]:
    return {"version": 1, "name": "ticker", "nodes": [{"id": "t", "type": "core.Ticker",
                                                         "params": {"count": count, "interval": interval}}],
            "edges": []}


def submit(conn: Conn, graph: dict[str, Any], worker: str | None) -> str:
    options = {"target": {"worker": worker}} if worker else {}
    status, reply = conn.request("POST", "/api/runs", json.dumps({"graph": graph, "options": options}).encode())
    if status != 201:
        raise BenchError(f"POST /api/runs answered {status}: {reply}")
    return str(reply["run_id"])


def resume_after_cuts(port: int, token: str, proxy: Any, worker: str, cuts: int, cut_s: float,
                      timeout: float) -> list[float]:
    """Seconds from each cut's end (the restore) to the first replayed event reaching a
    subscriber of the run's stream. One long run emits an event every 20 ms throughout."""
    conn = Conn(port, token, timeout)
    run_id = submit(conn, ticker(1_000_000, 0.02), worker)
    arrivals: list[float] = []
    lock = threading.Lock()
    seen = threading.Event()

    def follow() -> None:
        watcher = Conn(port, token, timeout=cuts * (cut_s + 30) + 60)
        for kind, data in watcher.stream(f"/api/runs/{run_id}/stream"):
            if kind == "run_event":
                with lock:
                    arrivals.append(time.perf_counter())
                if data["type"] == "metric":
                    seen.set()
                if data["type"] == "run_finished":
                    return

    thread = threading.Thread(target=follow, name="subscriber", daemon=True)
    thread.start()
    if not seen.wait(timeout):
        raise BenchError("the run emitted no metric")
    resumed = []
    try:
        for _ in range(cuts):
            time.sleep(0.5)
            proxy.cut()
            time.sleep(cut_s)
            restored = time.perf_counter()
            proxy.restore()
            deadline = restored + timeout
            while True:
                with lock:
                    after = [t for t in arrivals if t > restored]
                if after:
                    resumed.append(after[0] - restored)
                    break
                if time.perf_counter() > deadline:
                    raise BenchError(f"no event reached the subscriber within {timeout}s of a restore")
                time.sleep(0.002)
    finally:
        conn.request("POST", f"/api/runs/{run_id}/cancel", b"{}")
        thread.join(timeout)
        conn.close()
    return resumed


def relay_rate(conn: Conn, events: int, worker: str | None, timeout: float) -> dict[str, float]:
    """Events per second of one run emitting as fast as it can, from the server's own
    timestamps (its node's ``node_started`` -> ``run_finished``; also from
    ``run_started``), every point checked persisted."""
    run_id = submit(conn, ticker(events, 0.0), worker)
    deadline = time.monotonic() + timeout
    lagged = 0
    for kind, data in conn.stream(f"/api/runs/{run_id}/stream"):
        if kind == "run_event" and data["type"] == "run_finished":
            break
        if kind == "stream_lagged":  # this reader fell behind: the stream ends here
            lagged += 1
        if time.monotonic() > deadline:
            raise BenchError(f"run {run_id} did not finish within {timeout}s")
    # A stream the server ended for a reader too far behind: the run goes on; wait for
    # its end by asking, at a slow fixed rate.
    while conn.request("GET", f"/api/runs/{run_id}")[1]["status"] in ("queued", "running"):
        if time.monotonic() > deadline:
            raise BenchError(f"run {run_id} did not finish within {timeout}s")
        time.sleep(0.1)
    _, page = conn.request("GET", f"/api/runs/{run_id}/events?tail=1")
    _, first = conn.request("GET", f"/api/runs/{run_id}/events?after=1")
    _, metrics = conn.request("GET", f"/api/runs/{run_id}/metrics")
    points = metrics["series"].get("tick", [])
    if len(points) != events or [p["step"] for p in points] != list(range(1, events + 1)):
        raise BenchError(f"run {run_id} persisted {len(points)} of {events} points")
    started = next(e for e in first["events"] if e["type"] == "run_started")
    node = next(e for e in first["events"] if e["type"] == "node_started")
    end = ts_seconds(page["events"][-1]["ts"])
    # From the node's start: what the relay carries. From the run's start (the figure
    # recorded before 2026-12-05): on a worker it includes the run's child starting its
    # interpreter (about 0.3 s here), which is no part of relaying events.
    seconds, from_start = end - ts_seconds(node["ts"]), end - ts_seconds(started["ts"])
    seconds, from_start = max(seconds, 0.001), max(from_start, 0.001)  # the stamps count milliseconds
    return {"seconds": seconds, "rate": events / seconds, "rate_from_start": events / from_start, "lagged": lagged}
