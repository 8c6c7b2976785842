"""The terminal (issue 27) through a real server and a real agent: what each command prints
and its exit code, as a new user would meet them, and every run's own console output
captured: two concurrent in-process runs and a worker run each keep exactly their own
lines, in order, and ``logs -f`` shows them while the run goes on."""

from __future__ import annotations

import json
import subprocess
import threading

import pytest

from tests.helpers import REPO, base_env, edge, graph, hello, node, sleeper, troupe_cmd
from tests.integration.test_workers_functional import enroll, read_until, start_agent
from troupe.cli.errors import CliError


def troupe(server, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(troupe_cmd(*args), cwd=REPO, env=base_env(server.home), capture_output=True, text=True,
                          timeout=timeout)


def talker(tag: str, pause: float = 0.3) -> dict:
    """Three lines, on stdout, stderr and stdout again, each ``pause`` apart, in that order."""
    return graph(
        node("c", "core.Constant", value=1),
        node("one", "core.Print", prefix=f"{tag}-1 ", stream="stdout"),
        node("wait1", "core.Sleep", seconds=pause),
        node("two", "core.Print", prefix=f"{tag}-2 ", stream="stderr"),
        node("wait2", "core.Sleep", seconds=pause),
        node("three", "core.Print", prefix=f"{tag}-3 ", stream="stdout"),
        edges=(edge("c", "value", "one", "value"), edge("c", "value", "wait1", "x"),
               edge("wait1", "x", "two", "value"), edge("wait1", "x", "wait2", "x"),
               edge("wait2", "x", "three", "value")),
        name=f"talker-{tag}")


def console_of(server, run_id: str) -> str:
    return server.get(f"/api/runs/{run_id}/console")["text"]


def test_each_runs_console_holds_exactly_its_own_lines_in_order(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"])
    try:
        read_until(agent, "connected as gpu-a")
        first, second = (server.submit(talker(tag))["run_id"] for tag in ("A", "B"))
        remote = server.submit(talker("W"), target={"worker": "gpu-a"})["run_id"]
        followed: list[str] = []
        follower = threading.Thread(target=lambda: followed.append(
            troupe(server, "logs", "-f", remote).stdout))
        follower.start()
        for run_id in (first, second, remote):
            assert server.events_until_finished(run_id, timeout=60)[-1]["payload"]["status"] == "succeeded"
        follower.join(60)
        for run_id, tag in ((first, "A"), (second, "B"), (remote, "W")):
            assert console_of(server, run_id) == f"{tag}-1 1.0\n{tag}-2 1.0\n{tag}-3 1.0\n"
        printed = [line for line in followed[0].splitlines() if line.startswith(("[out]", "[err]"))]
        assert printed == ["[out] W-1 1.0", "[err] W-2 1.0", "[out] W-3 1.0"]  # among the node lines, in order
        assert "[node] three finished" in followed[0] and followed[0].splitlines()[-1] == "[run] succeeded"
        console = troupe(server, "logs", first, "--console")
        assert console.returncode == 0 and console.stdout == "A-1 1.0\nA-3 1.0\n" and console.stderr == "A-2 1.0\n"
        page = server.get(f"/api/runs/{first}/console?offset=8")
        assert page["text"] == "A-2 1.0\nA-3 1.0\n" and page["next_offset"] == 24
    finally:
        agent.terminate()
        agent.wait(30)


def test_list_show_wait_cancel_and_remove_from_a_terminal(make_server, tmp_path):
    server = make_server(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="1")
    done = server.submit(hello())["run_id"]
    server.wait_status(done, "succeeded")
    blocker = server.submit(sleeper(60))["run_id"]
    waiting = server.submit(sleeper(60))["run_id"]
    server.wait_status(blocker, "running")

    listed = troupe(server, "ls")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split()[:3] == ["ID", "NAME", "STATUS"]
    assert any(line.startswith(waiting[:8]) and "queued" in line and "#1 in line" in line for line in lines)
    assert any(line.startswith(done[:8]) and "succeeded" in line for line in lines)
    only = json.loads(troupe(server, "ls", "--status", "succeeded", "--json").stdout)
    assert [r["id"] for r in only["runs"]] == [done]
    assert [r["id"] for r in json.loads(troupe(server, "ls", "--search", "sleeper", "--json").stdout)["runs"]] == [
        waiting, blocker]

    shown = troupe(server, "show", done)
    assert shown.returncode == 0 and "Status" in shown.stdout and "succeeded" in shown.stdout
    assert "core.Add" in shown.stdout and "val_loss" in shown.stdout  # its nodes and its metrics
    assert json.loads(troupe(server, "show", done, "--json").stdout)["id"] == done

    assert troupe(server, "wait", done).returncode == 0
    cancelled = troupe(server, "cancel", waiting, blocker)
    assert cancelled.returncode == 0 and f"{waiting}  cancelled" in cancelled.stdout
    assert troupe(server, "wait", blocker, timeout=60).returncode == 1  # it ended, but not succeeded
    removed = troupe(server, "rm", done)
    assert removed.returncode == 0 and server.client.request("GET", f"/api/runs/{done}")[0] == 404


def test_a_bad_id_a_finished_run_cancelled_or_a_running_run_removed_is_refused(make_server):
    server = make_server()
    running = server.submit(sleeper(60))["run_id"]
    finished = server.submit(hello())["run_id"]
    server.wait_status(finished, "succeeded")
    server.wait_status(running, "running")
    for args, words, code in ((("show", "nope"), "not a run id", 2), (("show", "0" * 32), "no run", 1),
                              (("cancel", finished), "already ended", 1),
                              (("rm", running), "cancel it before deleting", 1),
                              (("logs", "0" * 32), "no run", 1), (("attach", "nope"), "not a run id", 2)):
        result = troupe(server, *args)
        assert result.returncode == code and words in result.stderr, (args, result.stdout, result.stderr)
    assert server.get(f"/api/runs/{running}")["status"] == "running"  # nothing changed
    assert server.get(f"/api/runs/{finished}")["status"] == "succeeded"
    server.client.request("POST", f"/api/runs/{running}/cancel")


def test_attach_follows_a_run_to_its_result(make_server):
    server = make_server()
    run_id = server.submit(hello())["run_id"]
    attached = troupe(server, "attach", run_id)
    assert attached.returncode == 0 and "Result          succeeded" in attached.stdout


def test_sweeps_and_studies_from_a_terminal(make_server, tmp_path):
    from tests.integration.test_studies_functional import study_body, variants, wait_state

    server = make_server()
    spec = tmp_path / "sweep.json"
    spec.write_text(json.dumps({
        "base_graph": hello(), "objective": {"metric": "val_loss", "direction": "minimize"},
        "sweep_spec": {"method": "grid", "params": [{"node_id": "a", "param": "value", "values": [1, 2, 3]}]}}))
    started = troupe(server, "sweep", "start", str(spec))
    assert started.returncode == 0, started.stderr
    assert "3/3 done" in started.stdout and "best val_loss=4" in started.stdout
    sweep_id = started.stdout.split()[1]
    assert sweep_id in troupe(server, "sweep", "ls").stdout
    shown = troupe(server, "sweep", "show", sweep_id).stdout.splitlines()
    ranked = [line.split() for line in shown if line[:1].isdigit()]
    assert [row[0] for row in ranked] == ["1", "2", "3"] and ranked[0][3] == "4"  # best first
    csv = tmp_path / "sweep.csv"
    assert troupe(server, "sweep", "csv", sweep_id, "-o", str(csv)).returncode == 0
    assert csv.read_text().splitlines()[0].startswith("index,rank,status")
    unwritable = troupe(server, "sweep", "csv", sweep_id, "-o", str(tmp_path / "no-such-folder" / "x.csv"))
    assert unwritable.returncode == 1 and "cannot write" in unwritable.stderr and "Traceback" not in unwritable.stderr
    assert troupe(server, "sweep", "cancel", sweep_id).returncode == 0

    study_spec = tmp_path / "study.json"
    study_spec.write_text(json.dumps(study_body(variants(1, 2), repeats=1, budget={"max_runs": 1})))
    made = troupe(server, "study", "start", str(study_spec), "--detach")
    assert made.returncode == 0 and "Study" in made.stdout, made.stderr
    study_id = made.stdout.split()[1]
    wait_state(server, study_id, "halted")
    assert "halted" in troupe(server, "study", "show", study_id).stdout
    assert troupe(server, "study", "resume", study_id, "--max-runs", "2").returncode == 0
    wait_state(server, study_id, "finished")
    assert study_id in troupe(server, "study", "ls").stdout
    ended = troupe(server, "study", "cancel", study_id)
    assert ended.returncode == 0 and "finished  (it had ended)" in ended.stdout  # as a cancel of an ended run


def test_a_follow_on_a_terminal_shows_a_live_progress_line_and_plain_lines_when_piped(make_server):
    import os
    import pty

    from tests.integration.test_training_functional import quick_digits

    server = make_server()
    run_id = server.submit(quick_digits(epochs=3))["run_id"]
    leader, follower = pty.openpty()
    attached = subprocess.Popen(troupe_cmd("attach", run_id), cwd=REPO, env=base_env(server.home), stdout=follower,
                                stderr=follower)
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed with the command
            break
        if not chunk:
            break
        seen += chunk
    assert attached.wait(120) == 0
    os.close(leader)
    assert b"\r\x1b[K  \xe2\x8b\xaf trainer  epoch 3/3" in seen  # "⋯ trainer  epoch 3/3", in place
    assert b"ETA" in seen
    piped = troupe(server, "attach", run_id)
    assert "\r" not in piped.stdout and "trainer  epoch 3/3" in piped.stdout


def test_text_someone_else_typed_is_printed_with_its_control_characters_written_out(make_server):
    server = make_server()
    # A name with an escape is refused where a person names things...
    student = server.session(uses=1)
    for path, method, body in (("/api/sessions/me", "PUT", {"name": "\x1b[2Jbob"}),
                               ("/api/runs", "POST", {"graph": hello(), "name": "hi\x1b]52;c;cm0=\x07"})):
        status, reply = student.request(method, path, body)
        assert (status, reply["error"]["pointer"]) == (400, "/name"), reply
        assert "control character" in reply["error"]["message"], reply
    assert student.request("PUT", "/api/sessions/me", {"name": " "})[1]["error"]["message"].endswith(
        "is blank; a name needs a printable character")
    # ...but a graph's own name may hold one: the terminal that lists it shows it written out.
    tricky = hello()
    tricky["name"] = "hi\x1b]52;c;cm0=\x07\x1b[2J"
    run_id = server.submit(tricky)["run_id"]
    server.events_until_finished(run_id)
    for args in (("ls",), ("show", run_id[:8])):
        result = troupe(server, *args)
        assert result.returncode == 0, result.stderr
        assert "\x1b" not in result.stdout and "\x07" not in result.stdout, repr(result.stdout)
        assert "hi\\x1b]52;c;cm0=\\x07\\x1b[2J" in result.stdout, result.stdout


def test_a_stream_refused_is_said_in_the_servers_words(shared_server):
    path = f"/api/runs/{'0' * 32}/stream"
    status, said = shared_server.client.request("GET", path)
    assert status == 404, said
    with pytest.raises(CliError) as refused:
        next(iter(shared_server.client.stream(path)))
    assert refused.value.message.endswith(f"answered 404: {said['error']['code']}: {said['error']['message']}"), \
        refused.value.message


def test_show_gives_the_chain_a_resumed_run_goes_on_from_a_line_each(make_server):
    server = make_server()
    code = ("import os; p = os.path.join(os.environ['TROUPE_CHECKPOINT_DIR'], 'ckpt-3.pt'); "
            "open(p + '.tmp', 'w').write('x'); os.replace(p + '.tmp', p)")
    run_id = server.submit(graph(node("c", "script.Command", argv=["{python}", "-c", code]), name="ck"))["run_id"]
    chain = [run_id]
    for _ in range(2):
        server.wait_status(chain[-1], "succeeded", timeout=60)
        status, again = server.client.request("POST", f"/api/runs/{chain[-1]}/rerun", {"resume": True})
        assert status == 201, again
        chain.append(again["run_id"])
    server.wait_status(chain[-1], "succeeded", timeout=60)
    shown = troupe(server, "show", chain[-1])
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    resumes = next(i for i, line in enumerate(lines) if line.lstrip().startswith("Resumes"))
    assert chain[1] in lines[resumes] and lines[resumes + 1].lstrip().startswith(f"which resumes {chain[0]}"), \
        shown.stdout
