"""The server's memory through and after one large in-process run (issue 62, section 5).

A real ``troupe start`` (a temporary ``TROUPE_HOME``, 127.0.0.1, a free port) is given one
run of ``--nodes`` ``core.Ticker`` nodes of ``--count`` points each at interval 0: the
points are recorded as fast as the server stores them. Once the run has ended, its
metrics are read whole through the API, as ``troupe show`` and the run page read them
(``GET /api/runs/ID/metrics``) and as the "Metrics as CSV" link does (``?format=csv``),
each counted point by point as it arrives. The server's RSS (``VmRSS`` of its pid in
``/proc``, MiB = 2^20 bytes) is sampled every ``--sample-s`` throughout; after the run and
after each read, it is read again ``--settle-s`` later. Printed: the RSS at the start, the
peak (the largest sample and the kernel's high-water mark ``VmHWM``), the RSS at the end,
and the points stored (counted in the database file after the server stopped) and read.

    .venv/bin/python bench/ticker_memory.py                       # 4 x 1,000,000 points
    .venv/bin/python bench/ticker_memory.py --nodes 4 --count 1000000 --settle-s 10

Goals (issue 62): the peak under 600 MiB, and the RSS after within 100 MiB of the start.
They are printed, not asserted (exit 0 when the run succeeded and stored every point).
"""

from __future__ import annotations

import argparse
import http.client as http_client
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

# As in queue.py: this folder is left off sys.path and the repository root goes first.
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [os.path.dirname(_HERE), *(p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE)]

import apsw  # noqa: E402

from bench._http import HOST, Conn  # noqa: E402
from bench._measure import BenchError, machine, next_tick, run_main, time_limit  # noqa: E402
from bench._troupe import REPO, TERMINAL, start_server, stop_server_proc  # noqa: E402

MIB = 1024 * 1024


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MiB."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) * 1024 / MIB
    return found["VmRSS"], found["VmHWM"]


def ticker_graph(nodes: int, count: int) -> dict[str, object]:
    return {"version": 1, "name": f"ticker-memory-{nodes}x{count}", "settings": {"device": "cpu"},
            "nodes": [{"id": f"t{i}", "type": "core.Ticker",
                       "params": {"count": count, "interval": 0, "name": f"tick{i}"}} for i in range(nodes)],
            "edges": []}


def _git_commit() -> str:
    head = (REPO / ".git" / "HEAD").read_text().strip() if (REPO / ".git" / "HEAD").is_file() else ""
    if head.startswith("ref: "):
        ref = REPO / ".git" / head[5:]
        return ref.read_text().strip()[:7] if ref.is_file() else head[5:]
    return head[:7]


def _stored_points(db: Path, run_id: str) -> int:
    conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        found = conn.execute("SELECT COUNT(*) FROM metrics WHERE run_id = ?", (run_id,)).fetchall()[0][0]
        return int(found) if isinstance(found, int) else 0
    finally:
        conn.close()


class Sampler(threading.Thread):
    """The server's RSS on a fixed clock, in the background: the largest reading and the last."""

    def __init__(self, pid: int, period_s: float) -> None:
        super().__init__(name="rss-sampler", daemon=True)
        self.pid, self.period_s = pid, period_s
        self.peak = self.last = rss_mib(pid)[0]
        self.samples = 0
        self.done = threading.Event()

    def run(self) -> None:
        start = time.perf_counter()
        while not self.done.is_set():
            self.last = rss_mib(self.pid)[0]
            self.peak = max(self.peak, self.last)
            self.samples += 1
            self.done.wait(max(0.0, next_tick(start, self.period_s, time.perf_counter()) - time.perf_counter()))


def _wait_end(conn: Conn, run_id: str, timeout_s: float) -> str:
    """The run's final status, read from its row once a second."""
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        code, row = conn.request("GET", f"/api/runs/{run_id}")
        if code != 200:
            raise BenchError(f"GET /api/runs/{run_id} answered {code}: {row}")
        if row["status"] in TERMINAL:
            return str(row["status"])
        time.sleep(1.0)
    raise BenchError(f"the run did not end within {timeout_s:g} s")


def _read_points(port: int, path: str, marker: bytes, timeout_s: float) -> tuple[int, int, float]:
    """Reads a metrics reply as a client would, counting its points by ``marker`` as the
    bytes come (this client keeps none of it): (status, points, seconds)."""
    t0 = time.perf_counter()
    http = http_client.HTTPConnection(HOST, port, timeout=timeout_s)
    try:
        http.request("GET", path)
        response = http.getresponse()
        points, tail = 0, b""
        while chunk := response.read(1 << 20):
            points += (tail + chunk).count(marker)
            tail = chunk[len(chunk) - len(marker) + 1:] if len(marker) > 1 else b""
        return response.status, points, time.perf_counter() - t0
    finally:
        http.close()


