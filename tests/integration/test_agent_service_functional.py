"""The agent as a service (issue 15, point 4): detached by default with its pid and log
in the state dir, ``troupe agent stop`` drains and waits for the running runs up to its
timeout (an agent started again is not draining), ``--mount`` labels are reported; the
systemd unit in docs/ verifies."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO, sleeper, troupe_cmd
from tests.integration.test_workers_functional import agent_env, enroll


def troupe(server, tmp_path, *args, timeout=90):
    return subprocess.run(troupe_cmd(*args), cwd=REPO, env=agent_env(server, tmp_path), capture_output=True,
                          text=True, timeout=timeout)


def worker(server, name="gpu-a"):
    return next((w for w in server.get("/api/workers")["workers"] if w["name"] == name), None)


def test_detached_by_default_then_stop_drains_and_waits_for_the_running_run(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    join = enroll(server, name="gpu-a")["command"].split()[1:]
    started = troupe(server, tmp_path, *join, "--mount", "data=/mnt/nas", "--mount", "scratch=/tmp")
    assert started.returncode == 0, started.stdout + started.stderr
    found = re.search(r"runs in the background \(pid (\d+)\); log (\S+);", started.stdout)
    assert found, started.stdout
    server.poll_until(lambda: (worker(server) or {}).get("state") == "connected")
    assert worker(server)["mounts"] == {"data": "/mnt/nas", "scratch": "/tmp"}
    run_id = server.submit(sleeper(seconds=2), target={"worker": "gpu-a"})["run_id"]
    server.wait_status(run_id, "running")
    stopped = troupe(server, tmp_path, "agent", "stop", "--name", "gpu-a", "--timeout", "60")
    assert stopped.returncode == 0 and "stopped agent gpu-a" in stopped.stdout, stopped.stdout + stopped.stderr
    assert server.get(f"/api/runs/{run_id}")["status"] == "succeeded"  # it finished; it was not cut
    log = Path(found.group(2)).read_text()
    assert "connected as gpu-a" in log and "draining" in log
    # Started again within the grace (systemctl restart): a new agent, not a draining one.
    again = troupe(server, tmp_path, "agent", "start", "--url", server.url, "--name", "gpu-a")
    assert again.returncode == 0, again.stdout + again.stderr
    server.poll_until(lambda: (worker(server) or {}).get("state") == "connected"
                      and not worker(server)["draining"], timeout=30)
    next_run = server.submit(sleeper(seconds=0), target={"worker": "gpu-a"})["run_id"]
    assert server.events_until_finished(next_run)[-1]["payload"]["status"] == "succeeded"
    assert troupe(server, tmp_path, "agent", "stop", "--name", "gpu-a", "--timeout", "30").returncode == 0


def test_stop_past_its_timeout_stops_at_once_and_a_bad_mount_is_refused(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    join = enroll(server, name="gpu-a")["command"].split()[1:]
    assert troupe(server, tmp_path, *join).returncode == 0
    server.poll_until(lambda: (worker(server) or {}).get("state") == "connected")
    run_id = server.submit(sleeper(seconds=60), target={"worker": "gpu-a"})["run_id"]
    server.wait_status(run_id, "running")
    stopping = subprocess.Popen(troupe_cmd("agent", "stop", "--name", "gpu-a", "--timeout", "3"), cwd=REPO,
                                env=agent_env(server, tmp_path), stdout=subprocess.PIPE, text=True)
    server.poll_until(lambda: worker(server)["draining"])
    late = server.submit(sleeper(seconds=1), target={"worker": "gpu-a"})["run_id"]
    assert "stopping it now" in stopping.communicate(timeout=60)[0]
    ended = server.events_until_finished(run_id)[-1]["payload"]
    assert ended["status"] == "cancelled"  # cancelled and reported by the stopping agent, not left to the grace
    assert server.get(f"/api/runs/{late}")["status"] == "queued"  # nothing new went to the draining agent
    server.client.request("POST", f"/api/runs/{late}/cancel")
    bad = troupe(server, tmp_path, "agent", "start", "--url", server.url, "--name", "gpu-a", "--mount", "Data")
    assert bad.returncode != 0 and "want LABEL=PATH" in bad.stderr + bad.stdout


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_the_systemd_unit_in_the_docs_verifies(tmp_path):
    text = (REPO / "docs" / "workers.md").read_text()
    unit = text.split("```ini\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "troupe-agent.service"
    path.write_text(unit.replace("/usr/local/bin/troupe", shutil.which("true") or "/bin/true"))
    checked = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_an_agent_that_cannot_write_its_state_says_so_in_a_line_and_keeps_its_token(make_server, tmp_path):
    server = make_server()
    (tmp_path / "state").write_text("a file where the agent's state folder should be")
    join = enroll(server, name="gpu-a")
    started = troupe(server, tmp_path, *join["command"].split()[1:], "--foreground", timeout=60)
    assert started.returncode == 1, started.stdout + started.stderr
    assert "the agent cannot write to" in started.stderr and "Traceback" not in started.stderr, started.stderr
    token = join["command"].split("--token ")[1].split()[0]
    status, reply = server.anonymous.request("POST", "/api/workers/credentials", {"token": token, "machine_id": "m"})
    assert status == 201, reply  # the token was not spent on an agent that could not start
