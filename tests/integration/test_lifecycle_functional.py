"""Retention, payload and page caps, crash recovery, graceful stop, the instance lock."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

import apsw
import pytest

from tests.helpers import REPO, base_env, edge, graph, hello, node, sleeper, troupe_cmd


def finished_ids(server):
    return [r["id"] for r in server.get("/api/runs?limit=500")["runs"] if r["status"] == "succeeded"]


def run_hello(server, n):
    ids = []
    for _ in range(n):
        run_id = server.submit(hello())["run_id"]
        server.events_until_finished(run_id)
        ids.append(run_id)
    return ids


def test_retention_keeps_the_newest_runs(make_server):
    server = make_server(TROUPE_RUN_RETENTION_KEEP_LAST="3")
    ids = run_hello(server, 5)
    # Pruning follows the final status; wait for it rather than racing it.
    server.wait_until(lambda: len(finished_ids(server)) <= 3)
    assert finished_ids(server) == ids[:1:-1]  # the newest three, newest first
    status, _ = server.client.request("GET", f"/api/runs/{ids[0]}/events")
    assert status == 404


def test_retention_counts_active_runs_but_never_prunes_them(make_server):
    server = make_server(TROUPE_RUN_RETENTION_KEEP_LAST="1")
    active = server.submit(sleeper())["run_id"]
    server.wait_status(active, "running")
    first, second = run_hello(server, 2)
    # The newest run is the window; the active one is outside it but stays.
    server.wait_until(lambda: first not in finished_ids(server))
    rows = server.get("/api/runs?limit=500")["runs"]
    assert [r["id"] for r in rows] == [second, active]
    server.client.request("POST", f"/api/runs/{active}/cancel")


def submit_until_pruned(server, g):
    """Submits once the global stream is open, and returns the changes seen until the
    run was pruned (with keep 0 it may be gone before a run stream could open)."""
    changes, run_id = [], None
    for kind, data in server.client.stream("/api/stream", read_timeout=30):
        if kind == "hello":
            run_id = server.submit(g)["run_id"]
        elif kind == "run" and data["run_id"] == run_id:
            changes.append(data)
            if data["kind"] == "deleted":
                return run_id, changes
    raise AssertionError("stream ended")


def test_retention_zero_keeps_none_and_negative_disables(make_server):
    none_kept = make_server(TROUPE_RUN_RETENTION_KEEP_LAST="0")
    run_id, changes = submit_until_pruned(none_kept, hello())
    # hello's quick nodes are walked as it starts: queued to succeeded in one write.
    assert [c["kind"] for c in changes] == ["created", "status", "deleted"]
    assert changes[1]["status"] == "succeeded" and changes[2]["reason"] == "retention"
    status, _ = none_kept.client.request("GET", f"/api/runs/{run_id}")
    assert status == 404
    assert none_kept.get("/api/runs")["runs"] == []
    disabled = make_server(TROUPE_RUN_RETENTION_KEEP_LAST="-1")
    assert len(run_hello(disabled, 4)) == len(finished_ids(disabled)) == 4


def test_retention_at_start_removes_run_dirs_but_keeps_interrupted_checkpoints(make_server, tmp_path):
    home = tmp_path / "keep"
    server = make_server(home=home, TROUPE_RUN_RETENTION_KEEP_LAST="-1")
    done = run_hello(server, 1)[0]
    stuck = server.submit(sleeper())["run_id"]
    server.wait_status(stuck, "running")
    server.kill()  # leaves `stuck` running: recovery makes it interrupted
    for run_id in (done, stuck):
        for sub in ("checkpoints", "tensorboard"):
            (home / "runs" / run_id / sub).mkdir(parents=True)
            (home / "runs" / run_id / sub / "file").write_text("x")
    fresh = make_server(home=home, TROUPE_RUN_RETENTION_KEEP_LAST="0")
    assert fresh.get("/api/runs")["runs"] == []
    assert not (home / "runs" / done).exists()
    assert (home / "runs" / stuck / "checkpoints" / "file").exists()
    assert not (home / "runs" / stuck / "tensorboard").exists()


def test_delete_keeps_checkpoint_files(make_server, tmp_path):
    home = tmp_path / "del"
    server = make_server(home=home)
    run_id = run_hello(server, 1)[0]
    (home / "runs" / run_id / "checkpoints").mkdir(parents=True)
    (home / "runs" / run_id / "checkpoints" / "last.pt").write_text("weights")
    status, _ = server.client.request("DELETE", f"/api/runs/{run_id}")
    assert status == 200
    assert (home / "runs" / run_id / "checkpoints" / "last.pt").exists()


def test_oversized_output_is_replaced_by_a_marker_naming_its_port(make_server):
    server = make_server(TROUPE_RUN_EVENT_PAYLOAD_CAP_BYTES="200")
    g = graph(node("p", "core.Print", prefix="x" * 1000))
    run_id = server.submit(g)["run_id"]
    events = server.events_until_finished(run_id)
    log = next(e for e in events if e["type"] == "log")
    assert log["payload"]["truncated"] is True and log["payload"]["original_bytes"] > 200
    big = graph(node("a", "core.Constant", value=1.0), node("z", "core.Sleep", seconds=0),
                edges=(edge("a", "value", "z", "x"),))
    run_id = server.submit(big)["run_id"]
    assert server.events_until_finished(run_id)[-1]["payload"]["status"] == "succeeded"


def test_events_pages_are_capped_and_carry_a_cursor(make_server):
    server = make_server(TROUPE_RUN_EVENTS_RESPONSE_CAP_BYTES="600")
    run_id = server.submit(hello())["run_id"]
    total = len(server.events_until_finished(run_id))
    seen, after, pages = [], 0, 0
    while True:
        page = server.get(f"/api/runs/{run_id}/events?after={after}")
        seen.extend(e["seq"] for e in page["events"])
        pages += 1
        if page["next_cursor"] is None:
            break
        after = page["next_cursor"]
    assert pages > 1 and seen == list(range(1, total + 1))
    tail = server.get(f"/api/runs/{run_id}/events?tail=2")
    assert [e["seq"] for e in tail["events"]] == [total - 1, total]


def test_events_cap_zero_disables_the_cap(make_server):
    server = make_server(TROUPE_RUN_EVENTS_RESPONSE_CAP_BYTES="0")
    run_id = server.submit(hello())["run_id"]
    total = len(server.events_until_finished(run_id))
    page = server.get(f"/api/runs/{run_id}/events")
    assert len(page["events"]) == total and page["next_cursor"] is None


def test_a_crash_leaves_runs_interrupted_at_the_next_start(make_server, tmp_path):
    home = tmp_path / "crash"
    server = make_server(home=home, TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="1")
    running = server.submit(sleeper())["run_id"]
    waiting = server.submit(sleeper())["run_id"]
    server.wait_status(running, "running")
    server.kill()
    again = make_server(home=home)
    for run_id in (running, waiting):
        row = again.get(f"/api/runs/{run_id}")
        assert row["status"] == "interrupted"
        events = again.get(f"/api/runs/{run_id}/events")["events"]
        assert events[-1]["type"] == "run_finished" and events[-1]["payload"]["status"] == "interrupted"
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert again.get("/api/queues")["queues"] == []  # nothing resumed by itself


def test_graceful_stop_interrupts_waiting_and_running_runs(make_server, tmp_path):
    home = tmp_path / "graceful"
    server = make_server(home=home, TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="1")
    running = server.submit(sleeper())["run_id"]
    waiting = server.submit(sleeper())["run_id"]
    server.wait_status(running, "running")
    assert server.stop(signal.SIGINT) == 0
    again = make_server(home=home)
    for run_id in (running, waiting):
        events = again.get(f"/api/runs/{run_id}/events")["events"]
        assert events[-1]["payload"]["status"] == "interrupted"
        assert events[-1]["payload"].get("reason") != "server_restart"  # written by the stop itself
    assert again.get(f"/api/runs/{waiting}")["started_at"] is None


def test_troupe_stop_stops_the_server_of_its_home(make_server, tmp_path):
    home = tmp_path / "stopme"
    server = make_server(home=home)
    result = subprocess.run(troupe_cmd("stop"), cwd=REPO, env=base_env(home), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert server.proc.wait(30) == 0
    result = subprocess.run(troupe_cmd("stop"), cwd=REPO, env=base_env(home), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 1 and "no troupe server" in result.stderr


def test_a_second_server_on_the_same_home_is_refused(make_server, tmp_path):
    home = tmp_path / "locked"
    first = make_server(home=home)
    result = subprocess.run(troupe_cmd("start", "--port", "0"), cwd=REPO, env=base_env(home),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert str(first.proc.pid) in result.stderr and first.url in result.stderr


@pytest.mark.timeout(120)
def test_a_database_the_server_cannot_use_is_said_in_one_line(make_server, tmp_path):
    home = tmp_path / "bad"
    make_server(home=home).stop()
    db = home / "troupe.db"
    conn = apsw.Connection(str(db))
    conn.execute("PRAGMA user_version = 99")  # left by a newer troupe
    conn.close()
    for words, damage in [("has schema version 99; this troupe knows up to", None),
                          ("file is not a database", b"not a database " * 300)]:
        if damage is not None:
            for left in home.glob("troupe.db*"):
                left.unlink()
            db.write_bytes(damage)
        result = subprocess.run(troupe_cmd("start", "--port", "0"), cwd=REPO, env=base_env(home),
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 1, result.stderr
        assert f"cannot open the database {db}" in result.stderr and words in result.stderr, result.stderr
        assert "Traceback" not in result.stderr, result.stderr
    (home / "troupe.db").unlink()
    (home / "runs").rename(home / "runs.old")
    (home / "runs").write_text("a file where the runs folder goes")
    result = subprocess.run(troupe_cmd("start", "--port", "0"), cwd=REPO, env=base_env(home),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "cannot make the runs folder" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize(
    "cpu, per_key, want_cpu, want_per_key, warned",
    [("abc", "", 2, {}, True), ("-3", "", 1, {}, False), ("4", "cuda:0=x,cpu=0,junk", 4, {"cpu": 1}, True),
     # A key that is not a device (002) is ignored with a warning, like any malformed entry.
     ("2", "gpu=3,gpu-a/cuda:1=2,gpu-a/tpu=4", 2, {"gpu-a/cuda:1": 2}, True)],
)
def test_settings_edge_values_never_fail_a_start(make_server, cpu, per_key, want_cpu, want_per_key, warned):
    server = make_server(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU=cpu, TROUPE_RUN_QUEUE_MAX_CONCURRENT=per_key)
    limits = server.get("/api/info")["limits"]
    assert limits["run_queue_max_concurrent_cpu"] == want_cpu
    assert limits["run_queue_max_concurrent"] == want_per_key
    assert ("setting ignored" in "".join(server.output)) == warned
    assert server.submit(hello())["status"] == "queued"


def test_a_store_that_keeps_breaking_stops_the_server_with_exit_1(make_server, tmp_path):
    home = tmp_path / "broken"
    server = make_server(home=home)
    db = home / "troupe.db"
    db.unlink()
    db.mkdir()  # the restarted store cannot open it either
    status, reply = server.client.request("POST", "/api/runs", {"graph": hello()})
    assert status == 503 and reply["error"]["code"] == "store_unavailable"
    assert server.proc.wait(60) == 1
    output = server.printed("the control plane failed")  # its last lines may still be in the pipe
    assert "the control plane failed" in output and "store" in output


@pytest.mark.parametrize("choice", ["uvloop", "asyncio"])
def test_the_server_runs_on_the_event_loop_its_setting_names(make_server, choice):
    """uvloop by default (installed with troupe); ``TROUPE_EVENT_LOOP=asyncio`` is the
    standard library's loop, and a run goes through either the same way."""
    server = make_server(**({"TROUPE_EVENT_LOOP": choice} if choice == "asyncio" else {}))
    printed = server.printed("event loop: ")
    assert f"event loop: {choice}" in printed
    run_id = server.submit(hello())["run_id"]
    assert server.events_until_finished(run_id)[-1]["type"] == "run_finished"
    assert server.get(f"/api/runs/{run_id}")["status"] == "succeeded"


