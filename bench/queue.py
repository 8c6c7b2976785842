"""Queue benchmark: troupe's control plane against task-spooler, on loopback.

Measures, in one invocation, against a real ``troupe start`` on 127.0.0.1:

1. submit-to-result latency of examples/hello.json over ``--runs`` sequential runs:
   POST /api/runs, then wait on GET /api/runs/{id}/stream until ``run_finished``;
2. the time to drain ``--drain`` runs submitted at once on ``cpu`` by ``--threads``
   client threads, from the first submit to the last ``succeeded`` seen on the global
   stream GET /api/stream; then every run is checked (status and persisted events);
3. the control plane's RSS (VmRSS of the server pid) idle after start, after the
   latency runs and after the drain, and whether torch's libraries are mapped into it;
4. the same latency and drain for task-spooler (``tsp true`` / ``tsp -w``) with 2 slots,
   and the troupe/tsp ratios, against the goals of issue 42 (latency ratio <= 0.9, drain
   ratio >= 1.2; issue 12 asked for 1 and 1).

``--client plain`` makes every request on a new connection, as a user's script does
(the POST on one, the run's stream on another); the default keeps one connection per
client thread.

``--rounds N`` repeats both phases N times in turn, each troupe round with a fresh server,
and reports the medians: this VM's CPU steal moves one invocation's figures by tens of
percent, tsp's as much as troupe's.

Run it from the repository root: ``.venv/bin/python bench/queue.py``. It starts its own
server and its own tsp server in temporary directories, talks only to 127.0.0.1 and a
private unix socket, stops both at the end, and is bounded by ``--max-seconds``.
"""

# ruff: noqa: E402
from __future__ import annotations

import os
import sys

# Run as a script, this file's folder comes first on sys.path and this file would shadow
# the standard library's ``queue`` (which concurrent.futures, logging.handlers... import);
# the helpers beside it are imported as the package ``bench`` from the repository root.
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench._measure import machine, run_main, time_limit
from bench._phases import troupe_phase, tsp_phase
from bench._troupe import REPO

TARGET_MEDIAN_MS = 10.0
TARGET_RUNS_PER_S = 250.0
TARGET_IDLE_RSS_MB = 80.0
GOAL_LATENCY_RATIO = 0.9  # issue 42: troupe's median latency at most 0.9 of tsp's
GOAL_DRAIN_RATIO = 1.2  # issue 42: troupe drains at least 1.2 times as many runs per second as tsp


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The options, and those not at their default as a command line would spell them."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=200, help="sequential runs for the latency (default 200)")
    parser.add_argument("--drain", type=int, default=1000, help="runs submitted at once for the drain (default 1000)")
    parser.add_argument("--threads", type=int, default=4, help="client threads submitting the drain (default 4)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed runs before the latency runs (default 5)")
    parser.add_argument("--cpu-slots", type=int, default=2, help="cpu slots of both queues (default 2, troupe's)")
    parser.add_argument("--rounds", type=int, default=1, help="repeat both phases, report medians (default 1)")
    parser.add_argument("--skip-tsp", action="store_true", help="do not run the task-spooler comparison")
    parser.add_argument("--client", choices=("keepalive", "plain"), default="keepalive",
                        help="keepalive: one connection per client thread (default); plain: a new connection "
                             "for each request, as a user's script makes them")
    parser.add_argument("--timeout", type=float, default=300.0, help="limit of each phase in seconds (default 300)")
    parser.add_argument("--max-seconds", type=int, default=1200, help="hard limit of the whole run (default 1200)")
    args = parser.parse_args(argv)
    if not (1 <= args.runs <= 100_000 and 1 <= args.drain <= 100_000 and 1 <= args.threads <= 64
            and 1 <= args.rounds <= 20):
        parser.error("--runs and --drain must be 1..100000, --threads 1..64, --rounds 1..20")
    changed = [
        f"--{name.replace('_', '-')} {getattr(args, name)}"
        for name in ("runs", "drain", "threads", "warmup", "cpu_slots", "rounds", "client")
        if getattr(args, name) != parser.get_default(name)
    ]
    return args, changed + (["--skip-tsp"] if args.skip_tsp else [])


def _median(values: list[float]) -> float:
    return statistics.median(values)


