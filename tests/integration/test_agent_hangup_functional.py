"""No run outlives its agent: a run child is in a process group of its own (a Ctrl+C is
the agent's to act on), so the agent ends it on a hang-up as on Ctrl+C, and a child
whose agent vanished without a word (SIGKILL) ends its own group past a grace, a node
that never looks at its cancel flag included."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.helpers import REPO, graph, node, troupe_cmd
from tests.integration.test_worker_runs_functional import wait_warm
from tests.integration.test_workers_functional import agent_env, enroll, read_until
from troupe.subprocess_runner.child import ORPHAN_GRACE_S

pytestmark = pytest.mark.timeout(180)

# A node that sleeps without looking at its cancel flag (a long compute, a blocking call).
STUBBORN = """from troupe import node

__version__ = "1"


@node
def spin(seconds: float = 120.0) -> float:
    import time
    time.sleep(seconds)
    return seconds
"""


def _terminal_agent(server, tmp_path, name: str, warm: bool, nohup: bool = False) -> subprocess.Popen[str]:
    """A --foreground agent in a process group of its own, as a terminal's job is: a
    hang-up of the terminal is a SIGHUP to that whole group (``nohup``: started so)."""
    command = enroll(server, name=name)["command"] + (" --warm 1" if warm else "")
    # A terminal's job takes a hang-up's default action whatever the suite was started
    # under: a suite run under nohup hands its ignoring of SIGHUP down to every process.
    argv = [*(["nohup"] if nohup else ["env", "--default-signal=HUP"]),
            *troupe_cmd(*command.split()[1:], "--foreground")]
    agent = subprocess.Popen(argv, cwd=REPO, env=agent_env(server, tmp_path, name), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, process_group=0)
    read_until(agent, f"connected as {name}")
    if warm:
        wait_warm(server, name, 1)
    return agent


def _running_child(server, run_id: str) -> int:
    server.poll_until(lambda: (server.get(f"/api/runs/{run_id}")["execution_facts"] or {}).get("pid"), timeout=90)
    return int(server.get(f"/api/runs/{run_id}")["execution_facts"]["pid"])


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while True:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True  # dead, its parent not yet told
        except FileNotFoundError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


@pytest.fixture
def stubborn_server(make_server, tmp_path):
    home = tmp_path / "home"
    (home / "packs").mkdir(parents=True)
    (home / "packs" / "stubborn.py").write_text(STUBBORN)
    return make_server(home=home, TROUPE_WORKER_HEARTBEAT_S="1")


@contextlib.contextmanager
def _spinning(server, tmp_path, name: str, warm: bool, nohup: bool = False,
              spun: dict | None = None) -> Iterator[tuple[subprocess.Popen[str], str, int]]:
    """A terminal's agent executing a stubborn run (or a run of the node ``spun``): (the
    agent, the run, its child's pid); whatever the test did, neither is left behind."""
    agent = _terminal_agent(server, tmp_path, name, warm, nohup)
    child = None
    try:
        run_id = server.submit(graph(spun or node("s", "stubborn.spin")), target={"worker": name})["run_id"]
        child = _running_child(server, run_id)
        yield agent, run_id, child
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(30)
        if child is not None and not _gone(child, 0):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_a_hang_up_stops_the_agent_and_ends_its_runs_processes(stubborn_server, tmp_path, warm):
    with _spinning(stubborn_server, tmp_path, "term", warm) as (agent, run_id, child):
        os.killpg(agent.pid, signal.SIGHUP)  # the terminal closed
        said, _ = agent.communicate(timeout=60)
        assert agent.returncode == 0 and "Traceback" not in said, said
        assert _gone(child, 15), f"the run's process {child} outlived its agent"
        assert stubborn_server.wait_status(run_id, "cancelled", timeout=30)["status"] == "cancelled"


def test_a_run_whose_agent_was_killed_ends_its_own_process_group(stubborn_server, tmp_path):
    with _spinning(stubborn_server, tmp_path, "doomed", warm=False) as (agent, _, child):
        agent.kill()  # SIGKILL to the agent alone: it can cancel nothing
        agent.wait(30)
        assert _gone(child, ORPHAN_GRACE_S + 15), f"the run's process {child} outlived its agent"


def test_an_agent_started_under_nohup_goes_on_through_a_hang_up(stubborn_server, tmp_path):
    # A node that ends at once on a cancel: an agent that took the hang-up would be gone.
    with _spinning(stubborn_server, tmp_path, "kept", warm=False, nohup=True,
                   spun=node("s", "core.Sleep", seconds=60)) as (agent, run_id, child):
        os.killpg(agent.pid, signal.SIGHUP)  # the terminal closed: nohup asked to ignore it
        with pytest.raises(subprocess.TimeoutExpired):
            agent.wait(timeout=5)
        assert stubborn_server.get(f"/api/runs/{run_id}")["status"] == "running" and not _gone(child, 0)
