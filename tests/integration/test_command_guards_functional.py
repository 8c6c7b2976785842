"""What a ``script.Command`` may not do, through the real server, a real agent and the
CLI: a var that no placeholder uses is refused on a run, a ``--set``, a sweep and a
study (a typo would run the default); its env may not replace what troupe sets, nor its
vars the placeholders troupe fills; an argv past the system's limit is refused at
submission; a process that leaves the command's group and clears its environment is
gone after a cancel, a timeout and the command's end, in-process and on a worker, and
once the server that ran it is killed; a
metric line whose name is not text, or whose value is past a float, is a warning."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from tests.helpers import graph, node
from tests.integration.test_cli_functional import cli
from tests.integration.test_command_limits_functional import wait_gone
from tests.integration.test_command_node_functional import _alive
from tests.integration.test_workers_functional import enroll, read_until, start_agent


def echo(**params) -> dict:
    base = {"argv": ["/bin/echo", "{lr}", "{epochs}"], "vars": {"lr": 0.1, "epochs": 2}}
    return graph(node("train", "script.Command", **{**base, **params}), name="echo")


def refused(server, path: str, body: dict) -> dict:
    status, reply = server.client.request("POST", path, body)
    assert status == 400, (status, reply)
    return reply["error"]


def test_a_var_no_placeholder_uses_is_refused_on_a_run_a_set_a_sweep_and_a_study(make_server, tmp_path):
    server = make_server()
    error = refused(server, "/api/runs", {"graph": echo(vars={"lr": 0.1, "epochs": 2, "lrr": 0.5})})
    assert error["code"] == "graph_invalid" and error["pointer"] == "/graph/nodes/0/params/vars/lrr", error
    assert "argv uses epochs, lr" in error["message"], error
    path = tmp_path / "echo.json"
    path.write_text(json.dumps(echo()))
    typo = cli(server, "run", str(path), "--set", "train.vars.lrr=0.1")
    assert typo.returncode == 2 and "argv uses epochs, lr" in typo.stderr, typo.stdout + typo.stderr
    assert server.get("/api/runs")["runs"] == []  # nothing was submitted
    swept = {"method": "grid", "params": [{"node_id": "train", "param": "vars.lrr", "values": [0.1, 0.2, 0.3]}]}
    objective = {"metric": "loss", "direction": "minimize"}
    error = refused(server, "/api/sweeps", {"base_graph": echo(), "sweep_spec": swept, "objective": objective})
    assert error["code"] == "sweep_invalid" and error["pointer"] == "/sweep_spec/params/0/param", error
    assert "argv uses epochs, lr" in error["message"], error
    # A study's own code, whether its params come as a sweep_spec or as variants.
    error = refused(server, "/api/studies", {"base_graph": echo(), "sweep_spec": swept, "objective": objective})
    assert error["code"] == "study_invalid" and error["pointer"] == "/sweep_spec/params/0/param", error
    assert "argv uses epochs, lr" in error["message"], error
    variants = [{"name": "a", "params": [{"node_id": "train", "param": "vars.lrr", "value": 0.1}]}]
    error = refused(server, "/api/studies", {"base_graph": echo(), "variants": variants, "objective": objective})
    assert error["code"] == "study_invalid" and error["pointer"] == "/variants/0/params/0/param", error
    assert "argv uses epochs, lr" in error["message"], error
    twice = [{"name": "a", "params": [{"node_id": "train", "param": "vars.lr", "value": 0.1}]}] * 2
    error = refused(server, "/api/studies", {"base_graph": echo(), "variants": twice, "objective": objective})
    assert error["code"] == "study_invalid" and error["pointer"] == "/variants/1/name", error
    assert server.get("/api/runs")["runs"] == [] and server.get("/api/sweeps")["sweeps"] == []


@pytest.mark.parametrize(("where", "params"), [
    ("env/TROUPE_RUN_ID", {"env": {"TROUPE_RUN_ID": "0" * 32}}),  # another run's mark
    ("env/TROUPE_CHECKPOINT_DIR", {"env": {"TROUPE_CHECKPOINT_DIR": "/tmp"}}),
    ("env/PYTHONUNBUFFERED", {"env": {"PYTHONUNBUFFERED": "0"}}),
    ("env/OMP_NUM_THREADS", {"env": {"OMP_NUM_THREADS": "64"}}),
    ("env/CUDA_VISIBLE_DEVICES", {"env": {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}}),
    ("env/MLFLOW_RUN_ID", {"env": {"MLFLOW_RUN_ID": "0" * 32}}),  # another run's MLflow run
    ("env/MLFLOW_TRACKING_TOKEN", {"env": {"MLFLOW_TRACKING_TOKEN": "guessed"}}),
    ("vars/seed", {"argv": ["/bin/echo", "{seed}"], "vars": {"seed": 7}}),
    ("vars/run_id", {"argv": ["/bin/echo", "{run_id}"], "vars": {"run_id": "x"}}),
    ("vars/python", {"argv": ["{python}", "-V"], "vars": {"python": "/bin/true"}}),
    ("argv/1", {"argv": ["/bin/echo", "{big}"], "vars": {"big": "x" * 200_000}}),  # one string past Linux's
    ("argv", {"argv": ["/bin/echo", *["{big}"] * (os.sysconf("SC_ARG_MAX") // 100_000 + 1)],
              "vars": {"big": "x" * 100_000}}),  # all of them past ARG_MAX
])
def test_what_troupe_sets_and_what_no_program_can_take_is_refused(shared_server, where, params):
    error = refused(shared_server, "/api/runs", {"graph": echo(**params)})
    assert error["code"] == "graph_invalid" and error["pointer"] == f"/graph/nodes/0/params/{where}", error


_MLFLOW_ENV = "import os; print(sorted(k + '=' + v for k, v in os.environ.items() if k.startswith('MLFLOW_')))"


def _mlflow_env(server, **params) -> tuple[str, list[str]]:
    """The run's id and the MLFLOW_* variables its command saw."""
    command = node("train", "script.Command", argv=[sys.executable, "-c", _MLFLOW_ENV], **params)
    run_id = server.submit(graph(command, name="env"))["run_id"]
    assert server.wait_status(run_id, "succeeded", timeout=60)["status"] == "succeeded"
    events = server.get(f"/api/runs/{run_id}/events?tail=1000")["events"]
    (printed,) = [line for e in events if e["type"] == "console" for line in e["payload"].get("text", "").splitlines()]
    return run_id, sorted(printed.strip("[]").replace("'", "").split(", "))


