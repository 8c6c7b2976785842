"""One-shot agents (issue 15, point 1): an agent in a batch job takes one run, reports it
completely and exits with how it ended; ``any`` never uses one; the one-shot pool and a
named one-shot worker do, and a run waits for one only so long."""

from __future__ import annotations

import signal
import time

import pytest

from tests.helpers import graph, hello, node, sleeper
from tests.integration.test_workers_functional import enroll, read_until, start_agent, worker_state

POOL = {"pool": "one-shot"}


def one_shot_agent(server, tmp_path, name="batch-a", *extra, first=True):
    command = enroll(server, name=name)["command"] if first else f"troupe agent start --url {server.url} --name {name}"
    agent = start_agent(server, tmp_path, " ".join((command, "--one-shot", *extra)))
    read_until(agent, f"connected as {name}")
    return agent


def test_a_one_shot_agent_takes_one_run_from_the_pool_and_exits_with_its_outcome(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agent = one_shot_agent(server, tmp_path)
    try:
        row = next(w for w in server.get("/api/workers")["workers"] if w["name"] == "batch-a")
        assert row["one_shot"] is True
        anywhere = server.submit(hello(), target={"worker": "any"})  # never on a one-shot agent
        reply = server.submit(hello(), target=POOL)
        assert reply["queue_key"] == "one-shot/cpu"
        events = server.events_until_finished(reply["run_id"])
        assert events[-1]["payload"]["status"] == "succeeded"
        assert next(e for e in events if e["type"] == "run_started")["payload"]["worker"] == "batch-a"
        assert agent.wait(30) == 0  # its run was reported completely, then it exited
        tail = agent.stdout.read()
        assert f"run {reply['run_id']} succeeded, reported; exiting 0" in tail
        # A spent one-shot worker leaves the Workers list; its history stays in its run.
        server.poll_until(lambda: all(w["name"] != "batch-a" for w in server.get("/api/workers")["workers"]))
        assert server.get(f"/api/runs/{reply['run_id']}")["worker"] == "batch-a"
        queued = server.get(f"/api/runs/{anywhere['run_id']}")
        assert queued["status"] == "queued" and queued["queue_reason"]["code"] == "no_free_worker"
        server.client.request("POST", f"/api/runs/{anywhere['run_id']}/cancel")
    finally:
        if agent.poll() is None:
            agent.terminate()
            agent.wait(30)


def test_exit_codes_say_failed_and_cancelled_and_that_no_run_came(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agent = one_shot_agent(server, tmp_path / "a")
    failing = server.submit(graph(node("f", "core.Fail", message="no")), target=POOL)["run_id"]
    server.events_until_finished(failing)
    assert agent.wait(30) == 1
    agent = one_shot_agent(server, tmp_path / "a", first=False)
    long = server.submit(sleeper(seconds=60), target=POOL)["run_id"]
    server.wait_status(long, "running")
    server.client.request("POST", f"/api/runs/{long}/cancel")
    assert agent.wait(30) == 2
    idle = one_shot_agent(server, tmp_path / "b", "batch-b", "--idle-timeout", "0.5")
    assert idle.wait(30) == 4
    assert "no run came within 0.5 s" in idle.stdout.read()
    # An SSH session's forward gone before a run came: no run, never exit 0 ("succeeded").
    gone = start_agent(server, tmp_path / "b", f"troupe agent start --url {server.url} --name batch-b --one-shot "
                                               f"--unix-socket {tmp_path / 'gone.sock'}")
    assert gone.wait(30) == 4
    assert "is gone" in gone.stdout.read()


def test_a_named_one_shot_worker_takes_one_run_and_the_next_waits_for_the_next_agent(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agent = one_shot_agent(server, tmp_path)
    first = server.submit(sleeper(seconds=1), target={"worker": "batch-a"})["run_id"]
    second = server.submit(hello(), target={"worker": "batch-a"})["run_id"]
    server.wait_status(first, "running")
    waiting = server.get(f"/api/runs/{second}")
    assert waiting["status"] == "queued" and waiting["queue_reason"]["code"] == "one_shot_spent"
    assert server.events_until_finished(first)[-1]["payload"]["status"] == "succeeded"
    assert agent.wait(30) == 0
    assert server.get(f"/api/runs/{second}")["status"] == "queued"
    again = one_shot_agent(server, tmp_path, first=False)  # the next batch job, the same worker
    assert server.events_until_finished(second)[-1]["payload"]["status"] == "succeeded"
    assert again.wait(30) == 0


def test_refusals_and_a_run_that_no_agent_takes_in_time(make_server):
    server = make_server(TROUPE_WORKER_ONE_SHOT_QUEUE_TIMEOUT_S="1")
    error = server.submit(hello(), expect=400, target=POOL, record_outputs=True)["error"]
    assert (error["code"], error["pointer"]) == ("one_shot_record_outputs", "/options/record_outputs")
    error = server.submit(hello(), expect=400, target={**POOL, "worker": "any"})["error"]
    assert (error["code"], error["pointer"]) == ("target_conflict", "/options/target/pool")
    error = server.submit(hello(), expect=400, target={"pool": "spot"})["error"]
    assert (error["code"], error["pointer"]) == ("invalid_request", "/options/target/pool")
    status, reply = server.client.request("POST", "/api/workers/enrollments", {"name": "one-shot"})
    assert status == 400 and reply["error"]["pointer"] == "/name"
    run_id = server.submit(hello(), target=POOL)["run_id"]
    ended = server.events_until_finished(run_id)[-1]["payload"]
    assert (ended["status"], ended["reason"]) == ("interrupted", "one_shot_queue_timeout")
    assert "TROUPE_WORKER_ONE_SHOT_QUEUE_TIMEOUT_S" in ended["error"]


def test_instances_of_one_worker_are_listed_and_a_second_with_the_same_id_is_refused(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    join = enroll(server, name="batch")["command"] + " --one-shot --instance 7"
    first = start_agent(server, tmp_path, join)
    read_until(first, "connected as batch#7")
    twin = start_agent(server, tmp_path, join)  # the same home: it uses the stored credential
    try:
        assert twin.wait(30) == 1
        assert "instance 7 of worker batch is connected already" in twin.stdout.read()
        row = next(w for w in server.get("/api/workers")["workers"] if w["name"] == "batch")
        assert row["one_shot"] is True and row["state"] == "connected"
        assert [(i["instance"], i["state"], i["run_id"]) for i in row["instances"]] == [("7", "connected", None)]
        run_id = server.submit(sleeper(seconds=3), target={"worker": "batch"})["run_id"]  # its free instance
        server.wait_status(run_id, "running")
        # Another run for the worker is told why it waits, by its instances: the one connected took its run.
        second = server.submit(hello(), target={"worker": "batch"})["run_id"]
        assert server.get(f"/api/runs/{second}")["queue_reason"]["code"] == "one_shot_spent"
        server.client.request("POST", f"/api/runs/{second}/cancel")
        events = server.events_until_finished(run_id)
        assert next(e for e in events if e["type"] == "run_started")["payload"]["worker"] == "batch#7"
        assert first.wait(30) == 0
        server.poll_until(lambda: next(w for w in server.get("/api/workers")["workers"]
                                       if w["name"] == "batch")["instances"] == [], timeout=10)
    finally:
        for agent in (first, twin):
            if agent.poll() is None:
                agent.terminate()
                agent.wait(30)


def test_a_run_longer_than_the_batch_jobs_time_left_is_not_sent_to_it(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    deadline = time.time() + 120
    agent = one_shot_agent(server, tmp_path, "batch-a", "--deadline", f"{deadline:.3f}")
    try:
        row = next(w for w in server.get("/api/workers")["workers"] if w["name"] == "batch-a")
        assert abs(row["deadline"] - deadline) < 0.01
        long = graph({**node("z", "core.Sleep", seconds=0), "resources": {"duration_s": 3600}})
        too_long = server.submit(long, target=POOL)["run_id"]
        reason = server.get(f"/api/runs/{too_long}")["queue_reason"]
        assert reason["code"] == "no_free_worker"
        named = server.submit(long, target={"worker": "batch-a"})["run_id"]
        assert server.get(f"/api/runs/{named}")["queue_reason"]["code"] == "job_ends_too_soon"
        short = graph({**node("z", "core.Sleep", seconds=0), "resources": {"duration_s": 5}})
        fits = server.submit(short, target=POOL)["run_id"]
        assert server.events_until_finished(fits)[-1]["payload"]["status"] == "succeeded"
        assert agent.wait(30) == 0
        for run_id in (too_long, named):
            assert server.get(f"/api/runs/{run_id}")["status"] == "queued"
            server.client.request("POST", f"/api/runs/{run_id}/cancel")
    finally:
        if agent.poll() is None:
            agent.terminate()
            agent.wait(30)


@pytest.mark.timeout(180)
def test_a_second_job_of_the_name_waits_and_an_outside_stop_exits_with_the_runs_end(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1", TROUPE_WORKER_RESUME_GRACE_S="1")
    first = one_shot_agent(server, tmp_path)
    long = server.submit(sleeper(seconds=60), target=POOL)["run_id"]
    server.wait_status(long, "running")
    # The next batch job of the same worker, while the first still runs: it waits, it does not take over.
    second = start_agent(server, tmp_path, f"troupe agent start --url {server.url} --name batch-a --one-shot "
                                           "--idle-timeout 2")
    assert second.wait(60) == 4
    assert "refused for now" in second.stdout.read()
    assert server.get(f"/api/runs/{long}")["status"] == "running"
    # scancel (SIGTERM) mid-run: the run is cancelled and reported, and the exit code says so.
    first.send_signal(signal.SIGTERM)
    assert first.wait(60) == 2
    assert server.get(f"/api/runs/{long}")["status"] == "cancelled"
    # An idle one-shot agent stopped from outside: no run came (4), never succeeded (0).
    idle = one_shot_agent(server, tmp_path, first=False)
    idle.send_signal(signal.SIGTERM)
    assert idle.wait(60) == 4
    # The same worker as a lasting agent later: listed while away, though it exited as a one-shot one before.
    lasting = start_agent(server, tmp_path, f"troupe agent start --url {server.url} --name batch-a")
    read_until(lasting, "connected as batch-a")
    lasting.kill()
    lasting.wait(30)
    server.poll_until(lambda: (worker_state(server, "batch-a") or {}).get("state") == "disconnected", timeout=30)
    run = server.submit(hello(), target={"worker": "batch-a"})["run_id"]  # after the grace, not gone from the list
    assert server.get(f"/api/runs/{run}")["queue_reason"]["code"] == "worker_offline"
    assert worker_state(server, "batch-a") is not None


@pytest.mark.timeout(120)
def test_a_run_placed_as_an_idle_agent_gives_up_is_taken_or_waits_never_lost(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agent = one_shot_agent(server, tmp_path, "batch-a", "--idle-timeout", "1")
    read_until(agent, "idle for 1 s; draining")
    run_id = server.submit(hello(), target=POOL)["run_id"]  # just as it gives up
    code = agent.wait(60)
    status = server.get(f"/api/runs/{run_id}")["status"]
    assert (code, status) in ((0, "succeeded"), (4, "queued")), (code, status)
