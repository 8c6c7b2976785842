"""A live run's page following a fast training, measured in Chromium (issue 41, point 6).

A command run prints a metric line and a progress line for each of ``--epochs`` epochs
(about 330 epochs a second at the default pause), so its page gets ~660 events a second.
The page is opened once the run started and followed for ``--seconds``. Sampled once a
second (the sampler reads the server, never floods it): the page's requests other than
its stream, how far the epoch the page shows is behind the server's newest (in seconds,
at the run's rate), and how busy the tab's main thread was (CDP Performance
TaskDuration). Reported: requests a second, the median and p90 lag, the median busy share.

    .venv/bin/python bench/live_page.py --epochs 20000 --seconds 60
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._http import Conn
from bench._measure import percentile
from bench._troupe import start_server, stop_server_proc

SCRIPT = """
import json, sys, time
epochs, pause = int(sys.argv[1]), float(sys.argv[2])
for epoch in range(1, epochs + 1):
    print(json.dumps({"metric": "loss", "value": 1.0 / epoch, "step": epoch}))
    print(json.dumps({"progress": epoch, "total": epochs}), flush=True)
    time.sleep(pause)
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=20000)
    parser.add_argument("--pause", type=float, default=0.003)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        (home / "fast.py").write_text(SCRIPT)
        (home / "home").mkdir()
        server = start_server(home / "home", 2, 60.0, {"TROUPE_DATA_ROOTS": str(home)})
        conn = Conn(server.port, server.token, 30.0)
        try:
            graph = {"version": 1, "name": "fast", "nodes": [{"id": "job", "type": "script.Command", "params": {
                "argv": ["{python}", "fast.py", str(args.epochs), str(args.pause)], "cwd": str(home)}}], "edges": []}
            status, made = conn.request("POST", "/api/runs", json.dumps({"graph": graph}).encode())
            assert status == 201, made
            run_id = made["run_id"]
            while conn.request("GET", f"/api/runs/{run_id}")[1]["status"] != "running":
                time.sleep(0.1)
            login_url = json.loads((home / "home" / "session.json").read_text())["login_url"]
            figures = _follow(sync_playwright, server.port, login_url, run_id, conn, args)
        finally:
            conn.request("POST", f"/api/runs/{made['run_id']}/cancel")
            stop_server_proc(server.proc, 30.0)
    print(json.dumps(figures, indent=2))
    print(f"reproduce: .venv/bin/python bench/live_page.py --epochs {args.epochs} --pause {args.pause:g} "
          f"--seconds {args.seconds:g}")
    return 0


def _follow(sync_playwright, port, login_url, run_id, conn, args) -> dict:  # type: ignore[no-untyped-def]
    chromium = "/usr/bin/chromium"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        tab = browser.new_page(viewport={"width": 1440, "height": 900})
        asked: list[float] = []
        tab.on("request", lambda r: asked.append(time.monotonic()) if "/api/" in r.url and "/stream" not in r.url
               else None)
        tab.goto(login_url)  # logged in as a user is: the link `troupe start` printed
        tab.wait_for_url(re.compile(r"/$"))
        tab.goto(f"http://127.0.0.1:{port}/#/runs/{run_id}")
        tab.locator("#run-head [data-progress]").wait_for(timeout=30_000)
        cdp = tab.context.new_cdp_session(tab)
        cdp.send("Performance.enable")
        rate = 1.0 / args.pause  # epochs a second the script aims at (its real rate is measured below)
        start = time.monotonic()
        asked_before = len([t for t in asked if t <= start])
        lags, busy, epochs_seen = [], [], []
        last_task = _task_seconds(cdp)
        last_at = start
        while time.monotonic() - start < args.seconds:
            time.sleep(1.0)
            shown = _shown_epoch(tab)
            progress = conn.request("GET", f"/api/runs/{run_id}")[1].get("progress") or {}
            now = time.monotonic()
            task = _task_seconds(cdp)
            busy.append((task - last_task) / (now - last_at))
            last_task, last_at = task, now
            if shown is not None and progress.get("epoch"):
                epochs_seen.append((now, progress["epoch"]))
                lags.append(max(0, progress["epoch"] - shown))
        if len(epochs_seen) > 1:
            rate = (epochs_seen[-1][1] - epochs_seen[0][1]) / (epochs_seen[-1][0] - epochs_seen[0][0])
        took = time.monotonic() - start
        reads = len(asked) - asked_before
        browser.close()
    seconds_behind = sorted(lag / rate for lag in lags) if rate else []
    return {"followed_s": round(took, 1), "epochs_a_second": round(rate, 1),
            "page_reads_a_second": round(reads / took, 2),
            "behind_s_median": round(statistics.median(seconds_behind), 2) if seconds_behind else None,
            "behind_s_p90": round(percentile(seconds_behind, 90), 2) if seconds_behind else None,
            "main_thread_busy_median": round(statistics.median(busy), 3) if busy else None}


def _task_seconds(cdp) -> float:  # type: ignore[no-untyped-def]
    metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    return float(metrics.get("TaskDuration", 0.0))


def _shown_epoch(tab) -> int | None:  # type: ignore[no-untyped-def]
    text = tab.locator("#run-head [data-progress]").inner_text()
    found = re.match(r"epoch (\d+)/", text)
    return int(found.group(1)) if found else None


if __name__ == "__main__":
    sys.exit(main())
