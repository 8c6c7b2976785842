"""Worker runs survive faults of the link: a fault-injecting proxy between a real agent
and a real control plane cuts the link mid-run, across a run's end and past the grace.
Nothing is lost and nothing is applied twice (the run's frame counter, acknowledged only
once persisted)."""

from __future__ import annotations

import time

import pytest

from tests.faultproxy import FaultProxy
from tests.helpers import graph, node
from tests.integration.test_single_node_parity import canonical
from tests.integration.test_workers_functional import enroll, read_until, start_agent, worker_state


def ticker(count: int, interval: float = 0.1) -> dict:
    return graph(node("t", "core.Ticker", count=count, interval=interval, name="tick"), name="ticker")


def node_events(events: list[dict]) -> dict:
    """The canonical form without the run-level warnings a cut adds."""
    form = canonical(events)
    form["run"] = [e for e in form["run"] if e["type"] != "warning"]
    form["run"][0]["payload"].pop("queue_key", None)
    return form


def assert_complete(server, run_id: str, count: int) -> list[dict]:
    events = server.get(f"/api/runs/{run_id}/events")["events"]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))  # gap-free
    points = server.get(f"/api/runs/{run_id}/metrics")["series"]["tick"]
    assert [p["step"] for p in points] == list(range(1, count + 1))  # no point lost or twice
    assert [p["value"] for p in points] == [float(i) for i in range(1, count + 1)]
    return events  # type: ignore[no-any-return]  # a JSON reply is untyped


def wait_event(server, run_id: str, kind: str) -> None:
    for stream_kind, data in server.client.stream(f"/api/runs/{run_id}/stream", read_timeout=60):
        if stream_kind == "run_event" and data["type"] == kind:
            return
    raise AssertionError(f"no {kind} in run {run_id}")


def agent_through(server, proxy, tmp_path, name="gpu-a", **env):
    command = enroll(server, name=name)["command"].replace(server.url, proxy.url)
    agent = start_agent(server, tmp_path, command, **env)
    read_until(agent, f"connected as {name}")
    return agent


@pytest.fixture
def link(make_server, tmp_path):
    """A server (grace 60 s), a proxy in front of it and an agent dialing the proxy."""
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1", TROUPE_WORKER_RESUME_GRACE_S="60")
    proxy = FaultProxy(int(server.url.rsplit(":", 1)[1])).start()
    agent = agent_through(server, proxy, tmp_path)
    yield server, proxy, agent
    agent.terminate()
    agent.wait(30)
    proxy.close()


def test_a_20_s_cut_mid_run_loses_nothing_and_duplicates_nothing(link):
    server, proxy, _ = link
    remote = server.submit(ticker(250), target={"worker": "gpu-a"})["run_id"]
    local = server.submit(ticker(250))["run_id"]  # the same graph, uncut, in-process
    wait_event(server, remote, "metric")
    proxy.cut()
    server.wait_status(remote, "disconnected")
    assert worker_state(server, "gpu-a")["state"] == "disconnected"
    time.sleep(20)  # the cut itself: the run keeps emitting into the agent's outbox
    proxy.restore()
    server.wait_status(remote, "succeeded", timeout=60)
    assert worker_state(server, "gpu-a")["state"] == "connected"
    server.wait_status(local, "succeeded", timeout=60)
    remote_events = assert_complete(server, remote, 250)
    local_events = assert_complete(server, local, 250)
    assert node_events(remote_events) == node_events(local_events)
    codes = [e["payload"].get("code") for e in remote_events if e["type"] == "warning"]
    assert codes == ["worker_disconnected"]


def test_a_run_that_ends_during_a_cut_ends_with_its_real_status(link):
    server, proxy, _ = link
    run_id = server.submit(ticker(20), target={"worker": "gpu-a"})["run_id"]
    failing = server.submit(graph(node("z", "core.Sleep", seconds=1), node("f", "core.Fail", message="real"),
                                  edges=({"source": "z", "source_port": "x", "target": "f", "target_port": "x"},)),
                            target={"worker": "gpu-a"})["run_id"]
    wait_event(server, run_id, "metric")
    proxy.cut()
    time.sleep(4)  # both runs end on the worker while the link is down
    proxy.restore()
    assert server.wait_status(run_id, "succeeded")["error"] is None
    assert_complete(server, run_id, 20)
    assert "real" in server.wait_status(failing, "failed")["error"]


def test_a_silent_link_is_found_by_heartbeats_and_resumes(link):
    server, proxy, _ = link
    run_id = server.submit(ticker(200), target={"worker": "gpu-a"})["run_id"]
    wait_event(server, run_id, "metric")
    proxy.hold()  # no byte passes, no socket closes
    server.wait_status(run_id, "disconnected", timeout=30)
    server.poll_until(lambda: [w["state"] for w in server.get("/api/workers")["workers"]] == ["disconnected"])
    proxy.restore()
    server.wait_status(run_id, "running", timeout=30)  # connected and running again
    server.wait_status(run_id, "succeeded", timeout=60)
    assert_complete(server, run_id, 200)


