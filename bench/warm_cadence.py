"""The warm pool as a user meets it: runs submitted at a steady pace to an agent started
with ``--warm 1``, never waiting for the pool between them.

For each pace (seconds between two submissions) it submits ``--runs`` hello runs (and,
with ``--digits``, the digits example, which imports torch) on the clock, follows each
to its end on its own connection, and reports the median and p90 a user sees (submit to
``run_finished``, client time) and how many runs started in a warm child.

    .venv/bin/python bench/warm_cadence.py --paces 0.5,1,3 --runs 12
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._http import Conn
from bench._measure import BenchError
from bench._troupe import REPO, start_server, stop_server_proc
from bench.worker import enroll_and_attach, one_run, started_warm

AGENT = "bench-warm"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paces", default="0.5,1,3", help="seconds between submissions (default 0.5,1,3)")
    parser.add_argument("--runs", type=int, default=12, help="runs per pace (default 12)")
    parser.add_argument("--digits", action="store_true", help="the digits example instead of hello")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    args.pace_list = [float(p) for p in args.paces.split(",") if p.strip()]
    if not args.pace_list or any(p <= 0 or p > 60 for p in args.pace_list) or not 1 <= args.runs <= 200:
        parser.error("--paces are 0 < s <= 60, --runs 1..200")
    return args


def paced(port: int, token: str, body: bytes, pace: float, runs: int, timeout: float) -> list[dict[str, Any]]:
    """Submits ``runs`` runs ``pace`` s apart on the clock, each followed on its own thread."""
    rows: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    def follow() -> None:
        conn = Conn(port, token, timeout)
        try:
            rows.append(one_run(conn, body, f"{AGENT}/cpu"))
        except BaseException as exc:  # reported after the pace
            errors.append(exc)
        finally:
            conn.close()

    threads = []
    start = time.monotonic()
    for i in range(runs):
        time.sleep(max(0.0, start + i * pace - time.monotonic()))  # a fixed rate, never a flood
        thread = threading.Thread(target=follow)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    if errors:
        raise BenchError(f"a run failed at pace {pace}: {errors[0]}")
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    example = "digits_mlp.json" if args.digits else "hello.json"
    graph = json.loads((REPO / "examples" / example).read_text())
    body = json.dumps({"graph": graph, "options": {"target": {"worker": AGENT}}}).encode()
    command = f".venv/bin/python bench/warm_cadence.py --paces {args.paces} --runs {args.runs}" + (
        " --digits" if args.digits else "")
    print(f"command: {command}")
    with tempfile.TemporaryDirectory(prefix="troupe-bench-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        server = start_server(home, cpu_slots=2, timeout=args.timeout)
        agent = None
        try:
            conn = Conn(server.port, server.token, args.timeout)
            try:
                agent, _ = enroll_and_attach(conn, server.port, Path(tmp), args.timeout, AGENT, extra=("--warm", "1"))
                time.sleep(5)  # the first child is ready; from here on the pool is never waited for
                print(f"{example} on an agent with --warm 1, {args.runs} runs per pace, submit -> run_finished")
                print("| seconds between runs | median | p90 | started warm |")
                print("| ---: | ---: | ---: | ---: |")
                for pace in args.pace_list:
                    rows = paced(server.port, server.token, body, pace, args.runs, args.timeout)
                    times = sorted(r["finished"] * 1000 for r in rows)
                    warm = sum(started_warm(conn, r["run_id"]) for r in rows)
                    p90 = times[min(len(times) - 1, int(0.9 * len(times)))]
                    print(f"| {pace:g} | {statistics.median(times):.0f} ms | {p90:.0f} ms | {warm} of {len(rows)} |")
                    time.sleep(max(5.0, pace))  # the next pace starts with a ready child too
            finally:
                conn.close()
        finally:
            if agent is not None:
                stop_server_proc(agent, 30)
            stop_server_proc(server.proc, 30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
