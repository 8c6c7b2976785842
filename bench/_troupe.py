"""The troupe side of the queue benchmark: starting and stopping a real ``troupe start`` on
127.0.0.1, the sequential latency runs, the global-stream watcher and the drain of many runs
submitted at once, with its untimed check of every run's row, listing and events."""

from __future__ import annotations

import compileall
import contextlib
import functools
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._http import HOST, Conn
from bench._measure import BenchError, LatencyResult, cpu_seconds, environ, last_pid, shares

REPO = Path(__file__).resolve().parent.parent
TERMINAL = {"succeeded", "failed", "cancelled", "interrupted"}


# The server ----------------------------------------------------------------------------
@dataclass
class Server:
    home: Path
    proc: subprocess.Popen[bytes]
    port: int
    token: str
    pid: int
    log_path: Path
    start_s: float


def troupe_binary() -> list[str]:
    beside = Path(sys.executable).with_name("troupe")
    if beside.exists():
        return [str(beside)]
    venv = REPO / ".venv" / "bin" / "troupe"
    if venv.exists():
        return [str(venv)]
    raise BenchError("no troupe executable beside this python nor in .venv/bin; run with .venv/bin/python")


@functools.cache
def compile_ours() -> None:
    """A user's install has troupe's bytecode (pip writes it when it installs a wheel, and
    Python when it first imports a module), so a start timed here must not compile our
    modules from source each time, as it does where PYTHONDONTWRITEBYTECODE is set (the
    machine kind these figures come from sets it: 0.1 s of every start)."""
    compileall.compile_dir(str(REPO / "troupe"), quiet=1)


def start_argv() -> list[str]:
    """The arguments after ``troupe``: ``start`` on 127.0.0.1, a free port, the examples."""
    return ["start", "--host", HOST, "--port", "0", "--examples", str(REPO / "examples")]


def start_server(
    home: Path,
    cpu_slots: int,
    timeout: float,
    extra_env: dict[str, str] | None = None,
    command: list[str] | None = None,
) -> Server:
    """Starts ``troupe start`` (or ``command``, which must serve the same way) on 127.0.0.1
    with ``extra_env`` added to its environment, and waits until it serves."""
    compile_ours()
    env = environ()
    env.update(
        TROUPE_HOME=str(home),
        TROUPE_RUN_RETENTION_KEEP_LAST="-1",  # keep every run for the drain check
        TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU=str(cpu_slots),
    )
    for name in ("TROUPE_HOST", "TROUPE_PORT", "TROUPE_PUBLIC_URL"):
        env.pop(name, None)
    env.update(extra_env or {})
    log_path = home / "server.log"
    log = log_path.open("wb")
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        command or [*troupe_binary(), *start_argv()],
        cwd=str(REPO),
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    log.close()
    deadline = time.monotonic() + timeout
    while True:
        text = log_path.read_text(errors="replace")
        if "serving on http://" in text and (home / "session.json").exists():
            break
        if proc.poll() is not None:
            raise BenchError(f"troupe start exited with {proc.returncode}:\n{text[-2000:]}")
        if time.monotonic() > deadline:
            stop_server_proc(proc, 10)
            raise BenchError(f"troupe start did not serve within {timeout}s:\n{text[-2000:]}")
        time.sleep(0.02)
    start_s = time.perf_counter() - t0
    session = json.loads((home / "session.json").read_text())
    match = re.fullmatch(r"http://127\.0\.0\.1:(\d+)", session["url"])
    if match is None:
        stop_server_proc(proc, 10)
        raise BenchError(f"the server is not on 127.0.0.1: {session['url']}")
    return Server(home, proc, int(match.group(1)), session["token"], int(session["pid"]), log_path, start_s)