# A script that resumes from TROUPE_RESUME_FROM when there is one and writes one checkpoint.
_CHECKPOINTED = ("import os, pathlib; d = pathlib.Path(os.environ['TROUPE_CHECKPOINT_DIR']); "
                 "r = os.environ.get('TROUPE_RESUME_FROM'); r and print('resumed', pathlib.Path(r).read_bytes()); "
                 "d.mkdir(parents=True, exist_ok=True); (d / '.t').write_bytes(b'w1'); "
                 "os.rename(d / '.t', d / 'ck-epoch-1.pt')")


@pytest.mark.timeout(120)
def test_retention_keeps_the_run_a_queued_resume_will_load(make_server):
    server = make_server(TROUPE_RUN_RETENTION_KEEP_LAST="2", TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="1",
                         TROUPE_SIMULATED_ACCELERATORS="cuda:0")
    older = server.submit(hello())["run_id"]
    server.wait_status(older, "succeeded")
    trained = server.submit(graph(node("train", "script.Command", argv=["{python}", "-c", _CHECKPOINTED]),
                                  device="cpu"))["run_id"]
    server.wait_status(trained, "succeeded")
    blocker = server.submit(sleeper(60))["run_id"]
    server.wait_status(blocker, "running")
    status, resumed = server.client.request("POST", f"/api/runs/{trained}/rerun", {"resume": True})
    assert status == 201, resumed
    # A run on another queue ends while the resume waits: the two newest are kept, older ones pruned...
    quick = server.submit(sleeper(0, device="cuda:0"))["run_id"]
    server.wait_status(quick, "succeeded")
    server.wait_until(lambda: server.client.request("GET", f"/api/runs/{older}")[0] == 404)
    # ...but the one whose checkpoint the accepted resume will load.
    assert server.client.request("GET", f"/api/runs/{trained}")[0] == 200
    server.client.request("POST", f"/api/runs/{blocker}/cancel")
    row = server.wait_status(resumed["run_id"], "succeeded")
    assert row["resumed_from"]["run_id"] == trained
    server.wait_until(lambda: server.client.request("GET", f"/api/runs/{trained}")[0] == 404)  # then it goes


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting to be reaped by whoever adopted it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] != b"Z"
    except OSError:
        return False


