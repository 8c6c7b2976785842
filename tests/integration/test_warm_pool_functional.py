"""The warm pool (issues 17 and 42): an agent started with --warm N forks N run children
from its zygote, which imported torch. A run takes one and the pool refills; runs in a
burst wait for children forked for them; a seeded run
gives the same numbers as in a fresh child; a run that sets environment variables of its
own starts cold; the pool's memory shows in GET /api/workers; a module global one run
changed is not seen by the next; a zygote that dies is started again and the pool goes
on. (The guarantees of a fresh child, forked or not, are in test_worker_runs_functional,
run both ways.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import types
from pathlib import Path

from tests.helpers import REPO, hello, sleeper, troupe_cmd
from tests.integration.test_packs_functional import _restart
from tests.integration.test_training_functional import quick_digits
from tests.integration.test_worker_runs_functional import wait_warm
from tests.integration.test_workers_functional import agent_env, enroll, read_until, start_agent, worker_state
from troupe.subprocess_runner.child import cuda_touched
from troupe.subprocess_runner.run_dirs import pool_dir_prefix

# A pack node that counts its calls in a global of torch (a module the zygote imported):
# a child that kept one run's state would answer 2 on the next.
MARKER = """from troupe import node


@node
def mark(x: float) -> float:
    \"\"\"How many runs of this process set the mark, this one included.\"\"\"
    import os

    import torch

    torch._troupe_mark = getattr(torch, "_troupe_mark", 0) + 1
    print(f"marked {torch._troupe_mark}", flush=True)  # the run's console, caught ahead of the run
    os.write(2, b"written past Python\\n")
    return float(torch._troupe_mark)


@node
def draw(x: float) -> float:
    \"\"\"A number from torch's global generator, which an unseeded run does not seed.\"\"\"
    import torch

    return float(torch.rand(1).item())
