"""Scale benchmark: one control plane at a lab's scale, with simulated worker agents.

Against a real ``troupe start`` on 127.0.0.1 and ``--agents`` simulated agents (one
asyncio process, each agent its own websocket to ``/ws/worker``, enrolled with its own
join token and credential, a simulated inventory of 1-8 cards, heartbeats at the server's
interval; see ``bench/_scale_agents.py``):

1. load: ``--runs`` runs submitted at ``--rate`` per second by ``--threads`` clients, spread
   over the agents' cards and cpus (target: the worker by name and one device) and, for
   ``--local-fraction`` of them, the control plane's own cpu queue (examples/hello.json).
   Meanwhile ``GET /api/runs`` (first page, ``?status=running``, ``?status=succeeded`` and
   its second page by cursor) and ``GET /api/workers`` are sampled: p50/p99/max (nearest
   rank). Also: heartbeats acknowledged per second, the server's RSS, CPU and open files;
   then every run is checked (succeeded, events 1..n with no gap, as many as it should);
2. restart: one long run on each agent's first ``--adopt-per-agent`` cards; once all run,
   the server is SIGKILLed and started again on the same home and port; the time until
   every agent is back, every run adopted and every replayed frame acknowledged; then
   every run is checked (succeeded, no gap, every point once).

``--scales 1,2,4`` repeats both with agents, runs and rate multiplied, to find the first
thing that breaks. Goals are reported, not asserted: exit 0 when every check passed, 1
when one failed (or a scale stopped), 2 when the benchmark could not run.

Run it from the repository root: ``.venv/bin/python bench/scale.py``. Everything lives in
a temporary directory; it talks only to 127.0.0.1 and is bounded by ``--max-seconds``.
"""

# ruff: noqa: E402
from __future__ import annotations

import os
import sys