def _settle(sampler: Sampler, seconds: float) -> float:
    time.sleep(seconds)
    return sampler.last


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=4, help="core.Ticker nodes in the run (default 4)")
    parser.add_argument("--count", type=int, default=1_000_000, help="points per node (default 1,000,000)")
    parser.add_argument("--sample-s", type=float, default=0.25, help="RSS sampling period, s (default 0.25)")
    parser.add_argument("--settle-s", type=float, default=5.0, help="wait after the run and each read, s (default 5)")
    parser.add_argument("--timeout", type=float, default=900.0, help="limit of the run and of each read, s")
    parser.add_argument("--max-seconds", type=int, default=1800, help="hard limit of the whole run (default 1800)")
    args = parser.parse_args()
    if not (1 <= args.nodes <= 32 and 1 <= args.count <= 1_000_000 and 0.01 <= args.sample_s <= 5):
        parser.error("--nodes 1..32, --count 1..1000000, --sample-s 0.01..5")
    time_limit(args.max_seconds)
    print("machine:", ", ".join(f"{k} {v}" for k, v in machine().items()))
    print(f"commit: {_git_commit()}")
    expected = args.nodes * args.count
    body = json.dumps({"graph": ticker_graph(args.nodes, args.count)}).encode()
    with tempfile.TemporaryDirectory(prefix="troupe-bench-ticker-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        server = start_server(home, 2, 60.0)
        lines: list[str] = []
        try:
            time.sleep(1.0)  # what a start leaves settles (the catalog, the first collections)
            conn = Conn(server.port, server.token, 60.0)
            sampler = Sampler(server.pid, args.sample_s)
            start_rss = sampler.last
            sampler.start()
            code, reply = conn.request("POST", "/api/runs", body)
            if code != 201:
                raise BenchError(f"POST /api/runs answered {code}: {reply}")
            run_id = reply["run_id"]
            t0 = time.perf_counter()
            status = _wait_end(conn, run_id, args.timeout)
            lines.append(f"run: {args.nodes} x core.Ticker x {args.count:,} points at interval 0, {status} in "
                         f"{time.perf_counter() - t0:.0f} s; peak {sampler.peak:.0f} MiB, "
                         f"after {args.settle_s:g} s {_settle(sampler, args.settle_s):.0f} MiB")
            run_peak = sampler.peak
            counted = {}
            for label, query, marker in (("JSON", "", b'"step": '), ("CSV", "?format=csv", b"\n")):
                code, points, took = _read_points(server.port, f"/api/runs/{run_id}/metrics{query}", marker,
                                                  args.timeout)
                counted[label] = points - (1 if label == "CSV" and code == 200 else 0)  # the CSV's header
                lines.append(f"GET /api/runs/ID/metrics{query}: {code}, {counted[label]:,} points in {took:.1f} s; "
                             f"peak so far {sampler.peak:.0f} MiB, after {args.settle_s:g} s "
                             f"{_settle(sampler, args.settle_s):.0f} MiB")
            sampler.done.set()
            sampler.join()
            after_rss, hwm = rss_mib(server.pid)
            conn.close()
        finally:
            stop_server_proc(server.proc, 60.0)
        stored = _stored_points(home / "troupe.db", run_id)
    print(f"RSS (MiB = 2^20 bytes) sampled every {args.sample_s:g} s, {sampler.samples} samples; at the start "
          f"{start_rss:.0f} MiB")
    for line in lines:
        print(line)
    print(f"stored: {stored:,} of {expected:,} points (the database, read after the server stopped)")
    print(f"at the end: RSS {after_rss:.0f} MiB (+{after_rss - start_rss:.0f} MiB from the start); peak "
          f"{max(sampler.peak, hwm):.0f} MiB (VmHWM {hwm:.0f} MiB; the run alone {run_peak:.0f} MiB)")
    print(f"goals: peak < 600 MiB: {'yes' if hwm < 600 else 'no'}; RSS after within 100 MiB of the start: "
          f"{'yes' if after_rss - start_rss <= 100 else 'no'}")
    print("command: .venv/bin/python bench/ticker_memory.py "
          f"--nodes {args.nodes} --count {args.count} --sample-s {args.sample_s:g} --settle-s {args.settle_s:g}")
    whole = status == "succeeded" and stored == expected and counted == {"JSON": expected, "CSV": expected}
    return 0 if whole else 1


if __name__ == "__main__":
    run_main(main)
