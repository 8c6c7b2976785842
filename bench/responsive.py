"""Responsiveness benchmark: does the control plane keep answering while it trains?

Against a real ``troupe start`` on 127.0.0.1, a client on loopback sends ``GET /api/runs``
every ``--interval`` seconds (sequentially, one keep-alive connection) and records each
answer's latency; p50 and p99 (nearest rank) per case:

1. idle: nothing runs, for ``--duration`` s;
2. start-up: two ``examples/digits_mlp.json`` trainings were just submitted on ``cpu``
   (both run at once: 2 cpu slots), until both logged their first epoch (torch's import and
   the data set load happen in the server process then);
3. training: the two trainings run (``trainer`` epochs raised to ``--epochs``), for
   ``--duration`` s or until one of them ends; then both are cancelled. The epochs each
   completed in that window (length of its ``train_loss`` series) show what the caps cost.

Each configuration gets its own server: ``on`` is the default (thread caps from
TROUPE_CPUS, switch interval 0.5 ms); ``off`` runs with the caps off (OMP_NUM_THREADS and
the other thread variables = nproc in the server's environment) and the switch interval
at Python's default 5 ms, set by starting the server through a ``python -c`` wrapper that
changes ``troupe.cli.start_cmd.SWITCH_INTERVAL_S`` first; ``caps-off`` and ``switch-off`` change
one of the two. The server's ``GET /api/info`` (runtime.switch_interval_s) is checked.

Run it from the repository root: ``.venv/bin/python bench/responsive.py``. It talks only to
127.0.0.1, stops its servers at the end and is bounded by ``--max-seconds``.
"""

# ruff: noqa: E402
from __future__ import annotations

import os
import sys

# As in queue.py: the helpers beside this file are imported as the package ``bench`` from
# the repository root, and this file's folder is not left on sys.path.
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._http import Conn
from bench._measure import (
    BenchError,
    cpu_seconds,
    environ,
    machine,
    next_tick,
    run_main,
    steal_s,
    summary,
    time_limit,
)
from bench._troupe import REPO, TERMINAL, Server, start_argv, start_server, stop_server_proc

TARGET_P99_MS = 100.0
PYTHON_SWITCH_INTERVAL_S = 0.005
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
WRAPPER = (
    "import sys, troupe.cli.start_cmd as s; s.SWITCH_INTERVAL_S = {interval!r}; "
    "from troupe.cli.main import main; sys.argv = ['troupe', *{argv!r}]; main()"
)
CONFIGS = {  # name: (thread caps on, switch interval left at troupe's)
    "on": (True, True),
    "off": (False, False),
    "caps-off": (False, True),
    "switch-off": (True, False),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--duration", type=float, default=15.0, help="seconds of sampling per window (default 15)")
    parser.add_argument("--interval", type=float, default=0.02, help="seconds between requests (default 0.02)")
    parser.add_argument("--epochs", type=int, default=100_000, help="epochs of each training (default 100000)")
    parser.add_argument("--configs", default="on,off", help=f"comma-separated, of {','.join(CONFIGS)} (default on,off)")
    parser.add_argument("--startup-timeout", type=float, default=120.0, help="limit of the start-up (default 120)")
    parser.add_argument("--max-seconds", type=int, default=900, help="hard limit of the whole run (default 900)")
    args = parser.parse_args(argv)
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if not args.configs or any(c not in CONFIGS for c in args.configs):
        parser.error(f"--configs must name some of {', '.join(CONFIGS)}")
    if not (0.5 <= args.duration <= 600 and 0.001 <= args.interval <= 10 and 1 <= args.epochs <= 100_000):
        parser.error("--duration must be 0.5..600, --interval 0.001..10, --epochs 1..100000")
    return args


def sample(conn: Conn, duration: float, interval: float, stop: Callable[[Any], bool] | None = None) -> list[float]:
    """Latencies (s) of ``GET /api/runs`` sent every ``interval`` s (after a late answer at
    the next tick not yet passed: never at once, never two at a time) for ``duration`` s or
    until ``stop(body)``."""
    latencies: list[float] = []
    start = next_at = time.perf_counter()
    while next_at - start < duration:
        time.sleep(max(0.0, next_at - time.perf_counter()))
        t0 = time.perf_counter()
        status, body = conn.request("GET", "/api/runs")
        t1 = time.perf_counter()
        if status != 200:
            raise BenchError(f"GET /api/runs answered {status}: {str(body)[:200]}")
        latencies.append(t1 - t0)
        next_at = next_tick(start, interval, t1)
        if stop is not None and stop(body):
            break
    return latencies


def epochs_done(conn: Conn, run_id: str) -> int:
    status, body = conn.request("GET", f"/api/runs/{run_id}/metrics")
    if status != 200:
        raise BenchError(f"GET /api/runs/{run_id}/metrics answered {status}: {str(body)[:200]}")
    return len(body["series"].get("train_loss", []))


def server_for(config: str, home: Path) -> tuple[Server, str]:
    """Starts the server of ``config``; returns it and the thread cap it was given."""
    caps, switch = CONFIGS[config]
    env: dict[str, str] = {}
    command = None
    if not caps:
        env.update({name: str(os.cpu_count() or 1) for name in THREAD_VARIABLES})
    if not switch:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), environ().get("PYTHONPATH", "")) if p)
        command = [sys.executable, "-c", WRAPPER.format(interval=PYTHON_SWITCH_INTERVAL_S, argv=start_argv())]
    server = start_server(home, cpu_slots=2, timeout=60.0, extra_env=env, command=command)
    return server, env.get("OMP_NUM_THREADS") or environ().get("OMP_NUM_THREADS", "")


