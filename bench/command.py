"""What a command node costs over starting the same script by hand.

A one-line Python script (it prints a metric line and exits) is run ``--runs`` times by
hand (``subprocess.run``, as a shell would) and ``--runs`` times as a ``script.Command``
run, in-process and on a warm worker (``--warm 1``), one at a time, each followed to its
end on its own connection. Reported: the medians (and p90) of the three, and the
overhead of each path over the hand median.

    .venv/bin/python bench/command.py --runs 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._http import Conn
from bench._measure import percentile
from bench._troupe import start_server, stop_server_proc
from bench.worker import WORKER, enroll_and_attach, one_run, started_warm, wait_for_warm_child

SCRIPT = 'import json\nprint(json.dumps({"metric": "loss", "value": 0.5}))\n'


def _by_hand(folder: Path, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "job.py"], cwd=folder, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return times


def _body(target: str | None) -> bytes:
    graph = {"version": 1, "name": "command", "settings": {"device": "cpu"}, "edges": [],
             "nodes": [{"id": "c", "type": "script.Command",
                        "params": {"argv": ["{python}", "job.py"], "cwd": "data:."}}]}
    options = {"target": {"worker": target}} if target else {}
    return json.dumps({"graph": graph, "options": options}).encode()


def _through(conn: Conn, body: bytes, queue_key: str, runs: int) -> tuple[list[float], int]:
    """The counted runs' times, and how many of them started in a warm child."""
    times, warm = [], 0
    for i in range(runs + 2):  # two to warm up, not counted
        row = one_run(conn, body, queue_key)
        if not row["ok"]:
            raise SystemExit(f"run {row['run_id']} did not succeed")
        times.append(row["finished"])
        warm += i >= 2 and started_warm(conn, row["run_id"])
    return times[2:], warm


def _line(name: str, times: list[float], hand: float | None = None) -> str:
    median = statistics.median(times)
    p90 = percentile(times, 90)
    over = f"  overhead {1000 * (median - hand):+.1f} ms" if hand is not None else ""
    return f"  {name:<22} median {1000 * median:7.1f} ms  p90 {1000 * p90:7.1f} ms{over}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "lab"
        folder.mkdir()
        (folder / "job.py").write_text(SCRIPT)
        (Path(tmp) / "home").mkdir()
        # The script's folder is storage label data, on the server and on the agent.
        server = start_server(Path(tmp) / "home", 2, 60, {"TROUPE_MOUNT_PATH": str(folder)})
        agent = None
        try:
            conn = Conn(server.port, server.token, 60)
            hand = _by_hand(folder, args.runs)
            local, _ = _through(conn, _body(None), "cpu", args.runs)
            agent, _ = enroll_and_attach(conn, server.port, Path(tmp), 60,
                                         extra=("--warm", "1", "--mount", f"data={folder}"))
            # Until its zygote is ready a new agent starts every run in a fresh interpreter.
            wait_for_warm_child(conn, 60, WORKER)
            remote, warm = _through(conn, _body(WORKER), f"{WORKER}/cpu", args.runs)
        finally:
            if agent is not None:
                stop_server_proc(agent, 30)
            stop_server_proc(server.proc, 30)
    base = statistics.median(hand)
    print(f"a one-line script, {args.runs} runs each, one at a time (client time, submit to run_finished):")
    print(_line("by hand", hand))
    print(_line("command, in-process", local, base))
    print(_line("command, warm worker", remote, base) + f"  ({warm} of {args.runs} started warm)")
    print(f"reproduce: .venv/bin/python bench/command.py --runs {args.runs}")


if __name__ == "__main__":
    main()
