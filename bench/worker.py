"""Worker benchmark: what a run on a worker agent costs against the same run in-process.

Against a real ``troupe start`` on 127.0.0.1 and a real ``troupe agent start`` enrolled to
it as ``bench`` (simulated inventory: 2 cpus, no cards), ``examples/hello.json`` is
submitted ``--runs`` times each way, alternating (one worker run, one in-process run):

- worker: ``POST /api/runs`` with ``options.target.worker = "bench"`` (queue ``bench/cpu``);
  the agent executes each run in a fresh spawned interpreter;
- warm: the same on a second agent, ``bench-warm``, started with ``--warm 2``: each run
  takes a child that has torch imported already (only runs that did count; before each,
  the bench waits until the agent reports a ready child);
- in-process: the same graph with no target (queue ``cpu``), run in the server's process.

Then ``examples/digits_mlp.json`` ``--digits`` times each way: submit -> its first epoch's
``train_loss`` (the run pays ``import torch`` unless its child was warm).

One keep-alive connection; the clock starts before the POST and stops when
``GET /api/runs/{id}/stream`` delivers ``run_started``, then ``run_finished``. Median and
p99 (nearest rank) of both, and the worker / in-process ratios; also the POST alone and the
server's event timestamps (``run_started`` -> first ``node_started`` -> ``run_finished``). For scale, the start-up of
a bare interpreter and of one that imports the run child's modules (as is, and with their
bytecode cached).

Run it from the repository root: ``.venv/bin/python bench/worker.py``. Its server, agent and
their files live in a temporary directory (``TROUPE_HOME``, ``XDG_CONFIG_HOME``,
``XDG_STATE_HOME``); it talks only to 127.0.0.1, stops the agent and then the server with
SIGTERM, and is bounded by ``--max-seconds``.
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
import signal
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import _replay
from bench._http import HOST, Conn
from bench._measure import BenchError, environ, fmt_ms, machine, run_main, steal_s, summary, time_limit
from bench._troupe import REPO, Server, start_server, stop_server_proc, ts_seconds
from tests.faultproxy import FaultProxy

WORKER = "bench"
INVENTORY = {"machine_id": "bench-machine", "cpus": 2, "cards": []}
CHILD_IMPORTS = ("import troupe.cli.main, troupe.subprocess_runner.child, troupe.subprocess_runner.context, "
                 "troupe.subprocess_runner.engine")
WARM = "bench-warm"
MODES = ("worker", "warm", "in-process")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=50, help="timed runs of each kind (default 50)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs of each kind first (default 3)")
    parser.add_argument("--floor-samples", type=int, default=10, help="interpreter start-ups timed (default 10)")
    parser.add_argument("--timeout", type=float, default=60.0, help="limit of one run, agent start (default 60)")
    parser.add_argument("--max-seconds", type=int, default=600, help="hard limit of the whole run (default 600)")
    parser.add_argument("--cuts", type=int, default=10, help="link cuts timed, 0 to skip (default 10)")
    parser.add_argument("--cut-seconds", type=float, default=2.0, help="length of each cut (default 2)")
    parser.add_argument("--relay-events", type=int, default=20_000,
                        help="events of the relay-rate run, 0 to skip (default 20000)")
    parser.add_argument("--relay-runs", type=int, default=3, help="relay-rate runs each way (default 3)")
    parser.add_argument("--digits", type=int, default=3, help="digits runs timed to their first epoch, each way")
    args = parser.parse_args(argv)
    if not (1 <= args.runs <= 10_000 and 0 <= args.warmup <= 100 and 1 <= args.floor_samples <= 100):
        parser.error("--runs must be 1..10000, --warmup 0..100, --floor-samples 1..100")
    if not (0 <= args.cuts <= 100 and 0.1 <= args.cut_seconds <= 60 and 0 <= args.relay_events <= 1_000_000
            and 1 <= args.relay_runs <= 20):
        parser.error("--cuts must be 0..100, --cut-seconds 0.1..60, --relay-events 0..1000000, --relay-runs 1..20")
    return args


def start_agent(url: str, token: str, tmp: Path, timeout: float, name: str = WORKER, extra: tuple[str, ...] = ()
                ) -> tuple[subprocess.Popen[bytes], Path, float]:
    """Starts ``troupe agent start`` and waits for its "connected as NAME" line."""
    env = environ()
    env.update(
        XDG_CONFIG_HOME=str(tmp / f"xdg-config-{name}"),
        XDG_STATE_HOME=str(tmp / f"xdg-state-{name}"),
        TROUPE_HOME=str(tmp / f"agent-home-{name}"),
        TROUPE_SIMULATED_INVENTORY=json.dumps(INVENTORY),
    )
    log_path = tmp / f"agent-{name}.log"
    log = log_path.open("wb")
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "troupe.cli.main", "agent", "start", "--url", url, "--token", token, "--name", name,
         "--foreground", *extra],
        cwd=str(REPO), env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )
    log.close()
    deadline = time.monotonic() + timeout
    while f"connected as {name}" not in (text := log_path.read_text(errors="replace")):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_server_proc(proc, 10)
            raise BenchError(f"the agent did not connect within {timeout}s (exit {proc.returncode}):\n{text[-2000:]}")
        time.sleep(0.02)
    return proc, log_path, time.perf_counter() - t0


def enroll_and_attach(conn: Conn, port: int, tmp: Path, timeout: float, name: str = WORKER,
                      via: int | None = None, extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen[bytes], Path]:
    """Enrolls ``name`` and starts its agent, dialing the server's port (or ``via``, a proxy's)."""
    status, reply = conn.request("POST", "/api/workers/enrollments", json.dumps({"name": name}).encode())
    if status != 201:
        raise BenchError(f"POST /api/workers/enrollments answered {status}: {reply}")
    url = f"http://{HOST}:{port}"
    if f"--url {url} " not in reply["command"]:
        raise BenchError(f"the join command is not for {url}: {reply['command']}")
    proc, log_path, start_s = start_agent(f"http://{HOST}:{via or port}", reply["token"], tmp, timeout, name, extra)
    deadline = time.monotonic() + timeout
    try:
        while True:
            _, body = conn.request("GET", "/api/workers")
            states = {w["name"]: w["state"] for w in body["workers"]}
            if states.get(name) == "connected":
                break
            if time.monotonic() > deadline:
                raise BenchError(f"GET /api/workers does not show {name} connected: {states}")
            time.sleep(0.05)
    except BaseException:  # the caller never gets the agent to stop: it stops here
        stop_server_proc(proc, 30)
        raise
    print(f"agent pid {proc.pid} connected as {name} {start_s:.2f} s after its start; /api/workers: connected")
    return proc, log_path


def one_run(conn: Conn, body: bytes, queue_key: str) -> dict[str, Any]:
    """Submits one run and follows its stream; client times (s) from before the POST."""
    t0 = time.perf_counter()
    status, reply = conn.request("POST", "/api/runs", body)
    t_submit = time.perf_counter()
    if status != 201:
        raise BenchError(f"POST /api/runs answered {status}: {reply}")
    if reply.get("queue_key") != queue_key:
        raise BenchError(f"run {reply['run_id']} is on queue {reply.get('queue_key')!r}, not {queue_key!r}")
    seen: dict[str, tuple[float, dict[str, Any]]] = {}
    for kind, data in conn.stream(f"/api/runs/{reply['run_id']}/stream"):
        if kind == "run_event":
            seen.setdefault(data["type"], (time.perf_counter(), data))
            if data["type"] == "run_finished":
                break
    if "run_started" not in seen or "run_finished" not in seen:
        raise BenchError(f"run {reply['run_id']}: the stream ended with {sorted(seen)}")
    (t_started, started), (t_finished, finished) = seen["run_started"], seen["run_finished"]
    row = {
        "submit": t_submit - t0,
        "started": t_started - t0,
        "finished": t_finished - t0,
        "ok": finished["payload"].get("status") == "succeeded",
        "srv_run": ts_seconds(finished["ts"]) - ts_seconds(started["ts"]),
        "run_id": reply["run_id"],
    }
    if "node_started" in seen:
        row["srv_first_node"] = ts_seconds(seen["node_started"][1]["ts"]) - ts_seconds(started["ts"])
    if "run_queued" in seen:
        row["srv_queue"] = ts_seconds(started["ts"]) - ts_seconds(seen["run_queued"][1]["ts"])
    return row


def wait_for_warm_child(conn: Conn, timeout: float, name: str = WARM) -> None:
    """Until the warm agent's last heartbeat reports a ready child (untimed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, body = conn.request("GET", "/api/workers")
        pool = next((w.get("warm_pool") for w in body["workers"] if w["name"] == name), None) or {}
        if pool.get("ready", 0) >= 1:
            return
        time.sleep(0.05)
    raise BenchError(f"{name} reported no ready warm child within {timeout}s")


