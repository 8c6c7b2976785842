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
   and the troupe/tsp ratios.

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
import tempfile
from pathlib import Path
from typing import Any

from bench._measure import machine, run_main, time_limit
from bench._phases import troupe_phase, tsp_phase
from bench._troupe import REPO

TARGET_MEDIAN_MS = 10.0
TARGET_RUNS_PER_S = 250.0
TARGET_IDLE_RSS_MB = 80.0


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The options, and those not at their default as a command line would spell them."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=200, help="sequential runs for the latency (default 200)")
    parser.add_argument("--drain", type=int, default=1000, help="runs submitted at once for the drain (default 1000)")
    parser.add_argument("--threads", type=int, default=4, help="client threads submitting the drain (default 4)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed runs before the latency runs (default 5)")
    parser.add_argument("--cpu-slots", type=int, default=2, help="cpu slots of both queues (default 2, troupe's)")
    parser.add_argument("--skip-tsp", action="store_true", help="do not run the task-spooler comparison")
    parser.add_argument("--timeout", type=float, default=300.0, help="limit of each phase in seconds (default 300)")
    parser.add_argument("--max-seconds", type=int, default=1200, help="hard limit of the whole run (default 1200)")
    args = parser.parse_args(argv)
    if not (1 <= args.runs <= 100_000 and 1 <= args.drain <= 100_000 and 1 <= args.threads <= 64):
        parser.error("--runs and --drain must be 1..100000, --threads 1..64")
    changed = [
        f"--{name.replace('_', '-')} {getattr(args, name)}"
        for name in ("runs", "drain", "threads", "warmup", "cpu_slots")
        if getattr(args, name) != parser.get_default(name)
    ]
    return args, changed + (["--skip-tsp"] if args.skip_tsp else [])


def print_summary(figures: dict[str, Any]) -> None:
    t = figures["troupe"]
    s = figures.get("tsp")
    print("Summary" + (" (ratio = troupe / tsp; MB = 10^6 bytes)" if s else " (MB = 10^6 bytes)"))
    rows = [
        (
            "latency median (ms)",
            t["lat"]["median"],
            s and s["lat"]["median"],
            f"<= {TARGET_MEDIAN_MS:g}",
            t["lat"]["median"] <= TARGET_MEDIAN_MS,
        ),
        ("latency p99 (ms)", t["lat"]["p99"], s and s["lat"]["p99"], "", None),
        (
            f"drain {t['drain'].n} (runs/s)",
            t["drain"].runs_per_s,
            s and s["drain"].runs_per_s,
            f">= {TARGET_RUNS_PER_S:g}",
            t["drain"].runs_per_s >= TARGET_RUNS_PER_S,
        ),
        (f"drain {t['drain'].n} (s)", t["drain"].wall_s, s and s["drain"].wall_s, "", None),
        ("RSS idle (MB)", t["idle_rss"], None, f"<= {TARGET_IDLE_RSS_MB:g}", t["idle_rss"] <= TARGET_IDLE_RSS_MB),
        ("RSS after drain (MB)", t["drain_rss"], None, "", None),
    ]
    print(f"  {'metric':<24}{'troupe':>10}{'tsp':>10}{'ratio':>8}  {'target':<9} verdict")
    for name, tv, sv, target, met in rows:
        sv_text = f"{sv:10.2f}" if sv else f"{'-':>10}"
        ratio = f"{tv / sv:8.2f}" if sv else f"{'-':>8}"
        mark = "" if met is None else ("meets target" if met else "MISSES target")
        print(f"  {name:<24}{tv:10.2f}{sv_text}{ratio}  {target:<9} {mark}")
    print(f"  torch imported in the server (libtorch mapped): {'yes' if t['torch'] else 'no'}")


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
        f"--cpu-slots {args.cpu_slots}{' --skip-tsp' if args.skip_tsp else ''}"
    )
    print()

    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="troupe-bench-", ignore_cleanup_errors=True) as tmp:
        code = troupe_phase(args, graph_body, Path(tmp), figures)
        if not args.skip_tsp and tsp_phase(args, Path(tmp), figures):
            code = 1
    time_limit(0)
    if "troupe" in figures:
        print_summary(figures)
    print()
    print("reproduce, from the repository root: .venv/bin/python bench/queue.py" + "".join(" " + e for e in changed))
    return code


if __name__ == "__main__":
    run_main(main)
