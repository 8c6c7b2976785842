"""One-shot agents: how soon a batch job's agent takes a run, and how soon it leaves.

1. From ``sbatch --array=0-N`` to the array's first ``run_started``: a real single-node
   SLURM (munge, slurmctld, slurmd; needs root and Debian's slurm-wlm and munge), a real
   ``troupe start``, and N runs already queued on the one-shot pool when the array is
   submitted. Each task starts ``troupe agent start --one-shot`` from one enrollment.
2. From a one-shot run's ``run_finished`` (the server's timestamp) to its agent's exit:
   an agent started directly (no SLURM), so the exit is timed to the millisecond. Goal:
   under 2 s.

    .venv/bin/python bench/oneshot.py [--arrays 3] [--tasks 3] [--exits 5]
"""

# ruff: noqa: E402
from __future__ import annotations

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # the repository, not bench/, first

import argparse
import shlex
import statistics
import subprocess
import tempfile
import time
from datetime import datetime

from tests.helpers import REPO, Server, hello
from tests.integration.test_workers_functional import agent_env, start_agent
from tests.slurm_cluster import missing, start_cluster


def _ts(event: dict) -> float:
    return datetime.fromisoformat(event["ts"]).timestamp()


def array_to_first_start(server: Server, tmp: Path, tasks: int, index: int) -> float:
    status, enrollment = server.client.request("POST", "/api/workers/enrollments", {"uses": tasks})
    assert status == 201, enrollment
    runs = [server.submit(hello(), target={"pool": "one-shot"})["run_id"] for _ in range(tasks)]
    script = tmp / f"agent-{index}.sh"
    command = [sys.executable, "-m", "troupe.cli.main", "agent", "start", "--url", server.url, "--token",
               enrollment["token"], "--one-shot", "--idle-timeout", "60"]
    script.write_text("#!/bin/sh\n" f"exec {shlex.join(command)} --name a{index}-$SLURM_ARRAY_TASK_ID\n")
    env = agent_env(server, tmp / f"home-{index}")
    submitted_at = time.time()
    subprocess.run(["sbatch", "--parsable", f"--array=0-{tasks - 1}", f"--chdir={REPO}",
                    f"--output={tmp}/a{index}-%a.out", str(script)], env=env, check=True, capture_output=True)
    starts = []
    for run_id in runs:
        events = server.events_until_finished(run_id, timeout=120)
        starts.append(_ts(next(e for e in events if e["type"] == "run_started")))
    return min(starts) - submitted_at


def finish_to_exit(server: Server, tmp: Path, index: int) -> float:
    command = server.client.request("POST", "/api/workers/enrollments", {"name": f"x{index}"})[1]["command"]
    agent = start_agent(server, tmp / f"x{index}", command + " --one-shot")
    try:
        for line in agent.stdout:
            if "connected as" in line:
                break
        run_id = server.submit(hello(), target={"worker": f"x{index}"})["run_id"]
        finished = _ts(server.events_until_finished(run_id)[-1])
        agent.wait(60)  # a one-shot agent exits by itself after its run: what this times
        return time.time() - finished
    finally:
        if agent.poll() is None:  # it did not exit: a finding, and no process left behind
            agent.kill()
            agent.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arrays", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=3)
    parser.add_argument("--exits", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="troupe-oneshot-") as name:
        tmp = Path(name)
        server = Server(tmp / "home", TROUPE_WORKER_HEARTBEAT_S="1").start()
        try:
            exits = [finish_to_exit(server, tmp, i) for i in range(args.exits)]
            print(f"run_finished -> one-shot agent exit, {args.exits} runs: median {statistics.median(exits):.3f} s, "
                  f"max {max(exits):.3f} s (goal: under 2 s)")
            reason = missing() or ("--arrays 0" if args.arrays < 1 else None)
            if reason is not None:
                print(f"sbatch -> first run_started: skipped ({reason})")
            else:
                cluster = start_cluster()
                try:
                    firsts = [array_to_first_start(server, tmp, args.tasks, i) for i in range(args.arrays)]
                finally:
                    cluster.stop()
                print(f"sbatch --array of {args.tasks} -> first run_started, {args.arrays} arrays: median "
                      f"{statistics.median(firsts):.3f} s, all {', '.join(f'{f:.3f}' for f in firsts)} s")
        finally:
            server.proc.terminate()
            server.proc.wait(30)
    print(f"reproduce: .venv/bin/python bench/oneshot.py --arrays {args.arrays} --tasks {args.tasks} "
          f"--exits {args.exits}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