def measure(config: str, args: argparse.Namespace, graph: dict[str, Any], home: Path) -> list[dict[str, Any]]:
    server, omp = server_for(config, home)
    conn = Conn(server.port, server.token, timeout=30.0)
    ids: list[str] = []
    try:
        _, info = conn.request("GET", "/api/info")
        interval = info["runtime"]["switch_interval_s"]
        want = PYTHON_SWITCH_INTERVAL_S if not CONFIGS[config][1] else None
        if want is not None and abs(interval - want) > 1e-9:
            raise BenchError(f"config {config}: the server reports switch interval {interval}, not {want}")
        cap = omp or str(info["limits"]["cpus"])
        label = f"{config}: switch interval {interval * 1000:g} ms, thread cap {cap}"
        print(f"[{label}] server pid {server.pid} on 127.0.0.1:{server.port}, started in {server.start_s:.2f} s")
        idle = sample(conn, args.duration, args.interval)
        rows: list[dict[str, Any]] = [{"case": "idle", "config": label, "lat": idle}]
        print(f"  idle       {fmt(rows[-1]['lat'])}")

        body = json.dumps({"graph": graph}).encode()
        for _ in range(2):
            status, reply = conn.request("POST", "/api/runs", body)
            if status != 201:
                raise BenchError(f"POST /api/runs answered {status}: {str(reply)[:300]}")
            ids.append(reply["run_id"])
        t0, startup = time.perf_counter(), []
        while min(epochs_done(conn, run_id) for run_id in ids) < 1:
            if time.perf_counter() - t0 > args.startup_timeout:
                raise BenchError(f"the trainings logged no epoch within {args.startup_timeout} s")
            startup += sample(conn, 0.5, args.interval)  # metrics are read between chunks, untimed
        rows.append({"case": "start-up", "config": label, "lat": startup, "window_s": time.perf_counter() - t0})
        print(f"  start-up   {fmt(startup)}  ({rows[-1]['window_s']:.1f} s to both trainings' first epoch)")

        def load_ended(page: Any) -> bool:
            return sum(1 for r in page["runs"] if r["id"] in ids and r["status"] == "running") < len(ids)


        before = [epochs_done(conn, run_id) for run_id in ids]
        cpu0, steal0, t0 = sum(cpu_seconds(server.pid)), steal_s(), time.perf_counter()
        lat = sample(conn, args.duration, args.interval, stop=load_ended)
        window, cpu = time.perf_counter() - t0, sum(cpu_seconds(server.pid)) - cpu0
        steal = steal_s() - steal0
        done = [epochs_done(conn, run_id) - b for run_id, b in zip(ids, before, strict=True)]
        _, page = conn.request("GET", "/api/runs")
        ended = load_ended(page)
        rows.append({"case": "training", "config": label, "lat": lat, "window_s": window, "epochs": done,
                     "cpu_s": cpu, "steal_s": steal, "ended": ended})
        print(f"  training   {fmt(lat)}")
        print(f"             {window:.1f} s window: epochs {' + '.join(map(str, done))} = {sum(done) / window:.1f}/s;"
              f" server CPU {cpu:.1f} s ({cpu / window * 100:.0f} % of one core); steal {steal:.2f} s"
              + ("; A TRAINING ENDED BEFORE THE WINDOW DID" if ended else ""))
        cancel_all(conn, ids)  # frees both cpu slots for case (b)
        ids.clear()
        rows.append(busy_case(conn, args, label))
        return rows
    finally:
        cancel_all(conn, ids)
        conn.close()
        code = stop_server_proc(server.proc, 30.0)
        print(f"  stopped the server (exit {code})")


