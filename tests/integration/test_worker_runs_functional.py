"""Runs on a worker: one fresh process per run on the agent, the same events as in-process."""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers import graph, hello, node, sleeper
from tests.integration.test_single_node_parity import canonical
from tests.integration.test_workers_functional import enroll, read_until, start_agent, worker_state
from troupe.protocol.events import utc_now


@pytest.fixture
def warm(request):
    """Warm children the agent keeps (--warm); 0 unless a test asks for both ways."""
    return getattr(request, "param", 0)


# Every guarantee of a fresh run child holds for one from the warm pool: these run both ways.
BOTH_WAYS = pytest.mark.parametrize("warm", [0, 2], ids=["cold", "warm"], indirect=True)


def wait_warm(server, name: str, ready: int) -> None:
    server.poll_until(lambda: ((worker_state(server, name) or {}).get("warm_pool") or {}).get("ready") == ready,
                      timeout=60)


@pytest.fixture
def worker(make_server, tmp_path, warm):
    """A server with one connected agent named gpu-a (one simulated card)."""
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1", TROUPE_WORKER_RESUME_GRACE_S="2")
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"] + f" --warm {warm}")
    read_until(agent, "connected as gpu-a")
    if warm:
        wait_warm(server, "gpu-a", warm)
    yield server, agent
    if agent.poll() is None:
        agent.terminate()
        agent.wait(30)


def target(**extra):
    return {"worker": "gpu-a", **extra}


@BOTH_WAYS
def test_a_worker_run_gives_the_same_events_as_an_in_process_run(worker, warm):
    server, _ = worker
    remote = server.submit(hello(), target=target())
    assert remote["queue_key"] == "gpu-a/cpu" and remote["device"] == "cpu"
    local = server.submit(hello())
    remote_events = server.events_until_finished(remote["run_id"])
    local_events = server.events_until_finished(local["run_id"])
    assert remote_events[-1]["payload"]["status"] == "succeeded"
    remote_form, local_form = canonical(remote_events), canonical(local_events)
    assert remote_form["run"][0]["payload"].pop("queue_key") == "gpu-a/cpu"
    assert local_form["run"][0]["payload"].pop("queue_key") == "cpu"
    assert remote_form == local_form  # the same vocabulary and order, whoever executes
    assert [e["seq"] for e in remote_events] == list(range(1, len(remote_events) + 1))
    row = server.get(f"/api/runs/{remote['run_id']}")
    assert row["final_loss"] == 5.0
    facts = row["execution_facts"]  # taken in the run's own process, warm or not
    assert (facts["fingerprint_source"], facts["started_warm"]) == ("run_process", bool(warm))


@BOTH_WAYS
def test_target_devices_win_and_a_missing_card_falls_back_with_a_warning(worker):
    server, _ = worker
    on_card = server.submit(hello(), device="cpu", target=target(devices=["cuda:0"]))
    assert on_card["queue_key"] == "gpu-a/cuda:0" and on_card["warnings"] == []
    missing = server.submit(hello(), target=target(devices=["cuda:5"]))
    assert missing["queue_key"] == "gpu-a/cpu" and "worker gpu-a" in missing["warnings"][0]
    for run in (on_card, missing):
        assert server.events_until_finished(run["run_id"])[-1]["payload"]["status"] == "succeeded"


def test_unknown_workers_and_interactive_targets_are_refused(worker):
    server, _ = worker
    unknown = server.submit(hello(), expect=400, target={"worker": "nope"})
    assert unknown["error"]["code"] == "unknown_target"
    interactive = server.submit(hello(), expect=400, target=target(), lane="interactive", editor_session="e")
    assert interactive["error"]["pointer"] == "/options/lane"


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _executing_child(server, agent, run_id: str) -> list[int]:
    """The process of a worker run, once its first node executes: the agent's child, or
    (forked) its zygote's."""
    server.wait_status(run_id, "running")
    for kind, data in server.client.stream(f"/api/runs/{run_id}/stream", read_timeout=30):
        if kind == "run_event" and data["type"] == "node_started":
            break
    pid = server.get(f"/api/runs/{run_id}")["execution_facts"]["pid"]
    below = _children(agent.pid)
    assert pid in below + [c for child in below for c in _children(child)]
    assert "spawn" in Path(f"/proc/{pid}/cmdline").read_text()  # an interpreter of its own, or forked from one
    return [pid]


@BOTH_WAYS
def test_a_child_killed_by_a_signal_fails_only_its_run(worker):
    server, agent = worker
    doomed = server.submit(sleeper(seconds=60), target=target())["run_id"]
    spawned = _executing_child(server, agent, doomed)
    for pid in spawned:
        os.kill(pid, signal.SIGKILL)
    events = server.events_until_finished(doomed)
    assert events[-1]["payload"]["status"] == "failed" and "SIGKILL" in events[-1]["payload"]["error"]
    # The node that was executing ends failed too, not started with nothing after it.
    (started,) = [e["node_id"] for e in events if e["type"] == "node_started"]
    failed = [e for e in events if e["type"] == "node_failed" and e["node_id"] == started]
    assert len(failed) == 1 and "SIGKILL" in failed[0]["payload"]["error"]
    assert worker_state(server, "gpu-a")["state"] == "connected"
    after = server.submit(hello(), target=target())["run_id"]
    assert server.events_until_finished(after)[-1]["payload"]["status"] == "succeeded"