def started_warm(conn: Conn, run_id: str) -> bool:
    _, row = conn.request("GET", f"/api/runs/{run_id}")
    return bool((row.get("execution_facts") or {}).get("started_warm"))


def first_epoch(conn: Conn, body: bytes, side: Conn) -> tuple[float, str]:
    """Submit -> the first ``train_loss`` metric event, client time; and the run id. The
    run is then cancelled (through ``side``: ``conn`` is busy with the stream) and
    followed to its end."""
    t0, elapsed = time.perf_counter(), 0.0
    status, reply = conn.request("POST", "/api/runs", body)
    if status != 201:
        raise BenchError(f"POST /api/runs answered {status}: {reply}")
    for kind, data in conn.stream(f"/api/runs/{reply['run_id']}/stream"):
        if kind == "run_event" and data["type"] == "metric" and data["payload"].get("name") == "train_loss":
            elapsed = elapsed or time.perf_counter() - t0
            side.request("POST", f"/api/runs/{reply['run_id']}/cancel")
        if kind == "run_event" and data["type"] == "run_finished":
            break
    if not elapsed:
        raise BenchError(f"digits run {reply['run_id']} ended before its first epoch")
    return elapsed, str(reply["run_id"])


def interpreter_floor(samples: int, pycache: Path) -> dict[str, list[float]]:
    """Wall time of ``python -c pass``, of a python importing the run child's modules in
    this environment, and of the same with their bytecode cached (``PYTHONPYCACHEPREFIX``
    in the temporary directory, written by one untimed start first)."""
    cached = {k: v for k, v in environ().items() if k != "PYTHONDONTWRITEBYTECODE"}
    cached["PYTHONPYCACHEPREFIX"] = str(pycache)
    cases = (("bare", "pass", None), ("imports", CHILD_IMPORTS, None), ("cached", CHILD_IMPORTS, cached))
    subprocess.run([sys.executable, "-c", CHILD_IMPORTS], cwd=str(REPO), env=cached, check=True, timeout=60)
    times: dict[str, list[float]] = {key: [] for key, _, _ in cases}
    for _ in range(samples):
        for key, code, env in cases:
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], cwd=str(REPO), env=env, check=True, timeout=60)
            times[key].append(time.perf_counter() - t0)
    return times


