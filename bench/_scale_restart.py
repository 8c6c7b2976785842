"""The restart phase of ``bench/scale.py`` and the checks that no run was lost.

Restart: long worker runs fill the agents' first cards; once all run, the server is
SIGKILLed and started again on the same ``TROUPE_HOME`` and port. The agents keep playing
their runs (frames pile up in their outboxes) and redial on the real link's backoff.
Adoption is observed from both ends:

- the server's: ``GET /api/workers`` of the new server lists the worker ``connected`` with
  the run in its ``running_runs`` (the new WorkerConnection rebound the run the agent
  reported in its hello; ``troupe/actors/worker.py`` ``_attach``), or the run is listed
  ``succeeded`` (it ended on the new server, which it can only do once adopted; with
  ``/api/workers`` taking seconds at 800 workers, a run can be adopted and end between
  two polls);
- the agents': each agent's welcome from the new server, and the moment acks covered
  every frame it replayed on that connection.

Checks (runs of both phases): every row ``succeeded``, its events numbered 1..n with no
gap and ending in ``run_finished``; a load-phase run has exactly the events it should, an
adopted run every tick point exactly once (``/api/runs/{id}/metrics``).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._http import Conn
from bench._measure import BenchError
from bench._scale_fleet import Fleet, serve
from bench._scale_load import CLIENT_ERRORS, worker_graph
from bench._troupe import TERMINAL, Server, check_runs

ADOPT_TICK_S = 0.5


def run_counts(conn: Conn) -> dict[str, int]:
    """Runs by state, from ``GET /metrics`` (``troupe_runs{state=...}``); once more on a new
    connection when the server had closed the idle one (as ``Conn.request`` does)."""
    for attempt in (1, 2):
        try:
            conn.http.request("GET", "/metrics")
            response = conn.http.getresponse()
            text = response.read().decode()
            break
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            conn.http.close()
            if attempt == 2:
                raise
    if response.status != 200:
        raise BenchError(f"GET /metrics answered {response.status}")
    return {m[1]: int(float(m[2])) for m in re.finditer(r'^troupe_runs\{state="(\w+)"\} (\S+)$', text, re.M)}


def adopt_bodies(specs: list[dict[str, Any]], per_agent: int, seconds: float) -> tuple[list[tuple[str, bytes]], int]:
    """(worker, POST body) of one long run on each of an agent's first ``per_agent`` cards
    (one slot each), and the ticks of each."""
    ticks = max(2, round(seconds / ADOPT_TICK_S))
    graph = worker_graph(ticks, ADOPT_TICK_S)
    bodies = []
    for spec in specs:
        for card in spec["inventory"]["cards"][:per_agent]:
            target = {"worker": spec["name"], "devices": [f"cuda:{card['index']}"]}
            bodies.append((spec["name"], json.dumps({"graph": graph, "options": {"target": target}}).encode()))
    return bodies, ticks


@dataclass
class Adoption:
    runs: int
    ticks: int
    kill_to_serving_s: float = 0.0
    start_s: float = 0.0  # the new server's own start-up, from its exec to serving
    all_welcomed_s: float | None = None
    all_adopted_s: float | None = None
    replays_acked_s: float | None = None
    workers_latency_s: list[float] = field(default_factory=list)
    not_adopted: list[str] = field(default_factory=list)
    frames_replayed: int = 0
    errors: list[str] = field(default_factory=list)
    server: Server | None = None  # the one started again: stopped by the caller whatever happens


def wait_running(conn: Conn, n: int, terminal_before: int, timeout: float) -> None:
    """Waits until the ``n`` long runs all run at once; a BenchError if one of them ended
    first (their length, ``--adopt-seconds`` times the scale, was shorter than the time
    it took to submit and start them all)."""
    deadline = time.monotonic() + timeout
    while (counts := run_counts(conn)).get("running", 0) < n:
        ended = sum(counts.get(s, 0) for s in TERMINAL) - terminal_before
        if ended:
            raise BenchError(f"{ended} of the {n} long runs ended before all of them ran ({counts}); "
                             "raise --adopt-seconds")
        if time.monotonic() > deadline:
            raise BenchError(f"only {counts.get('running', 0)} of {n} long runs running after {timeout:g}s: {counts}")
        time.sleep(0.2)


def kill_and_adopt(server: Server, fleet: Fleet, ids: dict[str, str], result: Adoption, home: Path,
                   cpu_slots: int, heartbeat_s: float, timeout: float) -> Server:
    """SIGKILLs ``server``, starts it again on its port, and waits until every run of
    ``ids`` (run -> worker) is adopted; the new server."""
    t_kill = time.monotonic()
    os.kill(server.pid, signal.SIGKILL)
    server.proc.wait(30)
    again = result.server = serve(home, server.port, cpu_slots, heartbeat_s)
    result.kill_to_serving_s, result.start_s = time.monotonic() - t_kill, again.start_s
    conn = Conn(again.port, again.token, 30.0)
    adopted: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    try:
        while True:
            t0 = time.perf_counter()
            try:
                status, body = conn.request("GET", "/api/workers")
            except CLIENT_ERRORS as exc:
                status, body = 0, f"{type(exc).__name__}: {exc}"
                conn.close()
            now = time.monotonic()
            if status != 200:
                result.errors.append(f"GET /api/workers: {status} {str(body)[:160]}")
            else:
                result.workers_latency_s.append(time.perf_counter() - t0)
                held = {(w["name"], r) for w in body["workers"] if w["state"] == "connected" for r in w["running_runs"]}
                for run_id, worker in ids.items():
                    if run_id not in adopted and (worker, run_id) in held:
                        adopted[run_id] = now
            if len(adopted) < len(ids):  # a run that ended on the new server was adopted between two polls
                for run_id in _newest_succeeded(conn, len(ids)) & (ids.keys() - adopted.keys()):
                    adopted[run_id] = now
            agents = fleet.stats()
            welcomed = [t for t in agents["welcomed_at"].values() if t is not None and t > t_kill]
            acked = [t for t in agents["replay_acked_at"].values() if t is not None and t > t_kill]
            if len(welcomed) == agents["agents"] and result.all_welcomed_s is None:
                result.all_welcomed_s = max(welcomed) - t_kill
            if len(acked) == agents["agents"] and result.replays_acked_s is None:
                result.replays_acked_s = max(acked) - t_kill
            if len(adopted) == len(ids) and result.all_adopted_s is None:
                result.all_adopted_s = max(adopted.values()) - t_kill
            if None not in (result.all_welcomed_s, result.replays_acked_s, result.all_adopted_s):
                break
            if now > deadline:
                result.not_adopted = sorted(set(ids) - adopted.keys())
                result.errors.append(f"{len(result.not_adopted)} of {len(ids)} runs not adopted, "
                                     f"{len(welcomed)} of {agents['agents']} agents welcomed back, "
                                     f"{len(acked)} replays acked {timeout:g}s after the kill")
                break
            time.sleep(0.1)
        result.frames_replayed = int(fleet.stats()["counts"].get("frames_replayed", 0))
    finally:
        conn.close()
    return again


def _newest_succeeded(conn: Conn, n: int) -> set[str]:
    """Ids among the ``n`` newest succeeded runs (the long runs are the newest runs, and
    were all running at the kill, so those of them listed here ended on the new server)."""
    found: set[str] = set()
    cursor: str | None = None
    while len(found) < n:
        status, page = conn.request("GET", "/api/runs?status=succeeded&limit=500" + (f"&cursor={cursor}" if cursor
                                                                                      else ""))
        if status != 200:
            break
        found.update(row["id"] for row in page["runs"])
        cursor = page.get("next_cursor")
        if not cursor:
            break
    return found


def wait_quiet(conn: Conn, timeout: float) -> dict[str, int]:
    """Waits until no run is queued, running or disconnected; the counts then."""
    deadline = time.monotonic() + timeout
    while True:
        counts = run_counts(conn)
        if not any(counts.get(s, 0) for s in ("queued", "running", "disconnected")):
            return counts
        if time.monotonic() > deadline:
            raise BenchError(f"runs still active {timeout:g}s later: {counts}")
        time.sleep(0.5)


@dataclass
class Check:
    statuses: dict[str, int] = field(default_factory=dict)
    listed: int = 0
    events_ok: int = 0
    problems: list[str] = field(default_factory=list)
    n: int = 0

    @property
    def ok(self) -> bool:
        return self.statuses.get("succeeded", 0) == self.n == self.listed == self.events_ok and not self.problems


def check_all(server: Server, ids: list[str], expected_events: int, threads: int = 4,
              ticks: int = 0) -> Check:
    """``bench._troupe.check_runs`` on ``threads`` chunks at once (rows, succeeded listing,
    events), and with ``ticks`` each run's tick series 1..ticks exactly once."""
    result = Check(n=len(ids))
    chunks = [ids[k::threads] for k in range(threads) if ids[k::threads]]
    listed_all: set[str] = set()
    with ThreadPoolExecutor(threads) as pool:
        for statuses, listed, ok, problems in pool.map(lambda c: check_runs(server, c, expected_events), chunks):
            for key, count in statuses.items():
                result.statuses[key] = result.statuses.get(key, 0) + count
            listed_all |= listed  # each chunk pages the whole succeeded listing
            result.events_ok += ok
            result.problems += problems
        if ticks:
            result.problems += [p for chunk in pool.map(lambda c: _tick_problems(server, c, ticks), chunks)
                                for p in chunk]
    result.listed = len(listed_all & set(ids))
    return result


def _tick_problems(server: Server, ids: list[str], ticks: int) -> list[str]:
    conn = Conn(server.port, server.token, 30.0)
    problems = []
    try:
        for run_id in ids:
            _, body = conn.request("GET", f"/api/runs/{run_id}/metrics")
            steps = [p["step"] for p in body["series"].get("tick", [])]
            if steps != list(range(1, ticks + 1)):
                problems.append(f"{run_id}: tick steps {steps[:5]}... ({len(steps)} of {ticks})")
    finally:
        conn.close()
    return problems