def test_a_command_with_a_labs_own_tracking_server_gets_no_mlflow_run_or_secret(make_server):
    """MLFLOW_TRACKING_URI stays the command's to set (a lab's own MLflow server): troupe
    then starts no endpoint and gives no run or secret, not even those of the server's
    own environment (a server started inside another MLflow run); without it, troupe's."""
    server = make_server(MLFLOW_RUN_ID="f" * 32, MLFLOW_TRACKING_TOKEN="the-servers")
    _, seen = _mlflow_env(server, env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"})
    assert seen == ["MLFLOW_TRACKING_URI=http://127.0.0.1:9"], seen
    run_id, seen = _mlflow_env(server)
    given = dict(line.split("=", 1) for line in seen)
    assert given["MLFLOW_RUN_ID"] == run_id and given["MLFLOW_TRACKING_TOKEN"] != "the-servers", given
    assert given["MLFLOW_TRACKING_URI"].startswith("http://127.0.0.1:"), given


# Forks a child that leaves the session (setsid) and forks the grandchild, which clears
# its environment (no TROUPE_RUN_ID to be found by) and ignores SIGTERM; the grandchild's
# pid goes to a file. Then the command waits ("hang"), or ends once the test has seen the
# grandchild ("end": the file's .go appears).
ESCAPE = r'''
import os, sys, time
mode, said = sys.argv[1], sys.argv[2]
child = os.fork()
if child == 0:
    os.setsid()
    grandchild = os.fork()
    if grandchild == 0:
        os.execve(sys.executable, [sys.executable, "-c", "import signal, time; "
                  "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"], {})
    with open(said + ".part", "w") as out:
        out.write(str(grandchild))
    os.rename(said + ".part", said)
    os._exit(0)
os.waitpid(child, 0)
deadline = time.monotonic() + (300 if mode == "hang" else 60)
while time.monotonic() < deadline and not os.path.exists(said + ".go"):
    time.sleep(0.05)
'''


@pytest.fixture
def escape(tmp_path):
    script = tmp_path / "escape.py"
    script.write_text(ESCAPE)
    left: list[int] = []

    def command(mode: str, **params) -> tuple[dict, Path]:
        said = tmp_path / f"grandchild-{len(left)}"
        left.append(0)
        doc = graph(node("job", "script.Command", argv=[sys.executable, str(script), mode, str(said)], **params),
                    name="escape")
        return doc, said

    yield command
    for path in tmp_path.glob("grandchild-?"):  # nothing outlives the test, whatever it found
        with contextlib.suppress(ValueError, OSError):
            os.kill(int(path.read_text()), signal.SIGKILL)


def grandchild(server, said) -> int:
    server.poll_until(said.exists, timeout=60)
    pid = int(said.read_text())
    assert _alive(pid), pid
    return pid


def _escapes_are_ended(server, escape, **options) -> None:
    doc, said = escape("hang")
    run_id = server.submit(doc, **options)["run_id"]
    pid = grandchild(server, said)
    assert server.client.request("POST", f"/api/runs/{run_id}/cancel")[0] == 200
    server.wait_status(run_id, "cancelled", timeout=60)
    wait_gone(server, [pid])
    doc, said = escape("hang", timeout_s=2)
    run_id = server.submit(doc, **options)["run_id"]
    pid = grandchild(server, said)
    row = server.wait_status(run_id, "failed", timeout=60)
    assert "ran past its timeout_s" in row["error"], row["error"]
    wait_gone(server, [pid])
    doc, said = escape("end")
    run_id = server.submit(doc, **options)["run_id"]
    pid = grandchild(server, said)
    said.with_name(said.name + ".go").touch()
    assert server.wait_status(run_id, "succeeded", timeout=60)["status"] == "succeeded"
    wait_gone(server, [pid])


@pytest.mark.timeout(180)
def test_a_process_that_left_the_commands_group_is_ended_in_process(make_server, escape):
    server = make_server(TROUPE_COMMAND_KILL_GRACE_S="0.5")
    _escapes_are_ended(server, escape)


@pytest.mark.timeout(240)
def test_a_process_that_left_the_commands_group_is_ended_on_a_worker(make_server, escape, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"], TROUPE_COMMAND_KILL_GRACE_S="0.5")
    try:
        read_until(agent, "connected as gpu-a")
        _escapes_are_ended(server, escape, target={"worker": "gpu-a"})
    finally:
        agent.terminate()
        agent.wait(30)


@pytest.mark.timeout(120)
def test_a_killed_servers_command_is_ended_without_waiting_for_a_restart(make_server, escape):
    server = make_server()
    doc, said = escape("hang")
    server.submit(doc)
    pid = grandchild(server, said)
    server.kill()  # the reaper below the command sees its parent gone
    wait_gone(server, [pid])


ODD_NAMES = r'''
import json
print('{"metric": 123, "value": 1, "step": 1}', flush=True)  # a name that is not text
print('{"metric": "loss", "value": 1e999, "step": 1}', flush=True)  # past a float: Python reads inf
print('{"metric": "loss", "value": -1%s, "step": 2}' % ("0" * 400), flush=True)
print(json.dumps({"metric": "loss", "value": 0.5, "step": 3}), flush=True)
'''


def test_a_metric_line_with_a_name_not_text_or_a_value_past_a_float_is_a_warning(make_server, tmp_path):
    (tmp_path / "odd.py").write_text(ODD_NAMES)
    server = make_server()
    run_id = server.submit(graph(node("job", "script.Command", argv=[sys.executable, str(tmp_path / "odd.py")]),
                                 name="odd"))["run_id"]
    assert server.wait_status(run_id, "succeeded", timeout=60)["status"] == "succeeded"
    series = server.get(f"/api/runs/{run_id}/metrics")["series"]
    assert sorted(series) == ["loss"] and [p["value"] for p in series["loss"]] == [0.5], series
    events = server.get(f"/api/runs/{run_id}/events?tail=1000")["events"]
    warnings = [e["payload"] for e in events if e["type"] == "warning"]
    assert [w["code"] for w in warnings] == ["line_not_read"] * 3, warnings
    assert "name is text, got 123" in warnings[0]["message"], warnings
    assert "1e999 is past what a float holds" in warnings[1]["message"], warnings


ODD_TYPES = r'''
print('{"metric": "loss", "value": "0.25", "step": 1}', flush=True)  # text, not a number
print('{"metric": "loss", "value": true, "step": 2}', flush=True)  # a flag
print('{"metric": "loss", "value": 0.5, "step": "7"}', flush=True)  # a step as text
print('{"metric": "loss", "value": 0.5, "step": 1.5}', flush=True)  # a step between steps
print('{"progress": "3", "total": 10}', flush=True)
print('{"progress": 2.5, "total": 10}', flush=True)
print('{"metric": "loss", "value": 4, "step": 9.0}', flush=True)  # a whole step written as a float
print('{"progress": 4, "total": 10}', flush=True)
'''


def test_a_metric_line_whose_value_or_step_is_not_a_json_number_is_a_warning(make_server, tmp_path):
    """A point is charted where the line says, or not at all: a value or a step given as
    text, a flag, or a step between two steps is a warning, never read as another
    number (the value "0.25" was charted as 0.25, the step "7" at the next step, 1.5 at 1)."""
    (tmp_path / "odd.py").write_text(ODD_TYPES)
    server = make_server()
    run_id = server.submit(graph(node("job", "script.Command", argv=[sys.executable, str(tmp_path / "odd.py")]),
                                 name="odd"))["run_id"]
    assert server.wait_status(run_id, "succeeded", timeout=60)["status"] == "succeeded"
    series = server.get(f"/api/runs/{run_id}/metrics")["series"]
    assert [(p["step"], p["value"]) for p in series["loss"]] == [(9, 4.0)], series
    assert [(p["step"], p["value"]) for p in series["progress"]] == [(4, 0.4)], series
    events = server.get(f"/api/runs/{run_id}/events?tail=1000")["events"]
    warnings = [e["payload"] for e in events if e["type"] == "warning"]
    assert [w["code"] for w in warnings] == ["line_not_read"] * 6, warnings
    assert 'value is a JSON number, got "0.25"' in warnings[0]["message"], warnings
    assert 'step is a whole number, got "7"' in warnings[2]["message"], warnings
