"""The queue benchmark's two phases, each measured and printed as it goes: troupe (its own
server: RSS idle, latency, drain and its check, RSS after) and task-spooler (latency, drain).
Each phase notes its figures for the summary and answers 1 when a run or job failed."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from bench._http import HOST
from bench._measure import LatencyResult, fmt_ms, rss_mb, steal_s, summary, torch_mapped
from bench._troupe import DrainResult, Server, start_server, stop_server_proc, troupe_drain, troupe_latency
from bench._tsp import Tsp, find_tsp, tsp_drain, tsp_latency


def troupe_phase(args: argparse.Namespace, graph_body: bytes, tmp: Path, figures: dict[str, Any]) -> int:
    """Starts the server, measures and prints its latency, drain and RSS, stops it; 1 when a run failed."""
    home = tmp / "home"
    home.mkdir()
    server = start_server(home, args.cpu_slots, timeout=60.0)
    stopped: int | None = None
    try:
        print(f"troupe: server pid {server.pid} on http://{HOST}:{server.port}, serving after {server.start_s:.2f} s")
        time.sleep(1.0)
        idle_rss, _ = rss_mb(server.pid)
        idle_torch = torch_mapped(server.pid)
        print(
            f"troupe: RSS idle {idle_rss:.1f} MB ({idle_rss * 1e6 / 2**20:.1f} MiB); "
            f"torch libraries mapped: {'yes' if idle_torch else 'no'}"
        )
        lat, lat_s = _latency(args, server, graph_body)
        after_lat_rss, _ = rss_mb(server.pid)
        drain, drain_ok = _drain(args, server, graph_body, lat.events_per_run)
        code = 0 if drain_ok and lat.failures == 0 else 1
        drain_rss, drain_hwm = rss_mb(server.pid)
        drain_torch = torch_mapped(server.pid)
        print(
            f"troupe: RSS after latency {after_lat_rss:.1f} MB, after drain {drain_rss:.1f} MB "
            f"({drain_rss * 1e6 / 2**20:.1f} MiB; peak {drain_hwm:.1f} MB); "
            f"torch libraries mapped: {'yes' if drain_torch else 'no'}"
        )
        figures["troupe"] = dict(
            lat=lat_s,
            drain=drain,
            idle_rss=idle_rss,
            drain_rss=drain_rss,
            drain_hwm=drain_hwm,
            torch=idle_torch or drain_torch,
        )
    finally:
        stopped = stop_server_proc(server.proc, 30.0)
        if stopped not in (0, None):
            print(f"troupe: the server exited {stopped}; last log lines:")
            print("\n".join(server.log_path.read_text(errors="replace").splitlines()[-10:]))
    print(f"troupe: server stopped (exit {stopped})")
    print()
    return code


def _latency(args: argparse.Namespace, server: Server, graph_body: bytes) -> tuple[LatencyResult, dict[str, float]]:
    """The sequential runs, printed; their figures and the summary of their totals."""
    steal0 = steal_s()
    lat = troupe_latency(server, graph_body, args.runs, args.warmup, args.timeout, args.client == "plain")
    steal1 = steal_s()
    lat_s = summary(lat.total_s)
    how = "a new connection per request" if args.client == "plain" else "one keep-alive connection"
    print(f"troupe latency (submit -> run_finished on the run's stream, {how}), {args.runs} sequential runs:")
    print(f"  total   {fmt_ms(lat_s)}")
    print(f"  submit  {fmt_ms(summary(lat.submit_s))}   (POST /api/runs -> 201)")
    if lat.server_s:
        print(f"  server  {fmt_ms(summary(lat.server_s))}   (run_queued ts -> run_finished ts)")
    print(
        f"  {lat.events_per_run} events per run; {lat.failures} runs not succeeded; "
        f"CPU steal meanwhile {steal1 - steal0:.2f} s"
    )
    return lat, lat_s


def _drain(
    args: argparse.Namespace, server: Server, graph_body: bytes, events_per_run: int
) -> tuple[DrainResult, bool]:
    """The drain and its check, printed; its figures and whether every run succeeded with
    every event persisted."""
    steal0 = steal_s()
    drain = troupe_drain(server, graph_body, args.drain, args.threads, args.timeout, events_per_run,
                         args.client == "plain")
    steal1 = steal_s()
    sub = summary(drain.submit_latencies_s)
    print(
        f"troupe drain: {drain.n} runs from {args.threads} threads on cpu ({args.cpu_slots} slots), "
        f"waited by {drain.waited_by}"
    )
    print(
        f"  {drain.wall_s:.2f} s first submit -> last finished = {drain.runs_per_s:.1f} runs/s"
        f"  (submitting took {drain.last_submit - drain.first_submit:.2f} s, "
        f"POST median {sub['median']:.2f} ms p99 {sub['p99']:.2f} ms)"
    )
    server_cpu = drain.server_user_s + drain.server_sys_s
    print(
        f"  CPU during the drain: server {server_cpu:.2f} s (user {drain.server_user_s:.2f} + sys "
        f"{drain.server_sys_s:.2f}) = {server_cpu / drain.n * 1000:.2f} ms per run; this client "
        f"{drain.client_cpu_s:.2f} s; {drain.tids_created} threads/processes created on the machine "
        f"({drain.tids_created / drain.n:.1f} per run)"
    )
    print(f"  rows: {drain.statuses}; listed as succeeded: {drain.listed_succeeded}/{drain.n}")
    print(
        f"  events: {drain.events_ok}/{drain.events_checked} runs have seqs 1..{events_per_run} "
        f"ending in run_finished succeeded"
    )
    for problem in drain.events_problems[:5]:
        print(f"    {problem}")
    drain_ok = (
        drain.statuses.get("succeeded", 0) == drain.n
        and drain.listed_succeeded == drain.n
        and drain.events_ok == drain.n
        and drain.submitted == args.drain
    )
    print(f"  verification: {'all runs succeeded and every event persisted' if drain_ok else 'FAILED'}")
    print(f"  CPU steal during the drain and its verification: {steal1 - steal0:.2f} s")
    return drain, drain_ok


def tsp_phase(args: argparse.Namespace, tmp: Path, figures: dict[str, Any]) -> int:
    """The same latency and drain for task-spooler, when installed; 1 when a job failed."""
    binary = find_tsp()
    if binary is None:
        print("task-spooler: not installed (`apt-get install -y task-spooler`); skipped")
        return 0
    code = 0
    tsp_dir = tmp / "tsp"
    tsp_dir.mkdir()
    tsp = Tsp(binary, tsp_dir, args.cpu_slots, args.runs + args.warmup + args.drain + 64)
    try:
        probe = tsp.call("-V", check=False)
        version = (probe.stdout.strip() or probe.stderr.strip()).splitlines()[0]
        print(f"task-spooler: {binary} ({version}), {args.cpu_slots} slots, private TS_SOCKET")
        steal0 = steal_s()
        tlat = tsp_latency(tsp, args.runs, args.warmup, args.timeout)
        tlat_s = summary(tlat.total_s)
        print(f"tsp latency (`tsp true` then `tsp -w ID`), {args.runs} sequential runs:")
        print(f"  total   {fmt_ms(tlat_s)}")
        print(f"  submit  {fmt_ms(summary(tlat.submit_s))}   (`tsp true`)")
        print(f"  {tlat.failures} jobs exited non-zero")
        tdrain = tsp_drain(tsp, args.drain, args.threads, args.timeout)
        steal1 = steal_s()
        print(
            f"tsp drain: {tdrain.n} `tsp true` from {args.threads} threads: {tdrain.wall_s:.2f} s = "
            f"{tdrain.runs_per_s:.1f} runs/s; states {tdrain.states}"
        )
        print(f"  CPU steal during the tsp latency and drain: {steal1 - steal0:.2f} s")
        if tdrain.ok != tdrain.n or tlat.failures:
            code = 1
        figures["tsp"] = dict(lat=tlat_s, drain=tdrain)
    finally:
        tsp.kill()
    print("task-spooler: server killed (tsp -K)")
    print()
    return code