def busy_case(conn: Conn, args: argparse.Namespace, label: str) -> dict[str, Any]:
    """Case (b): two runs of core.Busy keep two threads in pure Python (the GIL case)."""
    graph = {"version": 1, "name": "busy", "nodes": [
        {"id": "spin", "type": "core.Busy", "params": {"seconds": args.duration + 30}}]}
    body = json.dumps({"graph": graph}).encode()
    ids = []
    try:
        for _ in range(2):
            status, reply = conn.request("POST", "/api/runs", body)
            if status != 201:
                raise BenchError(f"POST /api/runs answered {status}: {str(reply)[:300]}")
            ids.append(reply["run_id"])
        lat = sample(conn, args.duration, args.interval)
    finally:
        cancel_all(conn, ids)
    print(f"  python     {fmt(lat)}  (two core.Busy nodes)")
    return {"case": "python", "config": label, "lat": lat}


def cancel_all(conn: Conn, ids: list[str]) -> None:
    for run_id in ids:
        conn.request("POST", f"/api/runs/{run_id}/cancel", b"{}")
    deadline = time.monotonic() + 30.0
    for run_id in ids:
        while time.monotonic() < deadline:
            _, row = conn.request("GET", f"/api/runs/{run_id}")
            if row["status"] in TERMINAL:
                break
            time.sleep(0.1)
        else:
            print(f"  run {run_id} did not end within 30 s of its cancel")


def fmt(lat: list[float]) -> str:
    s = summary(lat)
    return f"p50 {s['median']:7.2f} ms  p99 {s['p99']:7.2f} ms  max {s['max']:7.2f} ms  (n={s['n']})"


def print_table(rows: list[dict[str, Any]]) -> None:
    print("Summary (p50/p99: nearest rank; target p99 <= 100 ms, reported, not asserted)")
    w = max(len(row["config"]) for row in rows) + 2
    head = f"{'case':<10}{'n':>6}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}  {'epochs':<14} verdict"
    print(f"  {'configuration':<{w}}{head}")
    for row in rows:
        s = summary(row["lat"])
        epochs = " + ".join(map(str, row["epochs"])) if "epochs" in row else ""
        verdict = "meets" if s["p99"] <= TARGET_P99_MS else "MISSES"
        print(f"  {row['config']:<{w}}{row['case']:<10}{s['n']:>6}{s['median']:>9.2f}{s['p99']:>9.2f}{s['max']:>9.2f}"
              f"  {epochs:<14} {verdict}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    time_limit(args.max_seconds)
    graph = json.loads((REPO / "examples" / "digits_mlp.json").read_text())
    trainer = [n for n in graph["nodes"] if n["id"] == "trainer"]
    if len(trainer) != 1:
        raise BenchError("examples/digits_mlp.json has no node 'trainer'")
    trainer[0]["params"]["epochs"] = args.epochs

    info = machine()
    print(f"troupe responsiveness benchmark  {info['date']}")
    print(f"machine: {info['nproc']} cores ({info['cpu']}), python {info['python']}, linux {info['kernel']}")
    print(info["free"])
    command = (
        f".venv/bin/python bench/responsive.py --duration {args.duration:g} --interval {args.interval:g} "
        f"--epochs {args.epochs} --configs {','.join(args.configs)}"
    )
    print(f"settings: {command.split(' ', 2)[2]}")
    print()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="troupe-responsive-", ignore_cleanup_errors=True) as tmp:
        for config in args.configs:
            home = Path(tmp) / config
            home.mkdir()
            rows += measure(config, args, graph, home)
            print()
    time_limit(0)
    print_table(rows)
    print()
    print(f"reproduce, from the repository root: {command}")
    return 0


if __name__ == "__main__":
    run_main(main)