def test_past_the_grace_the_run_is_lost_and_the_returning_agent_kills_it(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1", TROUPE_WORKER_RESUME_GRACE_S="2")
    proxy = FaultProxy(int(server.url.rsplit(":", 1)[1])).start()
    agent = agent_through(server, proxy, tmp_path)
    try:
        run_id = server.submit(ticker(600), target={"worker": "gpu-a"})["run_id"]
        wait_event(server, run_id, "metric")
        proxy.cut()
        row = server.wait_status(run_id, "interrupted", timeout=30)
        assert row["error"] == "worker_lost"
        proxy.restore()
        lines = read_until(agent, f"killing the process of run {run_id}")
        assert lines  # the agent was told to stop executing a run the server gave up on
        events = server.get(f"/api/runs/{run_id}/events")["events"]
        assert events[-1]["type"] == "run_finished" and events[-1]["payload"]["reason"] == "worker_lost"
    finally:
        agent.terminate()
        agent.wait(30)
        proxy.close()


def test_an_outbox_that_overflows_says_how_many_events_it_dropped(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1", TROUPE_WORKER_RESUME_GRACE_S="60")
    proxy = FaultProxy(int(server.url.rsplit(":", 1)[1])).start()
    agent = agent_through(server, proxy, tmp_path, TROUPE_AGENT_OUTBOX_MB="0.004")  # about 4 KB
    try:
        run_id = server.submit(ticker(300, interval=0.02), target={"worker": "gpu-a"})["run_id"]
        wait_event(server, run_id, "metric")
        proxy.cut()
        time.sleep(3)
        proxy.restore()
        server.wait_status(run_id, "succeeded", timeout=60)
        events = server.get(f"/api/runs/{run_id}/events")["events"]
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        gaps = [e["payload"] for e in events if e["payload"].get("code") == "events_dropped"]
        assert gaps and all(g["count"] >= 1 for g in gaps)
        points = server.get(f"/api/runs/{run_id}/metrics")["series"]["tick"]
        assert len(points) + sum(g["count"] for g in gaps) == 300  # every event kept or counted
        assert events[-1]["payload"]["status"] == "succeeded"
    finally:
        agent.terminate()
        agent.wait(30)
        proxy.close()


def test_an_agent_whose_control_plane_is_away_logs_its_retries_with_backoff(link):
    _, proxy, agent = link
    proxy.cut()
    lines = read_until(agent, "(attempt 8;")  # it retries every second at most; it says so at 1, 2, 4, 8, 16...
    assert _retries(lines) == [("1", "0.5"), ("2", "1"), ("4", "1"), ("8", "1")], "".join(lines)
    proxy.restore()
    read_until(agent, "connected as gpu-a")  # and it comes back by itself


def test_an_agent_dials_a_restarting_control_plane_every_quarter_second_and_is_back(make_server, tmp_path):
    """Nothing listens on a restarting server's port: a refused dial costs it nothing, so
    the agent tries again every 0.25 s (not on the backoff meant for a link that fails
    otherwise) and is connected to the new server on the same port."""
    home = tmp_path / "home"
    server = make_server(home, TROUPE_WORKER_HEARTBEAT_S="1")
    agent = start_agent(server, tmp_path, enroll(server, name="back")["command"])
    try:
        read_until(agent, "connected as back")
        server.kill()
        lines = read_until(agent, "(attempt 4;")
        assert _retries(lines) == [("1", "0.25"), ("2", "0.25"), ("4", "0.25")], "".join(lines)
        assert "Connect call failed" in lines[-1]
        again = make_server(home, port=int(server.url.rsplit(":", 1)[1]), TROUPE_WORKER_HEARTBEAT_S="1")
        read_until(agent, "connected as back")
        again.wait_until(lambda: (worker_state(again, "back") or {}).get("state") == "connected")
    finally:
        agent.terminate()
        agent.wait(30)


def _retries(lines: list[str]) -> list[tuple[str, str]]:
    """(attempt, seconds between dials) of each line the agent logged about a failed dial."""
    said = [line.split("(attempt ")[1] for line in lines if "control plane unreachable" in line]
    return [(rest.split(";")[0], rest.split("retrying every ")[1].split(" s)")[0]) for rest in said]


def test_a_disconnected_run_still_counts_against_its_sessions_limits(link):
    server, proxy, _ = link
    student = server.session(uses=1, max_running=1, max_waiting=0)
    status, reply = student.request("POST", "/api/runs", {"graph": ticker(300), "options": {"target": {
        "worker": "gpu-a"}}})
    assert status == 201, reply
    server.wait_status(reply["run_id"], "running")
    proxy.cut()
    server.wait_status(reply["run_id"], "disconnected")
    # Its worker may come back with it: the session still runs one, the most it may.
    status, refused = student.request("POST", "/api/runs", {"graph": ticker(300), "options": {"target": {
        "worker": "gpu-a"}}})
    assert status == 429 and refused["error"]["details"]["limit"] == "max_waiting", refused
    proxy.restore()
    server.client.request("POST", f"/api/runs/{reply['run_id']}/cancel")
    server.wait_status(reply["run_id"], "cancelled", timeout=60)