def print_summary(rounds: list[dict[str, Any]]) -> None:
    """One line per figure: the median over the rounds of troupe's value, tsp's and their
    ratio (the median of each round's ratio: a round's two phases ran minutes apart)."""
    ts = [r["troupe"] for r in rounds]
    ss = [r["tsp"] for r in rounds if "tsp" in r]
    both = [r for r in rounds if "troupe" in r and "tsp" in r]
    over = f" over {len(rounds)} rounds, medians" if len(rounds) > 1 else ""
    print("Summary" + over + (" (ratio = troupe / tsp; MB = 10^6 bytes)" if ss else " (MB = 10^6 bytes)"))

    def lat(f: dict[str, Any], key: str) -> float:
        return float(f["lat"][key])

    def drain_rate(f: dict[str, Any]) -> float:
        return float(f["drain"].runs_per_s)

    def drain_s(f: dict[str, Any]) -> float:
        return float(f["drain"].wall_s)

    figures: list[tuple[str, Any, str, Any]] = [
        ("latency median (ms)", lambda f: lat(f, "median"), f"<= {TARGET_MEDIAN_MS:g}",
         lambda v: v <= TARGET_MEDIAN_MS),
        ("latency p99 (ms)", lambda f: lat(f, "p99"), "", None),
        (f"drain {ts[0]['drain'].n} (runs/s)", drain_rate, f">= {TARGET_RUNS_PER_S:g}",
         lambda v: v >= TARGET_RUNS_PER_S),
        (f"drain {ts[0]['drain'].n} (s)", drain_s, "", None),
    ]
    print(f"  {'metric':<24}{'troupe':>10}{'tsp':>10}{'ratio':>8}  {'target':<9} verdict")
    ratios: dict[str, list[float]] = {}
    for name, get, target, check in figures:
        tv = _median([get(f) for f in ts])
        sv = _median([get(f) for f in ss]) if ss else None
        ratios[name] = [get(r["troupe"]) / get(r["tsp"]) for r in both]
        sv_text = f"{sv:10.2f}" if sv else f"{'-':>10}"
        ratio = f"{_median(ratios[name]):8.2f}" if both else f"{'-':>8}"
        mark = "" if check is None else ("meets target" if check(tv) else "MISSES target")
        print(f"  {name:<24}{tv:10.2f}{sv_text}{ratio}  {target:<9} {mark}")
    for name, key in (("RSS idle (MB)", "idle_rss"), ("RSS after drain (MB)", "drain_rss")):
        tv = _median([float(f[key]) for f in ts])
        target = f"<= {TARGET_IDLE_RSS_MB:g}" if key == "idle_rss" else ""
        mark = ("meets target" if tv <= TARGET_IDLE_RSS_MB else "MISSES target") if key == "idle_rss" else ""
        print(f"  {name:<24}{tv:10.2f}{'-':>10}{'-':>8}  {target:<9} {mark}")
    print(f"  torch imported in the server (libtorch mapped): {'yes' if any(f['torch'] for f in ts) else 'no'}")
    if both:
        lat_ratios, drain_ratios = ratios[figures[0][0]], ratios[figures[2][0]]
        print("Goals of issue 42 (ratio to tsp in the same round):")
        for label, values, goal, met in (
            ("latency median", lat_ratios, f"<= {GOAL_LATENCY_RATIO:g}", _median(lat_ratios) <= GOAL_LATENCY_RATIO),
            ("drain runs/s", drain_ratios, f">= {GOAL_DRAIN_RATIO:g}", _median(drain_ratios) >= GOAL_DRAIN_RATIO),
        ):
            each = ", ".join(f"{v:.2f}" for v in values)
            print(f"  {label:<16} {_median(values):5.2f} {goal:<6} {'met' if met else 'MISSED'}  (rounds: {each})")


def main(argv: list[str] | None = None) -> int:
    args, changed = parse_args(argv)

    time_limit(args.max_seconds)

    graph_body = json.dumps({"graph": json.loads((REPO / "examples" / "hello.json").read_text())}).encode()
    info = machine()
    print(f"troupe queue benchmark  {info['date']}")
    print(f"machine: {info['nproc']} cores ({info['cpu']}), python {info['python']}, linux {info['kernel']}")
    print(info["free"])
    print(
        f"settings: --runs {args.runs} --drain {args.drain} --threads {args.threads} --warmup {args.warmup} "
        f"--cpu-slots {args.cpu_slots} --client {args.client}{' --skip-tsp' if args.skip_tsp else ''}"
    )
    print()

    rounds: list[dict[str, Any]] = []
    code = 0
    for number in range(1, args.rounds + 1):
        if args.rounds > 1:
            print(f"== round {number} of {args.rounds}")
        figures: dict[str, Any] = {}
        with tempfile.TemporaryDirectory(prefix="troupe-bench-", ignore_cleanup_errors=True) as tmp:
            code |= troupe_phase(args, graph_body, Path(tmp), figures)
            if not args.skip_tsp and tsp_phase(args, Path(tmp), figures):
                code = 1
        if "troupe" in figures:
            rounds.append(figures)
        print()
    time_limit(0)
    if rounds:
        print_summary(rounds)
    print()
    print("reproduce, from the repository root: .venv/bin/python bench/queue.py" + "".join(" " + e for e in changed))
    return code


if __name__ == "__main__":
    run_main(main)
