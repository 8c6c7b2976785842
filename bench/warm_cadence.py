"""The warm pool as a user meets it: runs submitted at a steady pace to an agent started
with ``--warm 1``, never waiting for the pool between them, beside the same runs in the
server's own process at the same pace.

For each pace (seconds between two submissions) it submits ``--runs`` hello runs to the
worker, then as many to the server's in-process queue, on the clock, follows each to its
end on its own connection, and reports the median and p90 a user sees (submit to
``run_finished``, client time), the worker's median over the in-process one, and how many
worker runs started in a warm child. Then a digits training's time to its first epoch,
on the worker and in-process (``--digits N`` samples each, alternating).

    .venv/bin/python bench/warm_cadence.py --paces 0.2,0.5,1,3 --runs 12 --digits 3
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
from bench._measure import BenchError, percentile
from bench._troupe import REPO, start_server, stop_server_proc
from bench.worker import enroll_and_attach, first_epoch, one_run, started_warm

AGENT = "bench-warm"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paces", default="0.5,1,3", help="seconds between submissions (default 0.5,1,3)")
    parser.add_argument("--runs", type=int, default=12, help="runs per pace (default 12)")
    parser.add_argument("--digits", type=int, default=3, help="digits trainings timed to their first epoch, "
                                                               "each side (default 3; 0: none)")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    args.pace_list = [float(p) for p in args.paces.split(",") if p.strip()]
    if not args.pace_list or any(p <= 0 or p > 60 for p in args.pace_list) or not 1 <= args.runs <= 200 \
            or not 0 <= args.digits <= 20:
        parser.error("--paces are 0 < s <= 60, --runs 1..200, --digits 0..20")
    return args


def paced(port: int, token: str, body: bytes, pace: float, runs: int, timeout: float,
          queue_key: str) -> list[dict[str, Any]]:
    """Submits ``runs`` runs ``pace`` s apart on the clock, each followed on its own thread."""
    rows: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    def follow() -> None:
        conn = Conn(port, token, timeout)
        try:
            rows.append(one_run(conn, body, queue_key))
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


def _median_p90(rows: list[dict[str, Any]]) -> tuple[float, float]:
    times = [r["finished"] * 1000 for r in rows]
    return statistics.median(times), percentile(times, 90)


def _paces(conn: Conn, port: int, token: str, args: argparse.Namespace) -> None:
    graph = json.loads((REPO / "examples" / "hello.json").read_text())
    on_worker = json.dumps({"graph": graph, "options": {"target": {"worker": AGENT}}}).encode()
    in_process = json.dumps({"graph": graph}).encode()
    print(f"hello on an agent with --warm 1 and in the server's process, {args.runs} runs per pace each, "
          "submit -> run_finished")
    print("| seconds between runs | worker median | worker p90 | in-process median | in-process p90 | ratio | "
          "started warm |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for pace in args.pace_list:
        rows = paced(port, token, on_worker, pace, args.runs, args.timeout, f"{AGENT}/cpu")
        warm = sum(started_warm(conn, r["run_id"]) for r in rows)
        time.sleep(max(3.0, pace))  # the pool is full again; the in-process side starts alike
        here = paced(port, token, in_process, pace, args.runs, args.timeout, "cpu")
        (w_med, w_p90), (h_med, h_p90) = _median_p90(rows), _median_p90(here)
        print(f"| {pace:g} | {w_med:.1f} ms | {w_p90:.1f} ms | {h_med:.1f} ms | {h_p90:.1f} ms | "
              f"{w_med / h_med:.2f}x | {warm} of {len(rows)} |")
        time.sleep(max(3.0, pace))


def _digits(conn: Conn, side: Conn, samples: int) -> None:
    graph = json.loads((REPO / "examples" / "digits_mlp.json").read_text())
    bodies = {"worker": json.dumps({"graph": graph, "options": {"target": {"worker": AGENT}}}).encode(),
              "in-process": json.dumps({"graph": graph}).encode()}
    times: dict[str, list[float]] = {"worker": [], "in-process": []}
    for _ in range(samples):
        for where, body in bodies.items():
            times[where].append(first_epoch(conn, body, side)[0] * 1000)
            time.sleep(3.0)  # the pool refilled: each sample meets it as a quiet user does
    worker, here = statistics.median(times["worker"]), statistics.median(times["in-process"])
    print(f"digits_mlp, submit -> first epoch's train_loss, median of {samples}: worker {worker:.0f} ms, "
          f"in-process {here:.0f} ms, ratio {worker / here:.2f}x")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"command: .venv/bin/python bench/warm_cadence.py --paces {args.paces} --runs {args.runs} "
          f"--digits {args.digits}")
    with tempfile.TemporaryDirectory(prefix="troupe-bench-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        server = start_server(home, cpu_slots=2, timeout=args.timeout)
        agent = None
        try:
            conn = Conn(server.port, server.token, args.timeout)
            side = Conn(server.port, server.token, args.timeout)
            try:
                agent, _ = enroll_and_attach(conn, server.port, Path(tmp), args.timeout, AGENT, extra=("--warm", "1"))
                time.sleep(5)  # the first child is ready; from here on the pool is never waited for
                _paces(conn, server.port, server.token, args)
                if args.digits:
                    _digits(conn, side, args.digits)
            finally:
                conn.close()
                side.close()
        finally:
            if agent is not None:
                stop_server_proc(agent, 30)
            stop_server_proc(server.proc, 30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