# A quiet command (it never prints, so no broken pipe ends it) and a process it sets off in a session of its own.
_QUIET = ("import os, pathlib, subprocess, sys, time; "
          "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True); "
          "pathlib.Path(sys.argv[1] + '.tmp').write_text('%d %d' % (os.getpid(), p.pid)); "
          "os.rename(sys.argv[1] + '.tmp', sys.argv[1]); time.sleep(120)")


@pytest.mark.timeout(120)
def test_a_killed_servers_commands_are_stopped_when_it_starts_again(make_server, tmp_path):
    home, said = tmp_path / "orphans", tmp_path / "pids"
    server = make_server(home=home)
    run_id = server.submit(graph(node("quiet", "script.Command", argv=["{python}", "-c", _QUIET, str(said)]),
                                 device="cpu"))["run_id"]
    server.poll_until(said.exists, timeout=60)
    pids = [int(pid) for pid in said.read_text().split()]
    try:
        # The reaper between the server and the command would end its tree once the server
        # is gone: killed first (a power cut of both), nothing stops the command, its group
        # and the process that left it; only the run's mark finds them.
        with open(f"/proc/{pids[0]}/stat") as stat:
            reaper = int(stat.read().rpartition(")")[2].split()[1])
        os.kill(reaper, signal.SIGKILL)
        server.kill()
        assert all(_running(pid) for pid in pids), pids
        fresh = make_server(home=home)
        assert fresh.get(f"/api/runs/{run_id}")["status"] == "interrupted"
        assert not any(_running(pid) for pid in pids), pids  # stopped before the new server answers
    finally:
        for pid in pids:  # a failed check leaves nothing behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(120)