@BOTH_WAYS
def test_cancel_reaches_the_run_on_its_worker(worker):
    server, _ = worker
    run_id = server.submit(sleeper(seconds=60), target=target())["run_id"]
    server.wait_status(run_id, "running")
    server.client.request("POST", f"/api/runs/{run_id}/cancel")
    assert server.events_until_finished(run_id)[-1]["payload"]["status"] == "cancelled"


@BOTH_WAYS
def test_a_run_that_ignores_cancel_is_killed_after_the_kill_grace(make_server, tmp_path, warm):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"] + f" --warm {warm}",
                        TROUPE_WORKER_KILL_GRACE_S="1")
    try:
        read_until(agent, "connected as gpu-a")
        if warm:
            wait_warm(server, "gpu-a", warm)
        run_id = server.submit(sleeper(seconds=60), target=target())["run_id"]
        spawned = _executing_child(server, agent, run_id)
        for pid in spawned:
            os.kill(pid, signal.SIGSTOP)  # hung: it cannot read the cancel
        server.client.request("POST", f"/api/runs/{run_id}/cancel")
        ended = server.events_until_finished(run_id)[-1]["payload"]
        assert ended["status"] == "cancelled" and "within 1 s" in ended["error"]
        assert "TROUPE_WORKER_KILL_GRACE_S" in ended["error"]
        assert not any(_alive(pid) for pid in spawned)
    finally:
        agent.terminate()
        agent.wait(30)


def test_a_lost_worker_ends_its_run_interrupted_and_an_offline_one_is_waited_for(worker, tmp_path):
    server, agent = worker
    run_id = server.submit(sleeper(seconds=60), target=target())["run_id"]
    server.wait_status(run_id, "running")
    agent.kill()
    agent.wait(10)
    server.wait_status(run_id, "disconnected")
    events = server.events_until_finished(run_id)
    assert events[-1]["payload"]["status"] == "interrupted" and events[-1]["payload"]["reason"] == "worker_lost"
    # The worker is known but offline: a run for it waits, and starts when it is back.
    waiting = server.submit(hello(), target=target())["run_id"]
    row = server.get(f"/api/runs/{waiting}")
    assert row["status"] == "queued" and row["queue_reason"]["code"] == "worker_offline"
    assert "gpu-a" in row["queue_reason"]["message"]
    # ... unless it says not to wait: then it is refused at once, and nothing is stored.
    refused = server.submit(hello(), expect=503, target=target(wait=False))
    assert refused["error"]["code"] == "worker_offline" and refused["error"]["pointer"] == "/options/target/wait"
    assert len(server.get("/api/runs")["runs"]) == 2
    again = start_agent(server, tmp_path, f"troupe agent start --url {server.url}")
    try:
        read_until(again, "connected as gpu-a")
        assert server.events_until_finished(waiting)[-1]["payload"]["status"] == "succeeded"
        now = server.submit(hello(), target=target(wait=False))["run_id"]  # connected: accepted
        assert server.events_until_finished(now)[-1]["payload"]["status"] == "succeeded"
    finally:
        again.terminate()
        again.wait(30)


@BOTH_WAYS
def test_a_returning_agent_is_told_to_kill_what_the_server_no_longer_holds(worker):
    server, agent = worker
    run_id = server.submit(sleeper(seconds=120), target=target())["run_id"]
    (child,) = _executing_child(server, agent, run_id)
    agent.send_signal(signal.SIGSTOP)  # the agent falls silent; its child keeps running
    try:
        events = server.events_until_finished(run_id)
        assert events[-1]["payload"]["reason"] == "worker_lost"
    finally:
        agent.send_signal(signal.SIGCONT)
    read_until(agent, "connected as gpu-a")
    # Told to kill it, the agent ends the child (it is reaped, or a zombie until it is).
    for _ in range(400):
        if not _alive(child):
            break
        time.sleep(0.025)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_one_card_offered_by_two_workers_runs_one_run_at_limit_1(make_server, tmp_path):
    # #842: both agents report the same NVML UUID (GPU-aaaa); it is one quota.
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agents = []
    try:
        for name in ("gpu-a", "gpu-b"):
            agent = start_agent(server, tmp_path / name, enroll(server, name=name)["command"], machine=f"m-{name}")
            read_until(agent, f"connected as {name}")
            agents.append(agent)
        first = server.submit(sleeper(seconds=60), target={"worker": "gpu-a", "devices": ["cuda:0"]})["run_id"]
        second = server.submit(hello(), target={"worker": "gpu-b", "devices": ["cuda:0"]})["run_id"]
        server.wait_status(first, "running")
        assert server.get(f"/api/runs/{second}")["status"] == "queued"
        slots = {w["name"]: w["slots"] for w in server.get("/api/workers")["workers"]}
        assert {s["physical_id"] for s in slots["gpu-a"] if s["device"] == "cuda:0"} == {"GPU-aaaa"}
        freed_at = utc_now()
        server.client.request("POST", f"/api/runs/{first}/cancel")
        assert server.events_until_finished(second)[-1]["payload"]["status"] == "succeeded"
        assert server.get(f"/api/runs/{second}")["started_at"] > freed_at  # it waited for the card
        # Each machine's cpu is its own: cpu runs on both workers at once are fine.
        a = server.submit(sleeper(seconds=60), target={"worker": "gpu-a"})["run_id"]
        b = server.submit(sleeper(seconds=60), target={"worker": "gpu-b"})["run_id"]
        server.wait_status(a, "running")
        server.wait_status(b, "running")
        for run_id in (a, b):
            server.client.request("POST", f"/api/runs/{run_id}/cancel")
    finally:
        for agent in agents:
            agent.terminate()
            agent.wait(30)


