"""troupe.Client's overhead over the raw HTTP path, for the same run (issue 63).

Starts a real ``troupe start`` on 127.0.0.1 with a temporary TROUPE_HOME and times,
alternating in rounds, ``examples/hello.json`` submitted and waited on two ways:

* raw: one keep-alive HTTP/1.1 connection, ``POST /api/runs``, then
  ``GET /api/runs/{id}/stream`` on it until ``run_finished`` (bench/_http.py);
* client: ``troupe.Client(url, token=...).run(hello, wait=True)``, the notebook's line
  (one client, its connection pool kept between runs).

Prints each way's median and p90 (nearest rank), the difference of the medians, and the
command that reproduces it. Goal (reported, not asserted): the client within 1 ms of raw.

    .venv/bin/python bench/client.py --runs 100 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # the bench package, not this folder

import troupe  # noqa: E402
from bench._http import Conn  # noqa: E402
from bench._measure import BenchError, machine, percentile, run_main  # noqa: E402
from bench._troupe import REPO, start_server, stop_server_proc  # noqa: E402

HELLO = json.loads((REPO / "examples" / "hello.json").read_text())


def _raw(conn: Conn, body: bytes) -> float:
    t0 = time.perf_counter()
    status, reply = conn.request("POST", "/api/runs", body)
    if status != 201:
        raise BenchError(f"POST /api/runs answered {status}: {reply}")
    for kind, data in conn.stream(f"/api/runs/{reply['run_id']}/stream"):
        if kind == "run_event" and data["type"] == "run_finished":
            if data["payload"]["status"] != "succeeded":
                raise BenchError(f"run {reply['run_id']} {data['payload']['status']}")
            return time.perf_counter() - t0
    raise BenchError(f"run {reply['run_id']}: the stream ended without run_finished")


def _client(client: troupe.Client) -> float:
    t0 = time.perf_counter()
    run = client.run(HELLO, wait=True)
    took = time.perf_counter() - t0
    if not run.ok:
        raise BenchError(f"run {run.id} {run.status}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100, help="runs of each way per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="troupe-bench-client-") as home:
        server = start_server(Path(home), cpu_slots=2, timeout=60)
        try:
            url = f"http://127.0.0.1:{server.port}"
            conn = Conn(server.port, server.token, 60)
            client = troupe.Client(url, token=server.token)
            body = json.dumps({"graph": HELLO}).encode()
            for _ in range(args.warmup):
                _raw(conn, body)
                _client(client)
            raw: list[float] = []
            ours: list[float] = []
            for _ in range(args.rounds):  # alternate, so that a drift of the host hits both ways alike
                raw += [_raw(conn, body) for _ in range(args.runs)]
                ours += [_client(client) for _ in range(args.runs)]
            conn.close()
            client.close()
        finally:
            stop_server_proc(server.proc, 30)
    raw_ms = sorted(x * 1000 for x in raw)
    ours_ms = sorted(x * 1000 for x in ours)
    print(f"machine: {machine()}")
    print(f"raw HTTP (keep-alive POST + stream): median {percentile(raw_ms, 50):.2f} ms, "
          f"p90 {percentile(raw_ms, 90):.2f} ms ({len(raw_ms)} runs)")
    print(f"troupe.Client.run(wait=True):        median {percentile(ours_ms, 50):.2f} ms, "
          f"p90 {percentile(ours_ms, 90):.2f} ms ({len(ours_ms)} runs)")
    print(f"client - raw, medians: {percentile(ours_ms, 50) - percentile(raw_ms, 50):+.2f} ms (goal: <= 1 ms)")
    print(f"reproduce: .venv/bin/python bench/client.py --runs {args.runs} --rounds {args.rounds} "
          f"--warmup {args.warmup}")
    return 0


if __name__ == "__main__":
    run_main(main)
