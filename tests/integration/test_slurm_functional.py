"""One-shot agents in a real SLURM (issue 15, point 2): one enrollment, an array job of
three one-shot agents, three runs to the one-shot pool. Each run lands on a distinct
agent, each job exits 0, and the worker list is empty of them afterwards.

It needs root and Debian's slurm-wlm and munge (.ci/run installs them); elsewhere it
skips, saying why."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO, hello
from tests.integration.test_workers_functional import agent_env
from tests.slurm_cluster import missing, start_cluster

REASON = missing()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


@pytest.fixture
def cluster():
    running = start_cluster()
    yield running
    running.stop()


@pytest.mark.timeout(180)
def test_one_enrollment_serves_an_array_of_one_shot_instances_that_take_three_runs(cluster, make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    status, enrollment = server.client.request("POST", "/api/workers/enrollments", {"name": "batch"})
    assert status == 201, enrollment  # one use: the first task redeems it, the others share what it stored
    script = tmp_path / "agent.sh"
    command = [*enrollment["command"].split()[1:], "--one-shot", "--idle-timeout", "120"]
    script.write_text("#!/bin/sh\n"
                      f"exec {shlex.join([sys.executable, '-m', 'troupe.cli.main', *command])} "
                      "--instance $SLURM_ARRAY_TASK_ID\n")
    env = agent_env(server, tmp_path)  # the tasks share one home, as on a cluster
    submitted = subprocess.run(["sbatch", "--parsable", "--array=0-2", f"--chdir={REPO}",
                                f"--output={tmp_path}/task-%a.out", str(script)],
                               env=env, capture_output=True, text=True, check=True)
    job = submitted.stdout.strip().split(";")[0]
    runs = [server.submit(hello(), target={"pool": "one-shot"})["run_id"] for _ in range(3)]
    placed = []
    for run_id in runs:
        events = server.events_until_finished(run_id, timeout=120)
        assert events[-1]["payload"]["status"] == "succeeded"
        placed.append(next(e for e in events if e["type"] == "run_started")["payload"]["worker"])
    assert sorted(placed) == ["batch#0", "batch#1", "batch#2"]  # one run on each task
    deadline = time.monotonic() + 60
    while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
        assert time.monotonic() < deadline, "the array's jobs did not end"
        time.sleep(0.2)
    for task in range(3):
        out = (tmp_path / f"task-{task}.out").read_text()
        assert "reported; exiting 0" in out, out

    def gone() -> bool:
        row = next(w for w in server.get("/api/workers")["workers"] if w["name"] == "batch")
        return row["instances"] == []

    server.poll_until(gone, timeout=10)  # exited instances leave no registration behind