@dataclass
class _Figures:
    """What the bench gathers against its server, for the report after."""

    rows: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {mode: [] for mode in MODES})
    epochs: dict[str, list[float]] = field(default_factory=lambda: {mode: [] for mode in MODES})
    relay: dict[str, list[dict[str, float]]] = field(
        default_factory=lambda: {mode: [] for mode in ("worker", "in-process")})
    resumed: list[float] = field(default_factory=list)
    cold_in_warm: int = 0
    floor: dict[str, list[float]] = field(default_factory=dict)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    time_limit(args.max_seconds)
    graph = json.loads((REPO / "examples" / "hello.json").read_text())
    digits = json.loads((REPO / "examples" / "digits_mlp.json").read_text())
    bodies, digits_bodies = _bodies_of(graph), _bodies_of(digits)
    figures = _Figures()
    info = machine()
    command = (f".venv/bin/python bench/worker.py --runs {args.runs} --warmup {args.warmup} --cuts {args.cuts} "
               f"--cut-seconds {args.cut_seconds:g} --relay-events {args.relay_events} --relay-runs {args.relay_runs} "
               f"--digits {args.digits}"
               + (f" --floor-samples {args.floor_samples}" if args.floor_samples != 10 else ""))
    print(f"troupe worker benchmark  {info['date']}")
    print(f"machine: {info['nproc']} cores ({info['cpu']}), python {info['python']}, linux {info['kernel']}")
    print(info["free"])
    print(f"settings: --runs {args.runs} --warmup {args.warmup} (alternating worker / warm / in-process runs)")
    print()
    with tempfile.TemporaryDirectory(prefix="troupe-worker-", ignore_cleanup_errors=True) as name:
        tmp = Path(name)
        home = tmp / "home"
        home.mkdir()
        server = start_server(home, cpu_slots=2, timeout=60.0, extra_env={"TROUPE_WORKER_HEARTBEAT_S": "1"})
        print(f"server pid {server.pid} on {HOST}:{server.port}, started in {server.start_s:.2f} s")
        _against_agents(args, server, tmp, bodies, digits_bodies, figures)
        figures.floor = interpreter_floor(args.floor_samples, tmp / "pycache")
    time_limit(0)

    print()
    _print_modes(figures)
    return _print_summary(args, figures, command)