def stop_server_proc(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode


# Latency -------------------------------------------------------------------------------
def ts_seconds(stamp: str) -> float:
    # "2026-12-02T14:01:15.764808Z" -> seconds of the day (enough for a difference)
    clock = stamp.rstrip("Z").split("T")[1]
    h, m, s = clock.split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def troupe_latency(server: Server, graph_body: bytes, runs: int, warmup: int, timeout: float,
                   fresh: bool = False) -> LatencyResult:
    """``fresh``: a user's script's pattern, a new connection for the POST and another for
    the run's stream (connecting is timed); else one keep-alive connection for both."""
    result = LatencyResult()
    kept = Conn(server.port, server.token, timeout)
    try:
        for i in range(warmup + runs):
            t0 = time.perf_counter()
            conn = Conn(server.port, server.token, timeout) if fresh else kept
            status, reply = conn.request("POST", "/api/runs", graph_body)
            if fresh:
                conn.close()
                conn = Conn(server.port, server.token, timeout)
            t_submit = time.perf_counter()
            if status != 201:
                raise BenchError(f"POST /api/runs answered {status}: {reply}")
            run_id = reply["run_id"]
            finished: dict[str, Any] | None = None
            first: dict[str, Any] | None = None
            count = 0
            for kind, data in conn.stream(f"/api/runs/{run_id}/stream"):
                if kind != "run_event":
                    continue
                count += 1
                first = first or data
                if data["type"] == "run_finished":
                    finished = data
                    break
            t1 = time.perf_counter()
            if fresh:
                conn.close()
            if finished is None:
                raise BenchError(f"run {run_id}: the stream ended without run_finished")
            if i < warmup:
                continue
            if finished["payload"].get("status") != "succeeded":
                result.failures += 1
            result.total_s.append(t1 - t0)
            result.submit_s.append(t_submit - t0)
            if first is not None and first["type"] == "run_queued":
                result.server_s.append(ts_seconds(finished["ts"]) - ts_seconds(first["ts"]))
            result.events_per_run = count
    finally:
        kept.close()
    return result


# Drain ---------------------------------------------------------------------------------
class GlobalWatcher(threading.Thread):
    """Follows GET /api/stream and notes when each run reached a terminal status."""

    def __init__(self, port: int, token: str) -> None:
        super().__init__(name="global-stream", daemon=True)
        self.conn = Conn(port, token, timeout=60.0)
        self.ready = threading.Event()
        self.changed = threading.Condition()
        self.terminal: dict[str, tuple[str, float]] = {}
        self.broken: str | None = None

    def run(self) -> None:
        try:
            for kind, data in self.conn.stream("/api/stream"):
                if kind == "hello":
                    self.ready.set()
                elif kind == "reset":
                    raise BenchError("the global stream was reset")
                elif kind == "run" and data.get("kind") == "status" and data.get("status") in TERMINAL:
                    with self.changed:
                        self.terminal[data["run_id"]] = (data["status"], time.perf_counter())
                        self.changed.notify_all()
            raise BenchError("the global stream ended")
        except Exception as exc:
            with self.changed:
                self.broken = f"{type(exc).__name__}: {exc}"
                self.changed.notify_all()
            self.ready.set()

    def stop(self) -> None:
        sock = self.conn.http.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.conn.close()


@dataclass
class DrainResult:
    n: int
    submitted: int
    first_submit: float
    last_submit: float
    last_finished: float
    statuses: dict[str, int]
    listed_succeeded: int
    events_checked: int
    events_ok: int
    events_problems: list[str]
    server_user_s: float
    server_sys_s: float
    client_cpu_s: float
    tids_created: int
    waited_by: str
    submit_latencies_s: list[float]

    @property
    def wall_s(self) -> float:
        return self.last_finished - self.first_submit

    @property
    def runs_per_s(self) -> float:
        return self.n / self.wall_s


def troupe_drain(
    server: Server, graph_body: bytes, n: int, threads: int, timeout: float, expected_events: int,
    fresh: bool = False,
) -> DrainResult:
    watcher = GlobalWatcher(server.port, server.token)
    watcher.start()
    if not watcher.ready.wait(30) or watcher.broken:
        raise BenchError(f"could not follow /api/stream: {watcher.broken}")
    submitters = _Submitters(server, graph_body, n, threads, fresh)
    cpu0 = cpu_seconds(server.pid)
    client0 = os.times()
    pid0 = last_pid()
    all_ids = submitters.run(timeout)
    wanted = set(all_ids)
    seen, waited_by = _wait_finished(server, watcher, wanted, timeout)
    last_finished = max(seen[run_id][1] for run_id in wanted)
    cpu1 = cpu_seconds(server.pid)
    client1 = os.times()
    tids = last_pid() - pid0
    watcher.stop()

    statuses, listed, ok, problems = check_runs(server, all_ids, expected_events)
    return DrainResult(
        n=n,
        submitted=len(all_ids),
        first_submit=min(submitters.firsts),
        last_submit=max(submitters.lasts),
        last_finished=last_finished,
        statuses=statuses,
        listed_succeeded=len(listed & wanted),
        events_checked=len(all_ids),
        events_ok=ok,
        events_problems=problems,
        server_user_s=cpu1[0] - cpu0[0],
        server_sys_s=cpu1[1] - cpu0[1],
        client_cpu_s=(client1.user - client0.user) + (client1.system - client0.system),
        tids_created=tids,
        waited_by=waited_by,
        submit_latencies_s=[x for chunk in submitters.lat for x in chunk],
    )


class _Submitters:
    """``threads`` clients that post ``n`` runs between them, let go together by a
    barrier; each notes its figures in its own slot, so they share no lock."""

    def __init__(self, server: Server, graph_body: bytes, n: int, threads: int, fresh: bool) -> None:
        self.server = server
        self.fresh = fresh  # a new connection for each POST, as a plain script makes them
        self.graph_body = graph_body
        self.n = n
        self.threads = threads
        self.counts = shares(n, threads)
        self.ids: list[list[str]] = [[] for _ in range(threads)]
        self.firsts: list[float] = [math.inf] * threads
        self.lasts: list[float] = [0.0] * threads
        self.lat: list[list[float]] = [[] for _ in range(threads)]
        self.errors: list[str] = []
        self.gate = threading.Barrier(threads)

    def run(self, timeout: float) -> list[str]:
        """Every run's id, once all are submitted."""
        workers = [threading.Thread(target=self._submit, args=(k,), name=f"submit-{k}") for k in range(self.threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout)
        if any(w.is_alive() for w in workers):
            raise BenchError(f"submitting {self.n} runs took longer than {timeout}s")
        if self.errors:
            raise BenchError(f"submissions failed: {self.errors[:3]}")
        return [run_id for chunk in self.ids for run_id in chunk]

    def _submit(self, k: int) -> None:
        conn = Conn(self.server.port, self.server.token, timeout=60.0)
        try:
            self.gate.wait(30)
            for _ in range(self.counts[k]):
                t0 = time.perf_counter()
                if self.fresh:
                    conn.close()
                    conn = Conn(self.server.port, self.server.token, timeout=60.0)
                status, reply = conn.request("POST", "/api/runs", self.graph_body)
                t1 = time.perf_counter()
                if status != 201:
                    self.errors.append(f"POST answered {status}: {str(reply)[:200]}")
                    return
                self.firsts[k] = min(self.firsts[k], t0)
                self.lasts[k] = t1
                self.lat[k].append(t1 - t0)
                self.ids[k].append(reply["run_id"])
        except Exception as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            conn.close()


def _wait_finished(
    server: Server, watcher: GlobalWatcher, wanted: set[str], timeout: float
) -> tuple[dict[str, tuple[str, float]], str]:
    """When each run reached its end, as the global stream told (run id -> status, time),
    and how that was learnt."""
    deadline = time.monotonic() + timeout
    with watcher.changed:
        while not wanted.issubset(watcher.terminal) and watcher.broken is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"{len(wanted - watcher.terminal.keys())} runs unfinished after {timeout}s")
            watcher.changed.wait(min(left, 1.0))
        broken = watcher.broken
        seen = dict(watcher.terminal)
    if broken is None:
        return seen, "global SSE stream /api/stream"
    # Fallback: poll the queue until it is empty (the finish times are then less exact).
    now = _poll_until_drained(server, deadline, timeout)
    return {run_id: ("?", now) for run_id in wanted}, f"polling /api/queues (the stream broke: {broken})"


def _poll_until_drained(server: Server, deadline: float, timeout: float) -> float:
    """The time the cpu queue was seen empty."""
    conn = Conn(server.port, server.token, 30.0)
    while True:
        _, body = conn.request("GET", "/api/queues")
        cpu = [q for q in body["queues"] if q["queue_key"] == "cpu"]
        if cpu and cpu[0]["queued"] == 0 and cpu[0]["running"] == 0:
            break
        if time.monotonic() > deadline:
            raise BenchError(f"the cpu queue did not drain within {timeout}s")
        time.sleep(0.01)
    now = time.perf_counter()
    conn.close()
    return now


def check_runs(
    server: Server, all_ids: list[str], expected_events: int
) -> tuple[dict[str, int], set[str], int, list[str]]:
    """Untimed check after the drain: every run's row, the succeeded listing (paged by
    next_cursor) and every run's events; (statuses, ids listed, runs whose events are right,
    problems)."""
    conn = Conn(server.port, server.token, 30.0)
    try:
        statuses: dict[str, int] = {}
        for run_id in all_ids:
            status, row = conn.request("GET", f"/api/runs/{run_id}")
            key = row["status"] if status == 200 else f"http {status}"
            statuses[key] = statuses.get(key, 0) + 1
        listed: set[str] = set()
        cursor: str | None = None
        for _ in range(1000):
            path = "/api/runs?status=succeeded&limit=500" + (f"&cursor={cursor}" if cursor else "")
            _, page = conn.request("GET", path)
            listed.update(r["id"] for r in page["runs"])
            cursor = page.get("next_cursor")
            if not cursor:
                break
        problems: list[str] = []
        ok = 0
        for run_id in all_ids:
            problem = "no answer"
            for _ in range(50):  # run_finished is appended just after the status change
                _, body = conn.request("GET", f"/api/runs/{run_id}/events")
                events = body["events"]
                seqs = [e["seq"] for e in events]
                if events and events[-1]["type"] == "run_finished":
                    if seqs != list(range(1, len(seqs) + 1)):
                        problem = f"{run_id}: seqs not 1..n: {seqs}"
                    elif events[-1]["payload"].get("status") != "succeeded":
                        problem = f"{run_id}: run_finished {events[-1]['payload']}"
                    elif expected_events and len(events) != expected_events:
                        problem = f"{run_id}: {len(events)} events, expected {expected_events}"
                    else:
                        problem = ""
                    break
                problem = f"{run_id}: no run_finished persisted"
                time.sleep(0.02)
            if problem:
                problems.append(problem)
            else:
                ok += 1
    finally:
        conn.close()
    return statuses, listed, ok, problems
