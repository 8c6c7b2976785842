"""The load phase of ``bench/scale.py``: runs submitted at a bounded rate by a few client
threads, spread over the simulated agents' cards and cpus and the control plane's own cpu
queue, while one more client samples the listing and workers endpoints and another reads
the server's RSS and open files from ``/proc``.

Clients are threads with blocking keep-alive connections (``bench/_http.py``), in a process
of their own: the agents' event loop, busy with hundreds of sockets, would otherwise
delay the latency clock.
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import random
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._http import Conn
from bench._measure import BenchError, next_tick, rss_mb
from bench._troupe import REPO, GlobalWatcher, Server

# What a client counts as a failed request rather than a crash of the benchmark.
CLIENT_ERRORS = (OSError, ValueError, http.client.HTTPException)
# What the sampler asks, in turn: the first page, two filtered first pages, the second
# page of the succeeded runs (behind the cursor the last succeeded first page answered)
# and the workers.
ENDPOINTS = ("runs", "runs?status=running", "runs?status=succeeded", "runs?status=succeeded&cursor", "workers")


def hello_graph() -> dict[str, Any]:
    graph: dict[str, Any] = json.loads((REPO / "examples" / "hello.json").read_text())
    return graph


def worker_graph(ticks: int, interval: float) -> dict[str, Any]:
    """examples/hello.json plus a ``core.Ticker`` whose points set the run's length: the
    simulated agent plays each node's events and one point per ``interval``."""
    graph = hello_graph()
    graph["name"] = "scale"
    graph["nodes"].append({"id": "t", "type": "core.Ticker", "params": {"count": ticks, "interval": interval}})
    return graph


def worker_events(graph: dict[str, Any]) -> int:
    """Events a played worker run persists: run_queued, run_started, two per node, the
    ticks, run_finished."""
    ticks = sum(n["params"]["count"] for n in graph["nodes"] if n["type"] == "core.Ticker")
    return 3 + 2 * len(graph["nodes"]) + ticks


def plan_bodies(specs: list[dict[str, Any]], runs: int, local_fraction: float, run_seconds: float,
                seed: int) -> list[tuple[str, bytes]]:
    """(kind, POST body) of every run: ``local`` (hello.json on the control plane's cpu
    queue) or ``worker`` (one agent by name, one of its cards or its cpu)."""
    rnd = random.Random(seed + 1)
    local = json.dumps({"graph": hello_graph()}).encode()
    graph = worker_graph(2, run_seconds / 2)
    bodies = []
    for _ in range(runs):
        if rnd.random() < local_fraction:
            bodies.append(("local", local))
            continue
        spec = rnd.choice(specs)
        device = rnd.choice(["cpu", *(f"cuda:{c['index']}" for c in spec["inventory"]["cards"])])
        target = {"worker": spec["name"], "devices": [device]}
        bodies.append(("worker", json.dumps({"graph": graph, "options": {"target": target}}).encode()))
    return bodies


@dataclass
class Load:
    """What the clients saw; lists are appended by their own thread only."""

    ids: dict[str, list[str]] = field(default_factory=lambda: {"local": [], "worker": []})
    submit_s: list[float] = field(default_factory=list)
    submit_errors: list[str] = field(default_factory=list)
    latency_s: dict[str, list[float]] = field(default_factory=lambda: {e: [] for e in ENDPOINTS})
    sample_errors: list[str] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)
    first_submit: float = 0.0
    last_submit: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


