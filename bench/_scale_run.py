"""One scale of ``bench/scale.py``, start to end: a server, the simulated agents, the load
phase, its check, the restart phase and its check. Prints as it goes and returns the
figures for the summary; processes are stopped whatever happens."""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path
from typing import Any

from bench._http import HOST, Conn
from bench._measure import BenchError, OutOfTime, cpu_seconds, rss_mb, steal_s, summary
from bench._scale_fleet import Fleet, enroll_all, fleet_specs, serve, write_plan
from bench._scale_load import (
    CLIENT_ERRORS,
    ENDPOINTS,
    Load,
    ProcWatch,
    Sampler,
    log_digest,
    plan_bodies,
    submit_all,
    wait_terminal,
    worker_events,
    worker_graph,
)
from bench._scale_restart import (
    Adoption,
    adopt_bodies,
    check_all,
    kill_and_adopt,
    run_counts,
    wait_quiet,
    wait_running,
)
from bench._troupe import TERMINAL, GlobalWatcher, Server, stop_server_proc


def _ms(values_s: list[float]) -> dict[str, float] | None:
    return summary(values_s) if values_s else None


def _hb_percentiles(rtts_ms: list[float]) -> dict[str, float] | None:
    return summary([v / 1000.0 for v in rtts_ms]) if rtts_ms else None


def load_phase(args: argparse.Namespace, server: Server, fleet: Fleet, specs: list[dict[str, Any]],
               n_runs: int, rate: float, fig: dict[str, Any]) -> None:
    bodies = plan_bodies(specs, n_runs, args.local_fraction, args.run_seconds, args.seed)
    watcher = GlobalWatcher(server.port, server.token)
    watcher.start()
    if not watcher.ready.wait(30) or watcher.broken:
        raise BenchError(f"could not follow /api/stream: {watcher.broken}")
    load = Load()
    samplers = [Sampler(server, ENDPOINTS[:-1], args.sample_interval, load, 60.0),
                Sampler(server, ENDPOINTS[-1:], args.sample_interval, load, 60.0)]
    proc_watch = ProcWatch(server.pid, load)
    before, cpu0, fleet0, steal0 = fleet.stats(), cpu_seconds(server.pid), cpu_seconds(fleet.proc.pid), steal_s()
    # This process's own garbage collections (the Workers list's 800 rows parsed twice a
    # second, the stream's every change) held its samplers' clocks for 30-60 ms over a
    # hundred times a minute, which the list's p99 then blamed on the server. It collects
    # nothing while it measures: what it parses has no reference cycles.
    gc.collect()
    gc.disable()
    t0 = time.monotonic()
    for sampler in samplers:
        sampler.start()
    proc_watch.start()
    try:
        submit_all(server, bodies, args.threads, rate, load, 30.0)
        submitted_s = time.monotonic() - t0
        ids = set(load.ids["local"] + load.ids["worker"])
        terminal = wait_terminal(watcher, ids, args.timeout)
    finally:
        for sampler in samplers:
            sampler.stopping.set()
        proc_watch.stopping.set()
        watcher.stop()
        gc.enable()
    wall = (max(t for _, t in terminal.values()) - load.first_submit) if terminal else time.monotonic() - t0
    after, cpu1, fleet1 = fleet.stats(), cpu_seconds(server.pid), cpu_seconds(fleet.proc.pid)
    for sampler in samplers:
        sampler.join(65)
    proc_watch.join(5)
    counts0, counts1 = before["counts"], after["counts"]
    delta = {k: counts1.get(k, 0) - counts0.get(k, 0) for k in counts1}
    fig.update(
        runs=n_runs, submitted=len(ids), local=len(load.ids["local"]), worker=len(load.ids["worker"]),
        rate=rate, wall_s=wall, submitted_s=submitted_s, runs_per_s=len(ids) / wall if wall else 0.0,
        submit=_ms(load.submit_s), submit_errors=load.submit_errors,
        latency={name: _ms(load.latency_s[name]) for name in ENDPOINTS}, sample_errors=load.sample_errors,
        heartbeats_per_s=delta.get("heartbeats_acked", 0) / wall if wall else 0.0,
        heartbeats_sent=delta.get("heartbeats_sent", 0), heartbeats_acked=delta.get("heartbeats_acked", 0),
        hb_rtt=_hb_percentiles(after["hb_rtt_ms"]), load_agent_counts=delta,
        disconnects=delta.get("disconnects", 0), disconnects_seen=counts1.get("disconnects", 0),
        server_user_s=cpu1[0] - cpu0[0], server_sys_s=cpu1[1] - cpu0[1],
        agents_cpu_s=sum(cpu1_ - cpu0_ for cpu0_, cpu1_ in zip(fleet0, fleet1, strict=True)),
        rss_max=max(load.rss_mb, default=rss_mb(server.pid)[0]), rss_end=rss_mb(server.pid)[0],
        fds_max=max(load.fds, default=0), steal_s=steal_s() - steal0, load_ids=load.ids,
    )
    lat = fig["latency"]
    print(f"  load: {len(ids)} runs ({fig['local']} local, {fig['worker']} on workers) in {wall:.1f} s "
          f"= {fig['runs_per_s']:.1f} runs/s (submitting took {submitted_s:.1f} s at <= {rate:g}/s)")
    for name in ENDPOINTS:
        s = lat[name]
        if s:
            print(f"    GET /api/{name:<32} p50 {s['median']:7.2f}  p99 {s['p99']:7.2f}  max {s['max']:7.2f} ms"
                  f"  (n={s['n']})")
    print(f"    heartbeats handled {fig['heartbeats_per_s']:.1f}/s ({fig['heartbeats_acked']} acked of "
          f"{fig['heartbeats_sent']} sent); server CPU {fig['server_user_s']:.1f} user + {fig['server_sys_s']:.1f} "
          f"sys s; RSS max {fig['rss_max']:.1f} MB, {fig['rss_end']:.1f} at the end; fds max {fig['fds_max']}; "
          f"steal {fig['steal_s']:.1f} s")
    if load.submit_errors or load.sample_errors:
        print(f"    errors: submit {load.submit_errors[:3]} sample {load.sample_errors[:3]}")


