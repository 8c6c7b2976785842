"""The Runs list with 10,000 runs in the database: what a page and a search cost.

Fills a server with ``--runs`` hello runs (4 client threads) and ``--sweeps`` sweeps of 30
variants, tags every tenth run, then reads the list the ways the page does, one read
every ``--every`` seconds (a fixed rate, never back to back): the newest 200 runs, the
grouped list, a search, a tag, and the list's last page through the cursor. It reports
the median and p99 a client sees. With Chromium and Playwright present it also times
the page itself: from opening it to its 200 list rows drawn.

    .venv/bin/python bench/run_list.py --runs 10000 --sweeps 10
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._http import Conn
from bench._measure import BenchError, fmt_ms, machine, next_tick, run_main, summary
from bench._troupe import REPO, start_server, stop_server_proc

HELLO = json.loads((REPO / "examples" / "hello.json").read_text())


def _fill(port: int, token: str, runs: int, sweeps: int) -> list[str]:
    ids: list[list[str]] = [[] for _ in range(4)]
    refused: list[str] = []  # a thread's error, raised once all are joined

    def submit(k: int) -> None:
        conn = Conn(port, token, 60.0)
        try:
            for i in range(k, runs, 4):
                body = json.dumps({"graph": {**HELLO, "name": f"hello-{i}"}}).encode()
                status, reply = conn.request("POST", "/api/runs", body)
                if status != 201:
                    raise BenchError(f"POST /api/runs answered {status}: {reply}")
                ids[k].append(reply["run_id"])
        except Exception as exc:  # a thread's exception would end only the thread
            refused.append(f"{type(exc).__name__}: {exc}")
        finally:
            conn.close()

    threads = [threading.Thread(target=submit, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    conn = Conn(port, token, 60.0)
    for s in range(sweeps):
        body = {"base_graph": HELLO, "name": f"sweep-{s}", "objective": {"metric": "val_loss", "direction": "minimize"},
                "sweep_spec": {"method": "grid", "params": [{"node_id": "a", "param": "value",
                                                             "values": list(range(30))}]}}
        status, reply = conn.request("POST", "/api/sweeps", json.dumps(body).encode())
        if status != 201:
            raise BenchError(f"POST /api/sweeps answered {status}: {reply}")
    for thread in threads:
        thread.join()
    if refused:
        raise BenchError(refused[0])
    while True:  # every run ended
        _, body = conn.request("GET", "/api/queues")
        if all(q["queued"] == 0 and q["running"] == 0 for q in body["queues"]):
            break
        time.sleep(0.5)
    every = [run_id for chunk in ids for run_id in chunk]
    for run_id in every[::10]:
        status, _ = conn.request("PATCH", f"/api/runs/{run_id}", json.dumps({"tags": ["bench"]}).encode())
        if status != 200:
            raise BenchError(f"PATCH answered {status}")
    conn.close()
    return every


def _last_cursor(conn: Conn) -> str:
    cursor = ""
    while True:
        _, page = conn.request("GET", f"/api/runs?limit=500&cursor={cursor}")
        if page["next_cursor"] is None:
            return cursor
        cursor = page["next_cursor"]


def _timed(conn: Conn, path: str, samples: int, every: float) -> dict[str, float]:
    took: list[float] = []
    start = due = time.monotonic()
    while len(took) < samples:
        time.sleep(max(0.0, due - time.monotonic()))
        t0 = time.perf_counter()
        status, _ = conn.request("GET", path)
        took.append(time.perf_counter() - t0)
        if status != 200:
            raise BenchError(f"GET {path} answered {status}")
        due = next_tick(start, every, time.monotonic())
    return summary(took)


def _page_load(url: str, login_url: str, samples: int) -> dict[str, float] | str:
    try:
        from playwright.sync_api import sync_playwright

        from tests.e2e.conftest import CHROMIUM, FLAGS, MISSING
    except ImportError:
        return "playwright is not installed"
    if MISSING:
        return "chromium is not installed"
    took = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        # The page's CSP forbids eval, which Playwright's polling predicate needs.
        tab = browser.new_page(viewport={"width": 1440, "height": 900}, bypass_csp=True)
        tab.goto(login_url)
        for _ in range(samples):
            t0 = time.perf_counter()
            tab.goto(url + "/")
            tab.wait_for_function("document.querySelectorAll('#rows tr').length >= 200", timeout=60_000)
            took.append(time.perf_counter() - t0)
        browser.close()
    return summary(took)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--sweeps", type=int, default=10)
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--every", type=float, default=0.1, help="seconds between two reads")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="troupe-bench-list-") as tmp:
        server = start_server(Path(tmp), cpu_slots=4, timeout=60)
        try:
            t0 = time.perf_counter()
            ids = _fill(server.port, server.token, args.runs, args.sweeps)
            filled = time.perf_counter() - t0
            conn = Conn(server.port, server.token, 60.0)
            last = _last_cursor(conn)
            reads = {
                "newest 200": "/api/runs?limit=200",
                "grouped, newest 200 rows": "/api/runs?grouped=true&limit=200",
                "search (q=hello-99)": "/api/runs?q=hello-99&limit=200",
                "tag=bench": "/api/runs?tag=bench&limit=200",
                "last page (cursor)": f"/api/runs?limit=200&cursor={last}",
                "one run": f"/api/runs/{ids[len(ids) // 2]}",
            }
            print(f"machine: {machine()}")
            print(f"{len(ids)} runs and {args.sweeps} sweeps of 30 in {filled:.0f} s; reads every {args.every} s:")
            for label, path in reads.items():
                print(f"  {label:28s} {fmt_ms(_timed(conn, path, args.samples, args.every))}")
            conn.close()
            session = json.loads((Path(tmp) / "session.json").read_text())
            page = _page_load(f"http://127.0.0.1:{server.port}", session["login_url"], 5)
            print(f"  {'page open to 200 rows':28s} {fmt_ms(page) if isinstance(page, dict) else 'skipped: ' + page}")
        finally:
            stop_server_proc(server.proc, 30)
    print(f"reproduce: .venv/bin/python bench/run_list.py --runs {args.runs} --sweeps {args.sweeps} "
          f"--samples {args.samples} --every {args.every}")
    return 0


if __name__ == "__main__":
    run_main(main)