def submit_all(server: Server, bodies: list[tuple[str, bytes]], threads: int, rate: float, load: Load,
               timeout: float) -> None:
    """Submits every (kind, body), run i not before start + i / rate, from ``threads``
    threads (at most that many POSTs in flight); returns when all were answered. The run
    ids go to ``load.ids[kind]``."""
    order = itertools.count()
    start = time.monotonic() + 0.05
    load.first_submit = time.perf_counter() + (start - time.monotonic())  # the first POST's due time

    def client() -> None:
        conn = Conn(server.port, server.token, timeout)
        try:
            while (i := next(order)) < len(bodies):
                delay = start + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                kind, body = bodies[i]
                t0 = time.perf_counter()
                try:
                    status, reply = conn.request("POST", "/api/runs", body)
                except CLIENT_ERRORS as exc:  # a timeout or a refused connection: counted, not fatal
                    status, reply = 0, f"{type(exc).__name__}: {exc}"
                    conn.close()
                elapsed = time.perf_counter() - t0
                with load.lock:
                    load.submit_s.append(elapsed)
                    if status == 201:
                        load.ids.setdefault(kind, []).append(reply["run_id"])
                    else:
                        load.submit_errors.append(f"{status}: {str(reply)[:160]}")
        finally:
            conn.close()

    clients = [threading.Thread(target=client, name=f"submit-{k}", daemon=True) for k in range(threads)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    load.last_submit = time.perf_counter()


class Sampler(threading.Thread):
    """Asks ``endpoints`` in turn on a fixed clock of ``interval`` seconds, one request at a
    time on one keep-alive connection. A late answer skips the ticks it overran, never
    fires again at once: a sampler that hurries after a slow answer floods the server it
    measures. The listing and the workers get a sampler each, so a slow one does not thin
    out the other's samples."""

    def __init__(self, server: Server, endpoints: tuple[str, ...], interval: float, load: Load,
                 timeout: float) -> None:
        super().__init__(name=f"sampler-{endpoints[0]}", daemon=True)
        self.server, self.endpoints, self.interval, self.load, self.timeout = server, endpoints, interval, load, timeout
        self.stopping = threading.Event()

    def run(self) -> None:
        conn = Conn(self.server.port, self.server.token, self.timeout)
        cursor: str | None = None
        start = time.perf_counter()
        for turn in itertools.count():
            if self.stopping.is_set():
                break
            name = self.endpoints[turn % len(self.endpoints)]
            if name.endswith("&cursor"):
                if cursor is None:
                    continue  # fewer than a page of succeeded runs yet
                path = f"/api/runs?status=succeeded&cursor={cursor}"
            else:
                path = f"/api/{name}"
            t0 = time.perf_counter()
            try:
                status, body = conn.request("GET", path)
            except CLIENT_ERRORS as exc:
                status, body = 0, f"{type(exc).__name__}: {exc}"
                conn.close()
            elapsed = time.perf_counter() - t0
            if status != 200:
                self.load.sample_errors.append(f"GET {path}: {status} {str(body)[:160]}")
            else:
                self.load.latency_s[name].append(elapsed)
                if name == "runs?status=succeeded":
                    cursor = body.get("next_cursor")
            self.stopping.wait(next_tick(start, self.interval, time.perf_counter()) - time.perf_counter())
        conn.close()


class ProcWatch(threading.Thread):
    """The server's VmRSS and open file descriptors every ``interval`` seconds."""

    def __init__(self, pid: int, load: Load, interval: float = 0.5) -> None:
        super().__init__(name="proc-watch", daemon=True)
        self.pid, self.load, self.interval = pid, load, interval
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(self.interval):
            try:
                self.load.rss_mb.append(rss_mb(self.pid)[0])
                self.load.fds.append(len(os.listdir(f"/proc/{self.pid}/fd")))
            except OSError:
                return  # the server is gone


def wait_terminal(watcher: GlobalWatcher, ids: set[str], timeout: float) -> dict[str, tuple[str, float]]:
    """The terminal status and time of each run, as the global stream announced them."""
    deadline = time.monotonic() + timeout
    with watcher.changed:
        while not ids.issubset(watcher.terminal):
            if watcher.broken is not None:
                raise BenchError(f"the global stream broke: {watcher.broken}")
            left = deadline - time.monotonic()
            if left <= 0:
                missing = len(ids - watcher.terminal.keys())
                raise BenchError(f"{missing} of {len(ids)} runs not finished {timeout:g}s after the last submit")
            watcher.changed.wait(min(left, 1.0))
        return {run_id: watcher.terminal[run_id] for run_id in ids}


def log_digest(path: Path) -> dict[str, int]:
    """The server log's WARNING / ERROR / CRITICAL lines, counted by message with worker
    names, run ids and numbers blanked (``worker # disconnected: three heartbeats missed``)."""
    found: dict[str, int] = {}
    for line in path.read_text(errors="replace").splitlines():
        match = re.search(r" (WARNING|ERROR|CRITICAL) [\w.]+: (.*)", line)
        if line.startswith("Traceback"):
            found["Traceback"] = found.get("Traceback", 0) + 1
        elif match:
            text = re.sub(r"sim-\d+|\b[0-9a-f]{32}\b|[0-9a-f-]{36}|\d+(\.\d+)?", "#", match.group(2))[:140]
            key = f"{match.group(1)} {text}"
            found[key] = found.get(key, 0) + 1
    return found