def test_a_kept_queued_run_for_a_card_the_next_start_lacks_is_interrupted_saying_so(make_server, tmp_path):
    home = tmp_path / "cards"
    server = make_server(home=home, TROUPE_SIMULATED_ACCELERATORS="cuda:0,cuda:1", TROUPE_RUN_QUEUE_RESTORE="1",
                         TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="1", TROUPE_CPUS="1")
    busy = [server.submit(sleeper(60, device=device))["run_id"] for device in ("cuda:1", "cpu")]
    for run_id in busy:
        server.wait_status(run_id, "running")
    waiting_card = server.submit(sleeper(0, device="cuda:1"))["run_id"]
    waiting_cpu = server.submit(sleeper(0, device="cpu"))["run_id"]
    # Admitted cut down to this server's one cpu: kept, it is admitted again so, not failed for asking four.
    asks_four = server.submit(graph({**node("z", "core.Sleep", seconds=0), "resources": {"cpus": 4}}))
    assert "cut down to 1" in asks_four["warnings"][0]
    server.kill()
    fresh = make_server(home=home, TROUPE_SIMULATED_ACCELERATORS="cuda:0", TROUPE_RUN_QUEUE_RESTORE="1",
                        TROUPE_CPUS="1")
    row = fresh.get(f"/api/runs/{waiting_card}")
    assert row["status"] == "interrupted" and "this server has no cuda:1 now" in row["error"], row
    assert fresh.wait_status(waiting_cpu, "succeeded")["device"] == "cpu"  # kept, and run
    assert fresh.wait_status(asks_four["run_id"], "succeeded")["status"] == "succeeded"