# As in queue.py: the helpers beside this file are imported as the package ``bench`` from
# the repository root (first on sys.path), and this file's folder is left off it.
_HERE = os.path.dirname(os.path.realpath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path[:] = [_ROOT, *(p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE)]

import argparse
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from bench._measure import machine, run_main, time_limit
from bench._scale_run import run_scale
from bench._troupe import REPO

GOAL_RUNS_P99_MS = 50.0
DEFAULTS = {"agents": 200, "runs": 10_000, "rate": 50.0, "threads": 4, "local_fraction": 0.1, "run_seconds": 1.0,
            "heartbeat_s": 1.0, "sample_interval": 0.05, "adopt_per_agent": 1, "adopt_seconds": 20.0,
            "cpu_slots": 2, "seed": 1, "timeout": 300.0, "max_seconds": 1800}


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The options, and those not at their default as a command line would spell them."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    add = p.add_argument
    add("--agents", type=int, help="simulated agents at x1 (default 200)")
    add("--runs", type=int, help="runs of the load phase at x1 (default 10000)")
    add("--scale", type=int, default=1, help="multiply agents, runs and rate by this (default 1)")
    add("--scales", default="", help="a ramp, e.g. 1,2,4: one server per scale, in turn (overrides --scale)")
    add("--rate", type=float, help="runs submitted per second at x1, at most (default 50)")
    add("--threads", type=int, help="client threads submitting (default 4)")
    add("--local-fraction", type=float, help="share of runs on the control plane's cpu queue (default 0.1)")
    add("--run-seconds", type=float, help="length of a worker run of the load phase (default 1)")
    add("--heartbeat-s", type=float, help="TROUPE_WORKER_HEARTBEAT_S of the server (default 1; troupe's is 10)")
    add("--sample-interval", type=float, help="seconds between two latency samples (default 0.05)")
    add("--adopt-per-agent", type=int, help="long runs per agent in the restart phase, 0 to skip it (default 1)")
    add("--adopt-seconds", type=float, help="length of those runs (default 20)")
    add("--cpu-slots", type=int, help="slots of the control plane's cpu queue (default 2)")
    add("--seed", type=int, help="inventories and run placement (default 1)")
    add("--timeout", type=float, help="limit of each wait, s (default 300)")
    add("--max-seconds", type=int, help="hard limit of the whole invocation (default 1800)")
    add("--keep-going", action="store_true", help="go on with the ramp after a scale failed a check")
    p.set_defaults(**DEFAULTS)
    args = p.parse_args(argv)
    try:
        args.scale_list = [int(x) for x in args.scales.split(",")] if args.scales else [args.scale]
    except ValueError:
        p.error("--scales must be integers separated by commas, e.g. 1,2,4")
    if not (1 <= args.agents <= 5000 and 1 <= args.runs <= 1_000_000 and all(1 <= s <= 64 for s in args.scale_list)
            and args.rate > 0 and 1 <= args.threads <= 64 and 0 <= args.local_fraction <= 1
            and 0.01 <= args.run_seconds <= 600 and 0.1 <= args.heartbeat_s <= 60 and args.adopt_per_agent >= 0):
        p.error("out of range: --agents 1..5000, --runs 1..1000000, scales 1..64, --threads 1..64, "
                "--local-fraction 0..1, --run-seconds 0.01..600, --heartbeat-s 0.1..60")
    changed = [f"--{k.replace('_', '-')} {getattr(args, k):g}" if isinstance(v, float) else
               f"--{k.replace('_', '-')} {getattr(args, k)}" for k, v in DEFAULTS.items() if getattr(args, k) != v]
    changed += [f"--scales {args.scales}"] if args.scales else ([f"--scale {args.scale}"] if args.scale != 1 else [])
    return args, changed + (["--keep-going"] if args.keep_going else [])


def problems(fig: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(goals missed, checks failed) of one scale, in words."""
    missed, failed = [], []
    for name, s in fig.get("latency", {}).items():
        if s and name.startswith("runs") and s["p99"] > GOAL_RUNS_P99_MS:
            missed.append(f"GET /api/{name} p99 {s['p99']:.1f} ms > {GOAL_RUNS_P99_MS:g} ms")
    if "error" in fig:
        failed.append(f"stopped in the {fig['error']}")
    if fig.get("submit_errors"):
        failed.append(f"{len(fig['submit_errors'])} submissions refused or failed, e.g. {fig['submit_errors'][0]}")
    if fig.get("sample_errors"):
        failed.append(f"{len(fig['sample_errors'])} sampled GETs failed, e.g. {fig['sample_errors'][0]}")
    if fig.get("disconnects"):
        failed.append(f"{fig['disconnects']} agent connections dropped before the kill")
    for kind, check in fig.get("load_check", {}).items():
        if not check.ok:
            failed.append(f"load check ({kind}): {check.statuses}, events right {check.events_ok}/{check.n}")
    adoption = fig.get("adoption")
    if adoption is not None and adoption.errors:
        failed.append(f"restart: {adoption.errors[0]}")
    if "adopt_check" in fig and not fig["adopt_check"].ok:
        check = fig["adopt_check"]
        failed.append(f"restart check: {check.statuses}, {check.problems[:2]}")
    kills = fig.get("agent_counts", {}).get("kills", 0)
    if kills:
        failed.append(f"the server told agents to kill {kills} runs it no longer held")
    return missed, failed


def _cell(value: Any, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def print_summary(figs: list[dict[str, Any]]) -> None:
    print("Summary (ms unless said; p99 nearest rank; MB = 10^6 bytes)")
    head = "".join(f"{'x' + str(f['scale']):>14}" for f in figs)
    print(f"  {'figure':<48}{head}  goal")
    rows: list[tuple[str, list[str], str]] = [
        ("agents (cards)", [f"{f['agents']} ({f.get('cards', '?')})" for f in figs], ""),
        ("runs done (local + worker)", [f"{f.get('local', 0)}+{f.get('worker', 0)}" for f in figs], ""),
        ("runs/s, first submit to last finished", [_cell(f.get("runs_per_s"), "{:.1f}") for f in figs], ""),
        ("POST /api/runs p50 / p99", [_pair(f.get("submit")) for f in figs], ""),
    ]
    for name in figs[0].get("latency", {}) or {}:
        goal = f"p99 <= {GOAL_RUNS_P99_MS:g}" if name.startswith("runs") else ""
        rows.append((f"GET /api/{name} p50 / p99", [_pair((f.get("latency") or {}).get(name)) for f in figs], goal))
        rows.append(("  max", [_cell(((f.get("latency") or {}).get(name) or {}).get("max")) for f in figs], ""))
    rows += [
        ("heartbeats handled /s", [_cell(f.get("heartbeats_per_s"), "{:.1f}") for f in figs], ""),
        ("heartbeat -> ack p50 / p99", [_pair(f.get("hb_rtt")) for f in figs], ""),
        ("server CPU user + sys (s)", [_cell(f.get("server_user_s", 0) + f.get("server_sys_s", 0), "{:.1f}")
                                       if "server_user_s" in f else "-" for f in figs], ""),
        ("server CPU per run (ms)", [_cell(1000 * (f["server_user_s"] + f["server_sys_s"]) / f["submitted"], "{:.1f}")
                                     if f.get("submitted") else "-" for f in figs], ""),
        ("server RSS idle / max (MB)", [f"{_cell(f.get('idle_rss'), '{:.0f}')}/{_cell(f.get('rss_max'), '{:.0f}')}"
                                        for f in figs], ""),
        ("server open fds, max", [_cell(f.get("fds_max"), "{}") for f in figs], ""),
        ("agents process CPU (s)", [_cell(f.get("agents_cpu_s"), "{:.1f}") for f in figs], ""),
        ("restart: runs executing at the kill", [_cell(getattr(f.get("adoption"), "runs", None), "{}")
                                                 for f in figs], ""),
        ("  kill -> serving again (s)", [_cell(getattr(f.get("adoption"), "kill_to_serving_s", None))
                                         for f in figs], ""),
        ("  kill -> all agents welcomed (s)", [_cell(getattr(f.get("adoption"), "all_welcomed_s", None))
                                               for f in figs], ""),
        ("  kill -> all runs adopted (s)", [_cell(getattr(f.get("adoption"), "all_adopted_s", None)) for f in figs],
         ""),
        ("  kill -> all replays acked (s)", [_cell(getattr(f.get("adoption"), "replays_acked_s", None))
                                             for f in figs], ""),
        ("CPU steal in the load phase (s)", [_cell(f.get("steal_s"), "{:.1f}") for f in figs], ""),
    ]
    for label, cells, goal in rows:
        print(f"  {label:<48}{''.join(f'{c:>14}' for c in cells)}  {goal}")
    first = None
    for fig in figs:
        missed, failed = problems(fig)
        verdict = "all checks passed" if not failed else "CHECKS FAILED"
        print(f"  x{fig['scale']}: {verdict}; goals {'met' if not missed else 'MISSED'}")
        for line in missed + failed:
            print(f"    - {line}")
        if first is None and (missed or failed):
            first = f"x{fig['scale']}: {(missed + failed)[0]}"
    print(f"  first thing that broke: {first or 'nothing, at these scales'}")


def _pair(s: dict[str, float] | None) -> str:
    return "-" if not s else f"{s['median']:.1f}/{s['p99']:.1f}"


def main(argv: list[str] | None = None) -> int:
    args, changed = parse_args(argv)
    time_limit(args.max_seconds)
    info = machine()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=str(REPO), capture_output=True,
                            text=True).stdout.strip()
    print(f"troupe scale benchmark  {info['date']}  commit {commit or '?'}")
    print(f"machine: {info['nproc']} cores ({info['cpu']}), python {info['python']}, linux {info['kernel']}")
    print(f"settings: {vars(args)}")
    print()
    figs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="troupe-scale-", ignore_cleanup_errors=True) as tmp:
        for scale in args.scale_list:
            fig = run_scale(args, scale, Path(tmp))
            figs.append(fig)
            print()
            if fig.get("out_of_time") or (problems(fig)[1] and not args.keep_going):
                break
    time_limit(0)
    print_summary(figs)
    print()
    print("reproduce, from the repository root: .venv/bin/python bench/scale.py" + "".join(" " + c for c in changed))
    if figs[0].get("phase") == "start" and "error" in figs[0]:
        return 2  # the first scale never got its agents connected: nothing was measured
    return 1 if any(problems(f)[1] for f in figs) else 0


if __name__ == "__main__":
    run_main(main)
