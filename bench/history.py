"""A year of a lab's history: a store of ``--runs`` finished runs (a million: a year of a
lab; 40 points each), then what a person waits for against a live server.

1. Build (bench/_history_build.py): the runs of bench/_history_runs.py written through the
   store's own bulk path (troupe/actors/store/bulk.py) into ``--store-dir``/home, resumed where a
   previous build stopped, with its throughput. A store folder is built once and grown:
   ``--runs 30000`` on a folder of 3,000 runs adds 27,000.
2. Size: the database's bytes per run, and each table's share (SQLite's dbstat).
3. A real ``troupe start`` on 127.0.0.1 against that home (retention off, as a year of
   history needs): its start (spawn to serving) and idle RSS, then each read below sampled
   at a fixed rate (``--every``; a late answer skips ticks, never floods), nearest-rank
   p50/p99: the runs list (the API's first page; the page's own grouped read), ``where``
   on a param, a metric and both, ``q``, a run page's four reads, ``group_by``, the keys.
4. Retention (``--retention``), in this process on the stopped server's database through
   the store's ``Writer``: the pass a run's end schedules when there is nothing to prune,
   and a prune of the oldest 1,000 runs; the pruned runs are then built again.
5. MLflow (``--mlflow PYTHON``, a virtual environment with mlflow, never troupe's): its
   SQLite store filled with the same runs (cached in the store folder), ``search_runs``
   with the same three filters in its own process (bench/_history_mlflow.py).

    .venv/bin/python bench/history.py --store-dir /tmp/history --runs 30000 --mlflow /tmp/mlflow-venv/bin/python

Goals (reported, never asserted): list p99 <= 50 ms; where p50 <= 100 ms, p99 <= 300 ms; a
run page's reads <= 100 ms; start <= 5 s; idle RSS <= 80 MB.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path[0] = str(Path(__file__).resolve().parent.parent)  # the repository, not bench/, first

from bench._history_build import build, items_for
from bench._history_runs import run
from bench._http import Conn
from bench._measure import BenchError, machine, next_tick, percentile, rss_mb, run_main
from bench._troupe import REPO, Server, start_server, stop_server_proc

WHERE = {
    "where: a param (adam.lr = 0.01)": "adam.lr = 0.01",
    "where: a metric (metric.val_loss < 0.1)": "metric.val_loss < 0.1",
    "where: both": "adam.lr = 0.01 and metric.val_loss < 0.1",
}


def _q(text: str) -> str:
    return urllib.parse.quote(text, safe="")


def sampled(conn: Conn, paths: Any, samples: int, every: float) -> dict[str, Any]:
    """``paths(i)``: the reads of sample ``i`` (made in turn; the sample is their sum)."""
    took: list[float] = []
    found: list[int] = []
    start = due = time.monotonic()
    for i in range(samples):
        time.sleep(max(0.0, due - time.monotonic()))
        t0 = time.perf_counter()
        for path in paths(i):
            status, body = conn.request("GET", path)
            if status != 200:
                raise BenchError(f"GET {path} answered {status}: {str(body)[:300]}")
        took.append(time.perf_counter() - t0)
        found.append(len(body.get("runs") or body.get("groups") or body.get("keys") or []) if isinstance(body, dict)
                     else 0)
        due = next_tick(start, every, time.monotonic())
    return {"p50_ms": percentile(took, 50) * 1e3, "p99_ms": percentile(took, 99) * 1e3,
            "max_ms": max(took) * 1e3, "n": samples, "rows": found[-1]}


def reads(runs: int) -> dict[str, Any]:
    """Each figure's reads, by sample."""
    rng = random.Random(64)
    page_runs = [run(rng.randrange(runs)).id for _ in range(1000)]
    old = run(runs // 4).id[:12]
    table: dict[str, Any] = {
        "list: newest 50 (/api/runs)": lambda i: ["/api/runs?limit=50"],
        "list: the page's read (grouped, values, 200)": lambda i: ["/api/runs?grouped=true&values=true&limit=200"],
    }
    for label, text in WHERE.items():
        table[label] = lambda i, text=text: [f"/api/runs?limit=50&where={_q(text)}"]
    table["q: a param value many runs have (128,64)"] = lambda i: ["/api/runs?limit=50&q=128%2C64"]
    table[f"q: an old run's id prefix ({old})"] = lambda i: [f"/api/runs?limit=50&q={old}"]
    table["a run page's reads (run, events tail, console, metrics)"] = lambda i: [
        f"/api/runs/{page_runs[i % 1000]}", f"/api/runs/{page_runs[i % 1000]}/events?tail=200",
        f"/api/runs/{page_runs[i % 1000]}/console?nodes=true", f"/api/runs/{page_runs[i % 1000]}/metrics"]
    table["group_by adam.lr, metric val_loss (every run)"] = lambda i: [
        "/api/runs?group_by=adam.lr&metric=val_loss"]
    table["group_by mlp.hidden within where adam.lr = 0.01"] = lambda i: [
        f"/api/runs?group_by=mlp.hidden&metric=val_loss&where={_q('adam.lr = 0.01')}"]
    table["keys (/api/runs/keys)"] = lambda i: ["/api/runs/keys"]
    return table


def db_size(db: Path, runs: int) -> dict[str, Any]:
    import apsw

    files = {p.name: p.stat().st_size for p in db.parent.glob(db.name + "*")}
    conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        tables = {str(name): int(str(size)) for name, size in conn.execute(
            "SELECT name, SUM(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC")}
    except apsw.SQLError:
        tables = {}
    finally:
        conn.close()
    total = sum(files.values())
    return {"bytes": total, "per_run_kb": total / runs / 1e3, "files": files, "tables": tables}


# The reads that walk many runs at a million (a search with one match, a fold of every
# run): fewer samples, or one figure would take a quarter of an hour.
WALKS = ("q: an old run's id prefix", "group_by")


def serve(home: Path, runs: int, samples: int, every: float, say: Any, walk_samples: int = 20) -> dict[str, Any]:
    server: Server = start_server(home, 2, timeout=300)
    out: dict[str, Any] = {"start_s": server.start_s}
    try:
        time.sleep(5.0)
        out["idle_rss_mb"] = rss_mb(server.pid)[0]
        say(f"troupe start: serving after {server.start_s:.2f} s; idle RSS {out['idle_rss_mb']:.1f} MB")
        conn = Conn(server.port, server.token, 120.0)
        figures: dict[str, Any] = {}
        for label, paths in reads(runs).items():
            conn.request("GET", paths(0)[0])  # one unsampled read: the first a person makes
            walks = label.startswith(WALKS)
            figures[label] = sampled(conn, paths, min(samples, walk_samples) if walks else samples, every)
            f = figures[label]
            say(f"  {label:58s} p50 {f['p50_ms']:8.2f} ms  p99 {f['p99_ms']:8.2f} ms  max {f['max_ms']:8.2f} ms  "
                f"(n={f['n']}, rows {f['rows']})")
        conn.close()
        out["reads"] = figures
        time.sleep(5.0)
        out["rss_after_mb"], out["hwm_mb"] = rss_mb(server.pid)
        say(f"RSS 5 s after the reads {out['rss_after_mb']:.1f} MB (peak {out['hwm_mb']:.1f} MB)")
    finally:
        stop_server_proc(server.proc, 60)
    return out


def retention(store_dir: Path, runs: int, say: Any) -> dict[str, Any]:
    from bench._history_build import Maker, capture_template
    from troupe.actors.store.bulk import BulkStore
    from troupe.actors.store.retention import Prune

    home = store_dir / "home"
    bulk = BulkStore(home / "troupe.db", home / "runs")
    out: dict[str, Any] = {}
    try:
        took = []
        for _ in range(5):
            t0 = time.perf_counter()
            bulk.writer.commit([Prune(10**9)])
            took.append(time.perf_counter() - t0)
        out["pass_nothing_ms"] = sorted(took)[2] * 1e3
        count = int(str(bulk.conn.execute("SELECT COUNT(*) FROM runs").fetchall()[0][0]))
        cut = min(1000, count // 2)
        t0 = time.perf_counter()
        pruned = bulk.writer.commit([Prune(count - cut)])[0]
        out["prune_s"], out["pruned"] = time.perf_counter() - t0, len(pruned.run_ids)
        say(f"retention: a pass with nothing to prune {out['pass_nothing_ms']:.1f} ms (median of 5); pruning the "
            f"oldest {out['pruned']} runs {out['prune_s']:.2f} s")
        maker = Maker(capture_template(store_dir / "template.json"))
        t0 = time.perf_counter()
        bulk.store(items_for(maker, bulk, 0, cut + 48))
        out["rebuilt_s"] = time.perf_counter() - t0
        left = int(str(bulk.conn.execute("SELECT COUNT(*) FROM runs").fetchall()[0][0]))
        if left != count:
            raise BenchError(f"after the prune and the rebuild the store holds {left} runs, not {count}")
    finally:
        bulk.close()
    return out


def mlflow(python: str, store_dir: Path, runs: int, samples: int, every: float, say: Any) -> dict[str, Any]:
    db = store_dir / f"mlflow-{runs}.db"
    if not db.exists():  # grown from the largest smaller fill, as troupe's store is
        smaller = sorted((int(p.stem.split("-")[1]), p) for p in store_dir.glob("mlflow-*.db")
                         if p.stem.split("-")[1].isdigit() and int(p.stem.split("-")[1]) < runs)
        if smaller:
            subprocess.run(["cp", str(smaller[-1][1]), str(db)], check=True)
    done = subprocess.run([python, str(REPO / "bench" / "_history_mlflow.py"), "--db", str(db), "--runs", str(runs),
                           "--samples", str(samples), "--every", str(every)], capture_output=True, text=True)
    if done.returncode != 0:
        raise BenchError(f"the MLflow side failed:\n{done.stderr[-3000:]}")
    result = dict(json.loads(done.stdout.strip().splitlines()[-1]))
    fill = result["fill"]
    say(f"MLflow {result['mlflow']}: {runs:,} runs ({fill['runs'] - fill['filled_from']:,} filled now in "
        f"{fill['fill_s']:.0f} s), {result['db_mb']:.0f} MB")
    for label, f in result["search"].items():
        say(f"  search_runs {label:7s} {f['filter']!r:52s} p50 {f['p50_ms']:8.2f} ms  p99 {f['p99_ms']:8.2f} ms "
            f"(n={f['n']}, rows {f['found']})")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--store-dir", type=Path, required=True, help="built once, grown, reused")
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--every", type=float, default=0.05, help="seconds between two samples")
    parser.add_argument("--walk-samples", type=int, default=20, help="samples of the reads that walk many runs")
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--retention", action="store_true", help="also prune 1,000 runs (then built again)")
    parser.add_argument("--mlflow", metavar="PYTHON", help="a python with mlflow: MLflow at the same runs")
    args = parser.parse_args()
    say = print
    say("machine: " + ", ".join(f"{k} {v}" for k, v in machine().items() if k != "free"))
    results: dict[str, Any] = {"runs": args.runs, "commit": subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()}
    results["build"] = build(args.store_dir, args.runs, say)
    home = args.store_dir / "home"
    size = results["size"] = db_size(home / "troupe.db", args.runs)
    say(f"database: {size['bytes'] / 1e9:.2f} GB, {size['per_run_kb']:.1f} kB a run; by table (MB): " + ", ".join(
        f"{name} {b / 1e6:.0f}" for name, b in list(size["tables"].items())[:8]))
    if not args.build_only:
        results["serve"] = serve(home, args.runs, args.samples, args.every, say, args.walk_samples)
        if args.retention:
            results["retention"] = retention(args.store_dir, args.runs, say)
        if args.mlflow:
            results["mlflow"] = mlflow(args.mlflow, args.store_dir, args.runs, min(args.samples, 50), 0.1, say)
    (args.store_dir / f"results-{args.runs}.json").write_text(json.dumps(results, indent=1))
    say(f"reproduce: .venv/bin/python bench/history.py --store-dir DIR --runs {args.runs} --samples {args.samples} "
        f"--every {args.every} --walk-samples {args.walk_samples}" + (" --retention" if args.retention else "")
        + (" --mlflow /tmp/mlflow-venv/bin/python" if args.mlflow else ""))
    return 0


if __name__ == "__main__":
    run_main(main)