def _bodies_of(doc: dict[str, Any]) -> dict[str, tuple[bytes, str]]:
    return {
        "worker": (json.dumps({"graph": doc, "options": {"target": {"worker": WORKER}}}).encode(), f"{WORKER}/cpu"),
        "warm": (json.dumps({"graph": doc, "options": {"target": {"worker": WARM}}}).encode(), f"{WARM}/cpu"),
        "in-process": (json.dumps({"graph": doc}).encode(), "cpu"),
    }


def _against_agents(args: argparse.Namespace, server: Server, tmp: Path, bodies: dict[str, tuple[bytes, str]],
                    digits_bodies: dict[str, tuple[bytes, str]], figures: _Figures) -> None:
    """Starts the two agents, times everything that needs them, and stops them and the
    server whatever happened."""
    conn = Conn(server.port, server.token, args.timeout)
    side = Conn(server.port, server.token, args.timeout)
    agent: subprocess.Popen[bytes] | None = None
    warm_agent: subprocess.Popen[bytes] | None = None
    try:
        agent, agent_log = enroll_and_attach(conn, server.port, tmp, args.timeout)
        warm_agent, _ = enroll_and_attach(conn, server.port, tmp, args.timeout, WARM, extra=("--warm", "2"))
        _time_runs(args, conn, side, bodies, digits_bodies, figures)
        if args.cuts:
            figures.resumed = _time_cuts(args, conn, server, tmp)
    finally:
        conn.close()
        side.close()
        if warm_agent is not None:
            stop_server_proc(warm_agent, 30.0)
        if agent is not None:
            code = stop_server_proc(agent, 30.0)
            print(f"stopped the agent with SIGTERM (exit {code})")
        print(f"stopped the server (exit {stop_server_proc(server.proc, 30.0)})")
    if agent is not None and agent.returncode not in (0, -signal.SIGTERM):
        print(agent_log.read_text(errors="replace")[-2000:])


def _time_runs(args: argparse.Namespace, conn: Conn, side: Conn, bodies: dict[str, tuple[bytes, str]],
               digits_bodies: dict[str, tuple[bytes, str]], figures: _Figures) -> None:
    """The hello runs, alternating worker / warm / in-process, then the digits runs to
    their first epoch and the relay-rate runs."""
    steal0, t0 = steal_s(), time.perf_counter()
    for i in range(args.warmup + args.runs):
        for mode in MODES:
            if mode == "warm":
                wait_for_warm_child(conn, args.timeout)
            row = one_run(conn, *bodies[mode])
            if mode == "warm" and not started_warm(conn, row["run_id"]):
                figures.cold_in_warm += 1  # the pool was empty after all: not a warm figure
                continue
            if i >= args.warmup:
                figures.rows[mode].append(row)
    for _ in range(args.digits):
        for mode in MODES:
            if mode == "warm":
                wait_for_warm_child(conn, args.timeout)
            elapsed, run_id = first_epoch(conn, digits_bodies[mode][0], side)
            if mode != "warm" or started_warm(conn, run_id):
                figures.epochs[mode].append(elapsed)
    print(f"{len(MODES) * (args.warmup + args.runs + args.digits)} runs in {time.perf_counter() - t0:.1f} s, "
          f"CPU steal {steal_s() - steal0:.2f} s")
    for _ in range(args.relay_runs if args.relay_events else 0):
        for mode in ("worker", "in-process"):
            figures.relay[mode].append(_replay.relay_rate(conn, args.relay_events,
                                                          WORKER if mode == "worker" else None, args.timeout))


def _time_cuts(args: argparse.Namespace, conn: Conn, server: Server, tmp: Path) -> list[float]:
    """A third agent, dialing through a proxy that cuts its link: cut end -> first
    replayed event at a subscriber, for each cut."""
    proxy = FaultProxy(server.port).start()
    cut_agent, _ = enroll_and_attach(conn, server.port, tmp, args.timeout, "cut", via=proxy.port)
    try:
        return _replay.resume_after_cuts(server.port, server.token, proxy, "cut", args.cuts,
                                         args.cut_seconds, args.timeout)
    finally:
        stop_server_proc(cut_agent, 30.0)
        proxy.close()