def restart_phase(args: argparse.Namespace, server: Server, fleet: Fleet, specs: list[dict[str, Any]],
                  home: Path, fig: dict[str, Any]) -> Server:
    # More runs take longer to submit and to start: the runs last longer at a larger scale.
    bodies, ticks = adopt_bodies(specs, args.adopt_per_agent, args.adopt_seconds * fig["scale"])
    conn = Conn(server.port, server.token, 30.0)
    try:
        terminal_before = sum(n for state, n in run_counts(conn).items() if state in TERMINAL)
        submitted = Load()
        t0 = time.monotonic()
        submit_all(server, bodies, args.threads, 1e6, submitted, 60.0)
        if submitted.submit_errors:
            raise BenchError(f"submitting the long runs: {submitted.submit_errors[:3]}")
        ids = {run_id: worker for worker, run_ids in submitted.ids.items() for run_id in run_ids}
        wait_running(conn, len(ids), terminal_before, args.timeout)
        print(f"  restart: {len(ids)} long runs ({ticks} points each) submitted and all running after "
              f"{time.monotonic() - t0:.1f} s")
    finally:
        conn.close()
    fig["log_before_kill"] = log_digest(server.log_path)
    fig["disconnects"] += fleet.stats()["counts"].get("disconnects", 0) - fig["disconnects_seen"]
    time.sleep(2 * 0.5)  # every run has sent points that the next server must not lose
    result = Adoption(runs=len(ids), ticks=ticks)
    fig["adoption"] = result
    again = kill_and_adopt(server, fleet, ids, result, home, args.cpu_slots, args.heartbeat_s, args.timeout)
    print(f"  restart: SIGKILL with {len(ids)} runs executing on {len(specs)} agents; serving again after "
          f"{result.kill_to_serving_s:.2f} s (start-up {result.start_s:.2f} s); all agents welcomed "
          f"{_s(result.all_welcomed_s)}, all runs adopted {_s(result.all_adopted_s)}, replays acked "
          f"{_s(result.replays_acked_s)} after the kill ({result.frames_replayed} frames replayed in all)")
    for error in result.errors[:3]:
        print(f"    {error}")
    conn = Conn(again.port, again.token, 30.0)
    try:
        wait_quiet(conn, args.adopt_seconds + args.timeout)
    finally:
        conn.close()
    fig["adopt_check"] = check_all(again, list(ids), 0, ticks=ticks)
    print(f"  restart check: {_check_line(fig['adopt_check'])}")
    return again