"""


def test_runs_take_warm_children_and_the_pool_refills(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    warm = start_agent(server, tmp_path / "warm", enroll(server, name="warm")["command"] + " --warm 1",
                       machine="warm")
    cold = start_agent(server, tmp_path / "cold", enroll(server, name="cold")["command"], machine="cold")
    try:
        read_until(warm, "connected as warm")
        read_until(cold, "connected as cold")
        wait_warm(server, "warm", 1)
        pool = worker_state(server, "warm")["warm_pool"]
        assert pool["size"] == 1 and pool["rss_mib"] > 100  # torch is imported in it
        assert worker_state(server, "cold")["warm_pool"] is None

        losses = {}
        for name in ("warm", "cold"):
            run_id = server.submit(quick_digits(epochs=1), seed=7, target={"worker": name})["run_id"]
            assert server.events_until_finished(run_id, timeout=120)[-1]["payload"]["status"] == "succeeded"
            row = server.get(f"/api/runs/{run_id}")
            assert row["execution_facts"]["started_warm"] is (name == "warm")
            losses[name] = row["final_loss"]
        assert losses["warm"] == losses["cold"]  # the run's seed, not the child's history

        wait_warm(server, "warm", 1)  # refilled in the background
        graph = hello()
        graph["nodes"][0]["resources"] = {"env": {"TROUPE_TEST_MARK": "1"}}
        run_id = server.submit(graph, target={"worker": "warm"})["run_id"]
        assert server.events_until_finished(run_id, timeout=60)[-1]["payload"]["status"] == "succeeded"
        assert server.get(f"/api/runs/{run_id}")["execution_facts"]["started_warm"] is False
        assert worker_state(server, "warm")["warm_pool"]["ready"] == 1  # left for the next run

        # A burst: the first run takes the ready child, the others wait for children forked
        # for them (a fork takes milliseconds), none starts a fresh interpreter.
        burst = [server.submit(hello(), target={"worker": "warm"})["run_id"] for _ in range(3)]
        for run_id in burst:
            assert server.events_until_finished(run_id, timeout=60)[-1]["payload"]["status"] == "succeeded"
        assert [server.get(f"/api/runs/{r}")["execution_facts"]["started_warm"] for r in burst] == [True] * 3
    finally:
        for agent in (warm, cold):
            agent.terminate()
            agent.wait(30)


def test_a_child_that_finds_cuda_initialised_is_unfit(monkeypatch):
    initialised = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: True))
    monkeypatch.setitem(sys.modules, "torch", initialised)
    assert "initialised" in (cuda_touched() or "")
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(
        cuda=types.SimpleNamespace(is_initialized=lambda: False)))
    assert cuda_touched() is None


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _waiting_child(zygote: int, ran: set[int]) -> bool:
    """Whether the zygote has a forked child alive that ran none of ``ran`` (the pool's next)."""
    for pid in _children(zygote):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if pid not in ran and state != "Z":
            return True
    return False


def _zygote(agent_pid: int) -> int | None:
    """The agent's child that has children of its own: the zygote and its forked ones."""
    return next((pid for pid in _children(agent_pid) if _children(pid)), None)


def test_no_run_sees_what_the_last_changed_and_a_lost_zygote_is_started_again(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    (server.home / "packs").mkdir()
    (server.home / "packs" / "marker.py").write_text(MARKER)
    _restart(server)
    command = enroll(server, name="warm")["command"] + " --warm 1 --accept-packs"
    agent = start_agent(server, tmp_path, command, machine="warm", TROUPE_HOME=str(tmp_path / "agent-home"))
    graph = {"version": 1, "name": "marks", "settings": {"device": "cpu"}, "edges": [
        {"source": "c", "source_port": "value", "target": "m", "target_port": "x"},
        {"source": "m", "source_port": "value", "target": "log", "target_port": "value"},
        {"source": "c", "source_port": "value", "target": "d", "target_port": "x"},
        {"source": "d", "source_port": "value", "target": "drawn", "target_port": "value"}], "nodes": [
        {"id": "c", "type": "core.Constant", "params": {"value": 1}},
        {"id": "m", "type": "marker.mark", "params": {}},
        {"id": "log", "type": "core.LogMetric", "params": {"name": "marks"}},
        {"id": "d", "type": "marker.draw", "params": {}},
        {"id": "drawn", "type": "core.LogMetric", "params": {"name": "drawn"}}]}
    try:
        read_until(agent, "connected as warm")
        wait_warm(server, "warm", 1)
        zygote = _zygote(agent.pid)
        drawn = []
        ran: set[int] = set()
        for _ in range(2):
            run_id = server.submit(graph, target={"worker": "warm"})["run_id"]
            assert server.events_until_finished(run_id, timeout=60)[-1]["payload"]["status"] == "succeeded"
            assert server.get(f"/api/runs/{run_id}")["execution_facts"]["started_warm"] is True
            marks = server.get(f"/api/runs/{run_id}/metrics")["series"]["marks"]
            assert [p["value"] for p in marks] == [1.0]  # its own process: the last run's mark is not here
            console = {(e["payload"]["stream"], e["payload"]["text"].strip())
                       for e in server.get(f"/api/runs/{run_id}/events")["events"] if e["type"] == "console"}
            assert {("stdout", "marked 1"), ("stderr", "written past Python")} <= console, console
            drawn += [p["value"] for p in server.get(f"/api/runs/{run_id}/metrics")["series"]["drawn"]]
            ran.add(server.get(f"/api/runs/{run_id}")["execution_facts"]["pid"])
            # The next child is forked a moment after one is taken; the heartbeat may still
            # say the last was ready.
            server.poll_until(lambda: _waiting_child(zygote, ran), timeout=60)
            wait_warm(server, "warm", 1)

        assert drawn[0] != drawn[1]  # unseeded: each child's generator starts from fresh entropy, not the zygote's
        os.kill(zygote, signal.SIGKILL)  # the pool's ready child stays the agent's; a new zygote comes
        for turn in range(2):  # the child forked before the loss, then one of the new zygote
            run_id = server.submit(hello(), target={"worker": "warm"})["run_id"]
            assert server.events_until_finished(run_id, timeout=60)[-1]["payload"]["status"] == "succeeded"
            assert server.get(f"/api/runs/{run_id}")["execution_facts"]["started_warm"] is True
            wait_warm(server, "warm", 1)
            if turn == 0:  # the new zygote forks the pool's next child
                server.poll_until(lambda: _zygote(agent.pid) not in (zygote, None), timeout=60)
        assert agent.poll() is None
    finally:
        agent.terminate()
        agent.wait(30)


def _own_group_agent(server, tmp_path, command: str, machine: str):
    """An agent in a process group of its own, as a terminal's foreground job is: a
    Ctrl+C there is a SIGINT to the whole group."""
    args = [*command.split()[1:], "--foreground"]
    return subprocess.Popen(troupe_cmd(*args), cwd=REPO, env=agent_env(server, tmp_path, machine),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, process_group=0)


def test_a_ctrl_c_in_the_agents_terminal_cancels_its_runs_warm_and_cold_and_prints_no_traceback(make_server,
                                                                                                  tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agent = _own_group_agent(server, tmp_path, enroll(server, name="term")["command"] + " --warm 2", "term")
    try:
        read_until(agent, "connected as term")
        wait_warm(server, "term", 2)
        cold = sleeper(60)
        cold["nodes"][0]["resources"] = {"env": {"TROUPE_TEST_COLD": "1"}}  # a run that starts cold
        runs = [server.submit(graph, target={"worker": "term"})["run_id"] for graph in (sleeper(60), cold)]
        for run_id in runs:  # running, its facts in (they go up with its first node's start)
            server.poll_until(lambda r=run_id: server.get(f"/api/runs/{r}")["execution_facts"] is not None,
                              timeout=60)
        os.killpg(agent.pid, signal.SIGINT)
        said, _ = agent.communicate(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(30)
    assert agent.returncode == 0, said
    assert "Traceback" not in said and "the zygote is gone" not in said, said
    for run_id in runs:
        server.poll_until(lambda r=run_id: server.get(f"/api/runs/{r}")["status"] == "cancelled", timeout=30)
    assert [server.get(f"/api/runs/{r}")["execution_facts"]["started_warm"] for r in runs] == [True, False]


def test_a_child_that_dies_waiting_is_replaced_and_its_folder_removed(make_server, tmp_path):
    def folders(pid: int) -> list[Path]:
        return list(Path(tempfile.gettempdir()).glob(pool_dir_prefix(pid) + "*"))

    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agent = start_agent(server, tmp_path, enroll(server, name="oom")["command"] + " --warm 1", machine="oom")
    try:
        read_until(agent, "connected as oom")
        wait_warm(server, "oom", 1)
        zygote = _zygote(agent.pid)
        server.poll_until(lambda: _waiting_child(zygote, set()), timeout=60)
        waiting = _children(zygote)[0]
        server.poll_until(lambda: folders(waiting) != [], timeout=30)
        os.kill(waiting, signal.SIGKILL)  # as the kernel's OOM killer would
        server.poll_until(lambda: _waiting_child(zygote, {waiting}), timeout=30)  # another forked in its place
        server.poll_until(lambda: folders(waiting) == [], timeout=30)
        run_id = server.submit(hello(), target={"worker": "oom"})["run_id"]
        assert server.events_until_finished(run_id, timeout=60)[-1]["payload"]["status"] == "succeeded"
        assert server.get(f"/api/runs/{run_id}")["execution_facts"]["started_warm"] is True
    finally:
        agent.terminate()
        agent.wait(30)


def test_an_agent_stopped_while_its_zygote_imports_stops_quietly(make_server, tmp_path):
    server = make_server()
    agent = start_agent(server, tmp_path, enroll(server, name="early")["command"] + " --warm 1", machine="early")
    try:
        read_until(agent, "connected as early")
        assert (worker_state(server, "early")["warm_pool"] or {}).get("ready", 0) == 0  # still importing
        agent.terminate()
        said, _ = agent.communicate(timeout=30)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(30)
    assert agent.returncode == 0 and "Traceback" not in said and "Broken pipe" not in said, said
