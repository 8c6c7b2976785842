"""What a machine imposes on a ``script.Command``'s program, through the real server and a
real agent: the node's ``timeout_s`` stops its whole group (SIGKILL after the grace,
TROUPE_COMMAND_KILL_GRACE_S, for a program that ignores SIGTERM); an agent that kills a
run child which did not stop in its own grace takes the command's group with it; a shared
card's memory budget reaches the program's environment, and where NVML cannot be read
the run says its budget is not watched."""

from __future__ import annotations

import json

import pytest

from tests.helpers import graph, node
from tests.integration.test_command_node_functional import _alive
from tests.integration.test_shared_cards_functional import CARD24, share
from tests.integration.test_workers_functional import enroll, read_until, start_agent
from troupe.subprocess_runner.memory import group_card_mib

STUBBORN = r'''
import json, os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # and its child inherits the ignoring
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(json.dumps({"pids": [os.getpid(), child.pid]}), flush=True)
time.sleep(600)
'''


@pytest.fixture
def lab(tmp_path):
    folder = tmp_path / "lab"
    folder.mkdir()
    (folder / "stubborn.py").write_text(STUBBORN)
    (folder / "budget.py").write_text("import json, os\n"
                                      "print(json.dumps({'result': os.environ.get('TROUPE_MEMORY_BUDGET_MIB')}))\n")
    return folder


def command(folder, script: str, **params) -> dict:
    return graph(node("job", "script.Command", argv=["{python}", script], cwd=str(folder), **params), name="limits")


def said_pids(server, run_id: str) -> list[int]:
    found: list[int] = []

    def look() -> bool:
        for event in server.get(f"/api/runs/{run_id}/events?tail=200")["events"]:
            text = event["payload"].get("text", "") if event["type"] == "console" else ""
            for line in text.splitlines():
                if line.startswith('{"pids"'):
                    found.extend(json.loads(line)["pids"])
                    return True
        return False

    server.poll_until(look, timeout=60)
    return found


def wait_gone(server, pids: list[int], timeout: float = 15) -> None:
    server.poll_until(lambda: not any(_alive(pid) for pid in pids), timeout=timeout)


def test_a_timeout_stops_a_program_that_ignores_sigterm_after_the_grace(make_server, lab):
    server = make_server(TROUPE_DATA_ROOTS=str(lab.parent), TROUPE_COMMAND_KILL_GRACE_S="0.5")
    run_id = server.submit(command(lab, "stubborn.py", timeout_s=3))["run_id"]
    pids = said_pids(server, run_id)
    assert all(_alive(pid) for pid in pids), pids
    row = server.wait_status(run_id, "failed", timeout=60)
    assert "ran past its timeout_s of 3 s" in row["error"], row["error"]
    wait_gone(server, pids)


def test_an_agent_that_kills_a_stuck_run_child_takes_the_commands_group(make_server, lab, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    # The command's grace is longer than the agent's: the agent kills the run child first.
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"], TROUPE_DATA_ROOTS=str(lab.parent),
                        TROUPE_WORKER_KILL_GRACE_S="1", TROUPE_COMMAND_KILL_GRACE_S="120")
    try:
        read_until(agent, "connected as gpu-a")
        run_id = server.submit(command(lab, "stubborn.py"), target={"worker": "gpu-a"})["run_id"]
        pids = said_pids(server, run_id)
        assert server.client.request("POST", f"/api/runs/{run_id}/cancel")[0] == 200
        row = server.wait_status(run_id, "cancelled", timeout=60)
        assert "its process was killed" in row["error"], row["error"]
        wait_gone(server, pids)
    finally:
        agent.terminate()
        agent.wait(30)


def test_a_shared_cards_budget_reaches_the_program(make_server, lab, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"], cards=(CARD24,),
                        TROUPE_DATA_ROOTS=str(lab.parent))
    try:
        read_until(agent, "connected as gpu-a")
        share(server)
        doc = command(lab, "budget.py")
        run_id = server.submit(doc, device="cuda:0", target={"worker": "gpu-a", "memory_gib": 6})["run_id"]
        assert server.wait_status(run_id, "succeeded", timeout=90)["status"] == "succeeded"
        outputs = server.get(f"/api/runs/{run_id}/events?tail=200")["events"]
        console = "".join(e["payload"].get("text", "") for e in outputs if e["type"] == "console")
        assert json.dumps({"result": "6144"}) in console, console
        warned = {e["payload"].get("code") for e in outputs if e["type"] == "warning"}
        if group_card_mib(0) is None:  # no NVML here (this machine): the run says so
            assert "memory_budget_unwatched" in warned, outputs
        else:
            print("NVML is readable here: the budget is watched (tests/gpu checks it on a card)")
            assert "memory_budget_unwatched" not in warned
    finally:
        agent.terminate()
        agent.wait(30)
