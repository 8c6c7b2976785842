"""A script's sequential runs with retention on, as a server keeps runs by default.

bench/queue.py keeps every run (its drain checks each one), so retention never runs
there. A user's server keeps the newest 200 (``TROUPE_RUN_RETENTION_KEEP_LAST``), and
once it holds that many, every run that ends makes room by pruning the oldest. This
measures examples/hello.json submitted and followed to ``run_finished`` by the pattern
of a user's script (a new connection for the POST, another for the run's stream),
against a server that keeps ``--keep-last`` runs and one that keeps every run, in
alternating rounds, each with a fresh server. ``--runs`` is well past ``--keep-last``,
so most timed runs prune one.

    .venv/bin/python bench/retention.py --rounds 3

It starts its own servers in temporary directories on 127.0.0.1 and stops them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

# As in queue.py: this folder is left off sys.path and the repository root goes first.
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [os.path.dirname(_HERE), *(p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE)]

from bench._measure import BenchError, machine, run_main, time_limit  # noqa: E402
from bench._troupe import REPO, start_server, stop_server_proc, troupe_latency  # noqa: E402


def _median_ms(keep: int, body: bytes, runs: int, warmup: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        server = start_server(home, 2, 60.0, extra_env={"TROUPE_RUN_RETENTION_KEEP_LAST": str(keep)})
        try:
            result = troupe_latency(server, body, runs, warmup, 60.0, fresh=True)
        finally:
            stop_server_proc(server.proc, 30.0)
    if result.failures:
        raise BenchError(f"{result.failures} runs did not succeed (keep {keep})")
    return statistics.median(result.total_s) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--keep-last", type=int, default=200, help="runs the server keeps (default 200, its own)")
    parser.add_argument("--runs", type=int, default=1000, help="timed sequential runs a round (default 1000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each setting, alternating (default 3)")
    parser.add_argument("--max-seconds", type=int, default=600, help="hard limit of the whole run (default 600)")
    args = parser.parse_args()
    if not (0 <= args.keep_last < args.runs <= 100_000 and 1 <= args.rounds <= 20):
        parser.error("--keep-last must be 0 or more and below --runs (at most 100000); --rounds 1..20")
    time_limit(args.max_seconds)
    print("machine:", ", ".join(f"{k} {v}" for k, v in machine().items()))
    body = json.dumps({"graph": json.loads((REPO / "examples" / "hello.json").read_text())}).encode()
    # The warm-up fills the server up to what it keeps: every timed run then prunes one.
    figures: dict[int, list[float]] = {args.keep_last: [], -1: []}
    for number in range(args.rounds):
        for keep in figures:
            figures[keep].append(_median_ms(keep, body, args.runs, args.keep_last + 5))
            print(f"round {number + 1}, keep {keep if keep >= 0 else 'every run'}: median {figures[keep][-1]:.2f} ms")
    kept, every = statistics.median(figures[args.keep_last]), statistics.median(figures[-1])
    print(f"submit -> run_finished, median of the rounds' medians: keep {args.keep_last} {kept:.2f} ms, "
          f"keep every run {every:.2f} ms ({kept / every:.2f}x)")
    print(f"reproduce, from the repository root: .venv/bin/python bench/retention.py --keep-last {args.keep_last} "
          f"--runs {args.runs} --rounds {args.rounds}")
    return 0


if __name__ == "__main__":
    run_main(main)