def test_a_draining_worker_takes_no_new_runs(worker):
    server, _ = worker
    status, reply = server.client.request("POST", "/api/workers/gpu-a/drain")
    assert status == 200 and reply["draining"] is True
    run_id = server.submit(hello(), target=target())["run_id"]
    # A local run submitted after it passes admission after it, and finishes meanwhile.
    later = server.submit(hello())["run_id"]
    server.events_until_finished(later)
    assert server.get(f"/api/runs/{run_id}")["status"] == "queued"
    server.client.request("POST", f"/api/runs/{run_id}/cancel")


async def test_a_degraded_worker_is_refused_graphs_it_cannot_run(shared_server):
    from tests.integration.test_workers_functional import handshake
    from tests.integration.test_workers_functional import hello as hello_frame

    answer = await handshake(shared_server, hello_frame(name="old-agent", catalog_digest="x",
                                                         node_types=["core.Constant"]))
    assert answer.degraded is True
    refused = shared_server.submit(hello(), expect=400, target={"worker": "old-agent"})
    assert refused["error"]["code"] == "worker_lacks_node_types" and "core.Add" in refused["error"]["message"]


def test_a_restarted_agent_that_lost_its_runs_ends_them_at_once(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1", TROUPE_WORKER_RESUME_GRACE_S="300")
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"])
    read_until(agent, "connected as gpu-a")
    run_id = server.submit(sleeper(seconds=60), target=target())["run_id"]
    server.wait_status(run_id, "running")
    children = _children(agent.pid)
    agent.kill()  # the agent dies; its run's process is orphaned
    agent.wait(10)
    for child in children:
        os.kill(child, signal.SIGKILL)
    server.wait_status(run_id, "disconnected")
    again = start_agent(server, tmp_path, f"troupe agent start --url {server.url}")
    try:
        read_until(again, "connected as gpu-a")
        # The new agent reports no runs: the server does not wait out its 300 s grace.
        events = server.events_until_finished(run_id)
        assert events[-1]["payload"]["status"] == "interrupted" and events[-1]["payload"]["reason"] == "worker_lost"
    finally:
        again.terminate()
        again.wait(30)


@pytest.mark.parametrize("target, pointer, code", [
    ({"queue": "one-shot"}, "/options/target/queue", "unknown_target_option"),
    ({"worker": "local", "memory_gib": 4}, "/options/target/memory_gib", "memory_budget_needs_worker"),
    ({"worker": "gpu-a", "memory_gib": 0}, "/options/target/memory_gib", "invalid_request"),
    ({"devices": ["cuda:0"]}, "/options/target/devices", "target_needs_worker"),
    ({"worker": "local", "devices": ["cuda:0"]}, "/options/target/devices", "target_needs_worker"),
    ({"worker": "gpu-a", "wait": "soon"}, "/options/target/wait", "invalid_request"),
])
def test_a_target_meant_for_elsewhere_never_runs_here(shared_server, target, pointer, code):
    before = shared_server.get("/api/runs?limit=500")["runs"]
    reply = shared_server.submit(hello(), expect=400, target=target)
    assert reply["error"]["code"] == code and reply["error"]["pointer"] == pointer
    assert shared_server.get("/api/runs?limit=500")["runs"] == before  # nothing was stored


@BOTH_WAYS
def test_a_run_whose_process_is_killed_leaves_no_folder_on_the_worker(worker):
    server, _ = worker
    line = 'echo w > "$TROUPE_CHECKPOINT_DIR/c.pt"; sleep 60'
    command = node("job", "script.Command", argv=["/bin/sh", "-c", line])
    run_id = server.submit(graph(command, name="killed"), target={"worker": "gpu-a"})["run_id"]
    server.poll_until(lambda: (server.get(f"/api/runs/{run_id}")["execution_facts"] or {}).get("pid"))
    pid = server.get(f"/api/runs/{run_id}")["execution_facts"]["pid"]

    def folders() -> list[Path]:
        return list(Path(tempfile.gettempdir()).glob(f"troupe-run-{run_id}-*"))

    server.poll_until(lambda: folders() != [])
    os.kill(pid, signal.SIGKILL)  # as the kernel's OOM killer would
    assert server.events_until_finished(run_id)[-1]["payload"]["status"] == "failed"
    server.poll_until(lambda: folders() == [], timeout=15)