def _print_modes(figures: _Figures) -> None:
    for mode in MODES:
        print(f"[{mode}]")
        for key, label in (("submit", "POST -> 201"), ("started", "POST -> run_started"),
                           ("finished", "POST -> run_finished"), ("srv_queue", "server run_queued -> run_started"),
                           ("srv_first_node", "server run_started -> 1st node_started"),
                           ("srv_run", "server run_started -> run_finished")):
            values = [r[key] for r in figures.rows[mode] if key in r]
            if values:
                print(f"  {label:<38} {fmt_ms(summary(values))}")
    floor = figures.floor
    print("[interpreter start-up, for scale]")
    print(f"  {'python -c pass':<38} {fmt_ms(summary(floor['bare']))}")
    print(f"  {'python -c ' + repr(CHILD_IMPORTS)[:22] + '...':<38} {fmt_ms(summary(floor['imports']))}")
    print(f"  {'  the same, bytecode cached':<38} {fmt_ms(summary(floor['cached']))}")
    dont_write = environ().get("PYTHONDONTWRITEBYTECODE", "")
    print(f"  (the imports: {CHILD_IMPORTS}; PYTHONDONTWRITEBYTECODE={dont_write!r})")
    print()


def _print_summary(args: argparse.Namespace, figures: _Figures, command: str) -> int:
    """The summary table; 1 when a run did not succeed."""
    rows, epochs, relay = figures.rows, figures.epochs, figures.relay
    print("Summary (ms; p99 nearest rank; ratio = worker / in-process)")
    print(f"  {'figure':<30}{'worker':>10}{'warm':>10}{'in-process':>12}{'ratio':>8}{'warm ratio':>12}")
    for key, label in (("started", "submit -> run_started"), ("finished", "submit -> run_finished")):
        for stat in ("median", "p99"):
            w, p = (summary([r[key] for r in rows[mode]])[stat] for mode in ("worker", "in-process"))
            if rows["warm"]:
                h = summary([r[key] for r in rows["warm"]])[stat]
                warm, warm_ratio = f"{h:10.2f}", f"{h / p:12.2f}"
            else:  # no warm run found a child ready (each is left out then)
                warm, warm_ratio = f"{'-':>10}", f"{'-':>12}"
            print(f"  {label + ' ' + stat:<30}{w:10.2f}{warm}{p:12.2f}{w / p:8.2f}{warm_ratio}")
    if all(epochs.values()):
        w, h, p = (summary(epochs[mode])["median"] for mode in MODES)
        print(f"  {'digits: submit -> epoch 1':<30}{w:10.2f}{h:10.2f}{p:12.2f}{w / p:8.2f}{h / p:12.2f}"
              f"   (median of {args.digits})")
    print(f"  warm runs that found the pool empty (left out): {figures.cold_in_warm}")
    if relay["worker"]:
        for label, key in (("events/s relayed, median", "rate"), ("  the same from run_started", "rate_from_start")):
            w, p = (statistics.median(r[key] for r in relay[mode]) for mode in ("worker", "in-process"))
            print(f"  {label:<30}{w:10.0f}{p:12.0f}{w / p:8.2f}"
                  + (f"   ({args.relay_events} events a run, {args.relay_runs} runs each way, all persisted; "
                     "node_started -> run_finished)" if key == "rate" else "   (includes the child's start)"))
        print(f"  the bench's stream of a relay run ended for lagging (the run went on): "
              f"worker {sum(int(r['lagged']) for r in relay['worker'])}, "
              f"in-process {sum(int(r['lagged']) for r in relay['in-process'])}")
    if figures.resumed:
        print(f"  cut end -> first replayed event at a subscriber: {fmt_ms(summary(figures.resumed))}"
              f"   ({args.cuts} cuts of {args.cut_seconds:g} s; the agent retries after 0.25, 0.5, then every 1 s)")
    failures = {mode: sum(not r["ok"] for r in rows[mode]) for mode in MODES}
    print(f"  runs not succeeded: worker {failures['worker']}, warm {failures['warm']}, "
          f"in-process {failures['in-process']}")
    print()
    print(f"reproduce, from the repository root: {command}")
    return 1 if any(failures.values()) else 0


if __name__ == "__main__":
    run_main(main)
