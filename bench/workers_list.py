"""``GET /api/workers`` with a lab's agents connected and nothing running: what the
Workers panel's poll costs.

For each count in ``--agents`` (default 200,800): a fresh ``troupe start``, that many
simulated agents (``bench/_scale_agents.py``: real websockets, real hellos, heartbeats at
``--heartbeat-s``) pinned to the last core (``sched_setaffinity``) when there is more than one,
then ``GET /api/workers`` read every ``--every`` seconds (a fixed clock, never back to
back) for ``--seconds``. It prints the median and p99 from the request to the body's last
byte (the client's own JSON parsing is not the server's time), the reply's size, and the
server's CPU over the sampling, with the command that reproduces them.

    .venv/bin/python bench/workers_list.py --agents 200,800
"""

# ruff: noqa: E402
from __future__ import annotations

import os
import sys

# As in queue.py: the helpers beside this file are imported as the package ``bench`` from
# the repository root, and this file's folder is left off sys.path (its queue.py would
# shadow the standard library's).
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [os.path.dirname(_HERE), *(p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE)]

import argparse
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._http import Conn
from bench._measure import BenchError, cpu_seconds, fmt_ms, machine, run_main, steal_s, summary
from bench._scale_fleet import Fleet, enroll_all, fleet_specs, serve, write_plan
from bench._troupe import stop_server_proc


def _pin_last_core(pid: int) -> str:
    """The agents on the last core, the server free to use the rest: p99 then measures
    the server, not the generator fighting it for a core."""
    cores = os.cpu_count() or 1
    if cores < 2:
        return "not pinned"
    os.sched_setaffinity(pid, {cores - 1})
    return f"agents pinned to core {cores - 1}"


def _one(agents: int, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    home = root / f"home-{agents}"
    home.mkdir()
    server = serve(home, 0, 2, args.heartbeat_s)
    fleet = None
    try:
        conn = Conn(server.port, server.token, 60.0)
        specs = fleet_specs(agents, args.seed)
        enroll_all(conn, specs)
        plan = root / f"plan-{agents}.json"
        write_plan(plan, server, conn, specs)
        fleet = Fleet(plan, root / f"agents-{agents}.log")
        pinned = _pin_last_core(fleet.proc.pid)
        fleet.wait_enrolled(300)
        fleet.wait_connected(agents, 300)
        time.sleep(args.heartbeat_s * 2)  # every agent past its first heartbeat
        latencies: list[float] = []
        cpu0, steal0, start = sum(cpu_seconds(server.pid)), steal_s(), time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            t0 = time.perf_counter()
            status, data = conn.raw("GET", "/api/workers")
            latencies.append(time.perf_counter() - t0)  # to the last byte; the parse below is the client's
            body = json.loads(data)
            size = len(data)
            if status != 200 or len(body["workers"]) != agents:
                raise BenchError(f"GET /api/workers answered {status} with "
                                 f"{len(body.get('workers', [])) if isinstance(body, dict) else body!r} workers")
            ticks = (time.perf_counter() - start) / args.every
            time.sleep((math.floor(ticks) + 1 - ticks) * args.every)
        elapsed = time.perf_counter() - start
        cpu = sum(cpu_seconds(server.pid)) - cpu0
        return {"agents": agents, "latency": summary(latencies), "server_cpu_pct": 100 * cpu / elapsed, "bytes": size,
                "steal_s": steal_s() - steal0, "pinned": pinned}
    finally:
        if fleet is not None:
            fleet.close()
        stop_server_proc(server.proc, 30.0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--agents", default="200,800", help="comma-separated agent counts (default 200,800)")
    p.add_argument("--every", type=float, default=0.25, help="seconds between reads (default 0.25)")
    p.add_argument("--seconds", type=float, default=20.0, help="seconds of sampling per count (default 20)")
    p.add_argument("--heartbeat-s", type=float, default=1.0, help="the agents' heartbeat (default 1)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="troupe-bench-workers-") as tmp:
        results = [_one(int(n), args, Path(tmp)) for n in args.agents.split(",")]
    command = (f".venv/bin/python bench/workers_list.py --agents {args.agents} --every {args.every:g} "
               f"--seconds {args.seconds:g} --heartbeat-s {args.heartbeat_s:g} --seed {args.seed}")
    if args.json:
        print(json.dumps({"machine": machine(), "results": results, "command": command + " --json"}))
        return 0
    print(f"machine: {machine()}")
    for r in results:
        print(f"{r['agents']:>4} agents: GET /api/workers {fmt_ms(r['latency'])}; {r['bytes'] / 1e3:.0f} kB; "
              f"server CPU {r['server_cpu_pct']:.0f}% of a core; steal {r['steal_s']:.1f} s; {r['pinned']}")
    print(f"reproduce: {command}")
    return 0


if __name__ == "__main__":
    run_main(main)