def _s(value: float | None) -> str:
    return "NEVER" if value is None else f"{value:.2f} s"


def _check_line(check: Any) -> str:
    text = (f"{check.statuses}; listed {check.listed}/{check.n}; events right {check.events_ok}/{check.n}"
            f"{'' if not check.problems else '; ' + '; '.join(check.problems[:3])}")
    return ("ok: " if check.ok else "FAILED: ") + text


def run_scale(args: argparse.Namespace, scale: int, tmp: Path) -> dict[str, Any]:
    """Figures of one scale; ``error`` says where it stopped when it could not finish."""
    n_agents, n_runs, rate = args.agents * scale, args.runs * scale, args.rate * scale
    fig: dict[str, Any] = {"scale": scale, "agents": n_agents, "phase": "start"}
    print(f"x{scale}: {n_agents} agents, {n_runs} runs at <= {rate:g}/s")
    home = tmp / f"x{scale}"
    home.mkdir()
    server = serve(home, 0, args.cpu_slots, args.heartbeat_s)
    fig["idle_rss"] = rss_mb(server.pid)[0]
    fleet: Fleet | None = None
    try:
        conn = Conn(server.port, server.token, 30.0)
        specs = fleet_specs(n_agents, args.seed)
        fig["cards"] = sum(len(s["inventory"]["cards"]) for s in specs)
        enroll_all(conn, specs)
        write_plan(home / "plan.json", server, conn, specs)
        conn.close()
        t0 = time.monotonic()
        fleet = Fleet(home / "plan.json", home / "agents.log")
        fleet.wait_enrolled(args.timeout)
        fleet.wait_connected(n_agents, args.timeout)
        fig["connect_s"] = time.monotonic() - t0
        print(f"  server pid {server.pid} on {HOST}:{server.port}; {n_agents} agents ({fig['cards']} cards) "
              f"enrolled and connected in {fig['connect_s']:.1f} s")
        fig["phase"] = "load"
        load_phase(args, server, fleet, specs, n_runs, rate, fig)
        fig["phase"] = "load check"
        graph = worker_graph(2, args.run_seconds / 2)
        fig["load_check"] = {kind: check_all(server, fig["load_ids"][kind], 12 if kind == "local" else
                                             worker_events(graph)) for kind in ("local", "worker")}
        for kind, check in fig["load_check"].items():
            print(f"  load check ({kind}): {_check_line(check)}")
        if args.adopt_per_agent:
            fig["phase"] = "restart"
            server = restart_phase(args, server, fleet, specs, home, fig)
        fig["phase"] = "done"
    except (BenchError, *CLIENT_ERRORS) as exc:  # the server or the agents gave out: a finding at this scale
        fig["error"], fig["out_of_time"] = f"{fig['phase']} phase: {exc}", isinstance(exc, OutOfTime)
        print(f"  STOPPED in the {fig['error']}")
    finally:
        if fleet is not None:
            final = fleet.close()
            if final:
                fig["agent_counts"], fig["agent_errors"] = final["counts"], final["errors"]
                counts = {k: final["counts"].get(k, 0) for k in ("connect_failures", "disconnects", "kills", "cancels")}
                top = sorted(final["errors"].items(), key=lambda item: -item[1])[:3]
                print(f"  agents in all: {counts}; errors {top}")
        again = getattr(fig.get("adoption"), "server", None)
        if again is not None and again is not server:  # the restart phase gave out after it started one
            server = again
        code = stop_server_proc(server.proc, 30.0)
        fig["server_exit"] = code
        print(f"  stopped the agents and the server (exit {code})")
        for label, digest in (("before the kill", fig.get("log_before_kill")), ("", log_digest(server.log_path))):
            if digest:
                top = sorted(digest.items(), key=lambda item: -item[1])[:6]
                print(f"  server log{' ' + label if label else ''}: " + "; ".join(f"{n} x {m}" for m, n in top))
    return fig
