"""Warm scripts: a torch script as a ``script.Command`` on a worker started with
``--warm 1``, with ``warm: true`` (forked from the agent's zygote, torch imported) and
``warm: false`` (a fresh interpreter), on the same agent.

The script imports torch, trains a small model (16 -> 32 -> 1, 256 random points,
batches of 32) for 3 epochs and prints a JSON metric line per epoch. Two figures:

- **first metric**: ``--runs`` runs of each kind, one at a time (after two not counted),
  alternating warm and cold, each followed on its stream: from ``run_started`` (the run
  is assigned to the worker) to its first ``metric`` event, client time; also from the
  submission. Median and p90.
- **sweep**: a grid sweep of ``--sweep`` variants (``vars.lr``) of the same script,
  warm then cold: from the sweep's submission until every variant ended (polled every
  50 ms), and the ratio.

    .venv/bin/python bench/warm_script.py --runs 20 --sweep 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._http import Conn
from bench._measure import BenchError, machine, percentile
from bench._troupe import start_server, stop_server_proc
from bench.worker import WORKER, enroll_and_attach, started_warm, wait_for_warm_child

SCRIPT = '''import json, sys
import torch

lr = float(sys.argv[1])
torch.manual_seed(0)
x = torch.randn(256, 16)
y = (x.sum(1, keepdim=True) > 0).float()
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=lr)
loss_fn = torch.nn.BCEWithLogitsLoss()
for epoch in range(1, 4):
    for i in range(0, 256, 32):
        optimizer.zero_grad()
        loss = loss_fn(model(x[i:i + 32]), y[i:i + 32])
        loss.backward()
        optimizer.step()
    print(json.dumps({"metric": "train_loss", "value": loss.item(), "step": epoch}))
'''


def _graph(warm: bool) -> dict[str, Any]:
    return {"version": 1, "name": f"torch-{'warm' if warm else 'cold'}", "settings": {"device": "cpu"}, "edges": [],
            "nodes": [{"id": "train", "type": "script.Command",
                       "params": {"argv": ["{python}", "train.py", "{lr}"], "vars": {"lr": 0.01},
                                  "cwd": "data:.", "warm": warm}}]}


def _first_metric(conn: Conn, warm: bool) -> dict[str, Any]:
    """One run followed on its stream: client times (s) of its start and first metric."""
    t0 = time.perf_counter()
    status, reply = conn.request("POST", "/api/runs", json.dumps(
        {"graph": _graph(warm), "options": {"target": {"worker": WORKER}}}).encode())
    if status != 201:
        raise BenchError(f"POST /api/runs answered {status}: {reply}")
    seen: dict[str, float] = {}
    fallback = False
    for kind, data in conn.stream(f"/api/runs/{reply['run_id']}/stream"):
        if kind != "run_event":
            continue
        seen.setdefault(data["type"], time.perf_counter())
        fallback = fallback or data["payload"].get("code") == "warm_fallback"
        if data["type"] == "run_finished":
            if data["payload"].get("status") != "succeeded":
                raise BenchError(f"run {reply['run_id']} ended {data['payload']}")
            break
    if "metric" not in seen or "run_started" not in seen:
        raise BenchError(f"run {reply['run_id']}: no start or metric in {sorted(seen)}")
    return {"assigned": seen["metric"] - seen["run_started"], "submitted": seen["metric"] - t0,
            "finished": seen["run_finished"] - t0, "fallback": fallback, "run_id": reply["run_id"]}


def _sweep(conn: Conn, warm: bool, count: int, timeout: float) -> float:
    """Submission of a sweep of ``count`` variants to the end of its last, seconds."""
    values = [round(0.001 * (i + 1), 4) for i in range(count)]
    body = {"base_graph": _graph(warm), "name": f"sweep-{'warm' if warm else 'cold'}",
            "sweep_spec": {"method": "grid", "params": [{"node_id": "train", "param": "vars.lr", "values": values}]},
            "objective": {"metric": "train_loss", "direction": "minimize"},
            "options": {"target": {"worker": WORKER}}}
    t0 = time.perf_counter()
    status, reply = conn.request("POST", "/api/sweeps", json.dumps(body).encode())
    if status != 201:
        raise BenchError(f"POST /api/sweeps answered {status}: {reply}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, page = conn.request("GET", f"/api/runs?sweep_id={reply['sweep_id']}&limit=100")
        rows = page["runs"]
        if len(rows) == count and all(r["status"] not in ("queued", "running") for r in rows):
            elapsed = time.perf_counter() - t0
            failed = [r["id"] for r in rows if r["status"] != "succeeded"]
            if failed:
                raise BenchError(f"sweep variants did not succeed: {failed}")
            return elapsed
        time.sleep(0.05)
    raise BenchError(f"the {'warm' if warm else 'cold'} sweep did not end within {timeout} s")


def _line(name: str, values: list[float]) -> str:
    return (f"  {name:<38} median {1000 * statistics.median(values):7.0f} ms  "
            f"p90 {1000 * percentile(values, 90):7.0f} ms  (n={len(values)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs of each kind timed to the first metric")
    parser.add_argument("--sweep", type=int, default=20, help="variants of each sweep (0: no sweep)")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    if not 1 <= args.runs <= 200 or not 0 <= args.sweep <= 100:
        parser.error("--runs is 1..200, --sweep 0..100")
    rows: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    load = [os.getloadavg()[0]]  # the machine's load, said with the figures (a shared machine's matter)
    sweeps: dict[bool, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "lab"
        folder.mkdir()
        (folder / "train.py").write_text(SCRIPT)
        (Path(tmp) / "home").mkdir()
        server = start_server(Path(tmp) / "home", 2, 60, {"TROUPE_MOUNT_PATH": str(folder)})
        agent = None
        try:
            conn = Conn(server.port, server.token, args.timeout)
            agent, _ = enroll_and_attach(conn, server.port, Path(tmp), 60,
                                         extra=("--warm", "1", "--mount", f"data={folder}"))
            wait_for_warm_child(conn, 60, WORKER)  # until then every run starts in a fresh interpreter
            for i in range(args.runs + 2):
                for warm in (True, False):
                    row = _first_metric(conn, warm)
                    if i >= 2:
                        row["started_warm"] = started_warm(conn, row["run_id"])
                        rows[warm].append(row)
            if args.sweep:
                for warm in (True, False):
                    sweeps[warm] = _sweep(conn, warm, args.sweep, args.timeout)
        finally:
            if agent is not None:
                stop_server_proc(agent, 30)
            stop_server_proc(server.proc, 30)
    load.append(os.getloadavg()[0])
    info = machine()
    print(f"machine: {info['cpu']}, {info['nproc']} cores, kernel {info['kernel']}; python {info['python']}; "
          f"{info['date']}; load average {load[0]:.1f} at the start, {load[1]:.1f} at the end")
    print(f"a torch script (3 epochs), {args.runs} runs each on a --warm 1 worker, one at a time:")
    for warm in (True, False):
        name = "warm: true" if warm else "warm: false"
        forked = sum(r["started_warm"] for r in rows[warm])
        fallbacks = sum(r["fallback"] for r in rows[warm])
        print(_line(f"{name}, assigned -> first metric", [r["assigned"] for r in rows[warm]])
              + f"  run child forked {forked}/{len(rows[warm])}, fallbacks {fallbacks}")
        print(_line(f"{name}, submitted -> first metric", [r["submitted"] for r in rows[warm]]))
        print(_line(f"{name}, submitted -> run_finished", [r["finished"] for r in rows[warm]]))
    if sweeps:
        print(f"a sweep of {args.sweep} variants of it, submission to the last variant's end:")
        print(f"  warm: true  {sweeps[True]:7.1f} s\n  warm: false {sweeps[False]:7.1f} s"
              f"\n  cold / warm {sweeps[False] / sweeps[True]:.2f}")
    print(f"reproduce: .venv/bin/python bench/warm_script.py --runs {args.runs} --sweep {args.sweep}")


if __name__ == "__main__":
    main()
