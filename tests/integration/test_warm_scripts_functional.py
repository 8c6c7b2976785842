"""Warm scripts (issue 65, section 6) through the real server and a real agent started
with ``--warm 1``: a ``script.Command`` with ``warm: true`` runs its Python script in a
process forked from the agent's zygote (torch already imported) with its argv, cwd, env,
a process group and descriptors of its own, its metric lines charted; a second run
cannot see a module global or a ``sys.modules`` entry the first one set; a ``setsid``
grandchild is gone after the run and after a cancel; a script's traceback and exit code
are a cold one's. Where no zygote forks it (the server's own process, a run that sets
``resources.env``, an agent whose zygote refused) it starts in a fresh interpreter and
the run says so, with why. A warm argv that is not ``{python} SCRIPT`` is refused."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

import pytest

from tests.helpers import graph, node
from tests.integration.test_command_guards_functional import ESCAPE, grandchild
from tests.integration.test_command_limits_functional import wait_gone
from tests.integration.test_worker_runs_functional import wait_warm
from tests.integration.test_workers_functional import enroll, read_until, start_agent

# Says what it sees into the file argv names; a module global (on torch, which the
# zygote imported, and on a module of its own folder) and a sys.modules entry it sets
# would be there for a second run that kept the first one's state.
PROBE = r'''
import sys
warm = "torch" in sys.modules  # a fresh interpreter has not imported it yet
import json, os
import torch
import helper

seen = {"torch_mark": getattr(torch, "_warm_test_runs", None), "helper_runs": list(helper.RUNS),
        "marker": "_warm_test_marker" in sys.modules}
torch._warm_test_runs = [os.environ["TROUPE_RUN_ID"]]
helper.RUNS.append(1)
sys.modules["_warm_test_marker"] = helper
said = {"warm": warm, "argv": sys.argv, "cwd": os.getcwd(), "name": __name__, "path0": sys.path[0],
        "env": os.environ.get("WARM_TEST"), "run_id": os.environ.get("TROUPE_RUN_ID"),
        "checkpoints": os.environ.get("TROUPE_CHECKPOINT_DIR"), "own_group": os.getpgrp() == os.getpid(),
        "mlflow_run": os.environ.get("MLFLOW_RUN_ID"), "board": os.environ.get("TROUPE_TENSORBOARD_DIR"),
        "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")), "seen": seen,
        "stdin": sys.stdin.read(), "loss": float(torch.ones(2).sum())}
print(json.dumps({"metric": "loss", "value": said["loss"], "step": 1}))
out = sys.argv[1]
with open(out + ".part", "w") as f:
    json.dump(said, f)
os.rename(out + ".part", out)
'''

FAILS = r'''
import sys
def deep():
    raise ValueError("the warm script broke")
print('{"metric": "warm", "value": %d}' % ("torch" in sys.modules), flush=True)
if sys.argv[1] == "raise":
    deep()
sys.exit(int(sys.argv[1]))
'''
# The guards' escape, which here ends at once (exit 42) unless it runs warm.
WARM_ESCAPE = 'import sys\nif "torch" not in sys.modules:\n    sys.exit(42)\n' + ESCAPE


def _events(server, run_id: str) -> list[dict]:
    return server.get(f"/api/runs/{run_id}/events?tail=1000")["events"]


def _fallbacks(server, run_id: str) -> list[str]:
    return [e["payload"]["message"] for e in _events(server, run_id)
            if e["type"] == "warning" and e["payload"].get("code") == "warm_fallback"]


def _probe_graph(lab: Path, said: Path, **params) -> dict:
    return graph(node("train", "script.Command", argv=["{python}", str(lab / "probe.py"), str(said), "--lr", "{lr}"],
                      vars={"lr": 0.5}, cwd=str(lab / "work"), env={"WARM_TEST": "yes"}, warm=True, **params),
                 name="warm")


@pytest.fixture
def lab(tmp_path):
    folder = tmp_path / "lab"
    (folder / "work").mkdir(parents=True)
    (folder / "probe.py").write_text(PROBE)
    (folder / "helper.py").write_text("RUNS = []\n")
    (folder / "fails.py").write_text(FAILS)
    (folder / "escape.py").write_text(WARM_ESCAPE)
    return folder


@pytest.fixture
def warm_worker(make_server, tmp_path, lab):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1", TROUPE_DATA_ROOTS=str(lab))
    agent = start_agent(server, tmp_path / "agent", enroll(server, name="warm")["command"] + " --warm 1",
                        TROUPE_DATA_ROOTS=str(lab), TROUPE_COMMAND_KILL_GRACE_S="0.5")
    try:
        read_until(agent, "connected as warm")
        wait_warm(server, "warm", 1)
        yield server
    finally:
        agent.terminate()
        agent.wait(30)


def _said(server, run_id: str, said: Path) -> dict:
    assert server.wait_status(run_id, "succeeded", timeout=90)["status"] == "succeeded", _events(server, run_id)
    return json.loads(said.read_text())


@pytest.mark.timeout(240)
def test_a_warm_script_runs_with_its_argv_cwd_and_env_and_sees_no_previous_runs_state(warm_worker, lab, tmp_path):
    server = warm_worker
    runs = []
    for turn in (1, 2):
        said = tmp_path / f"said-{turn}.json"
        run_id = server.submit(_probe_graph(lab, said), target={"worker": "warm"})["run_id"]
        runs.append(run_id)
        seen = _said(server, run_id, said)
        assert _fallbacks(server, run_id) == []
        assert seen["warm"] is True  # forked from the zygote: torch was there before the script imported it
        assert seen["argv"] == [str(lab / "probe.py"), str(said), "--lr", "0.5"]
        assert seen["cwd"] == str(lab / "work") and seen["path0"] == str(lab) and seen["name"] == "__main__"
        assert seen["env"] == "yes" and seen["run_id"] == run_id and seen["checkpoints"]
        assert seen["mlflow_run"] == run_id and seen["board"]  # what a cold command is given, readers and all
        assert seen["own_group"] is True and seen["stdin"] == ""
        assert seen["fds"] == [0, 1, 2, 3]  # 3: the folder listdir read; nothing of the zygote's or the agent's
        assert seen["seen"] == {"torch_mark": None, "helper_runs": [], "marker": False}, turn
        points = server.get(f"/api/runs/{run_id}/metrics")["series"]["loss"]
        assert [(p["step"], p["value"]) for p in points] == [(1, 2.0)]
        assert server.get(f"/api/runs/{run_id}")["execution_facts"]["started_warm"] is True


@pytest.mark.timeout(240)
def test_a_warm_scripts_setsid_grandchild_is_gone_after_its_end_and_a_cancel(warm_worker, lab, tmp_path):
    server = warm_worker
    left: list[Path] = []
    try:
        for mode in ("end", "hang"):
            said = tmp_path / f"grandchild-{mode}"
            left.append(said)
            doc = graph(node("job", "script.Command", argv=["{python}", str(lab / "escape.py"), mode, str(said)],
                             warm=True), name="escape")
            run_id = server.submit(doc, target={"worker": "warm"})["run_id"]
            pid = grandchild(server, said)
            if mode == "end":
                said.with_name(said.name + ".go").touch()
                assert server.wait_status(run_id, "succeeded", timeout=60)["status"] == "succeeded"
            else:
                assert server.client.request("POST", f"/api/runs/{run_id}/cancel")[0] == 200
                server.wait_status(run_id, "cancelled", timeout=60)
            wait_gone(server, [pid])
            assert _fallbacks(server, run_id) == []
    finally:
        for path in left:  # nothing outlives the test, whatever it found
            with contextlib.suppress(ValueError, OSError):
                os.kill(int(path.read_text()), signal.SIGKILL)


@pytest.mark.timeout(240)
def test_a_warm_scripts_failure_and_exit_code_are_a_cold_ones(warm_worker, lab):
    server = warm_worker
    doc = graph(node("job", "script.Command", argv=["{python}", str(lab / "fails.py"), "raise"], warm=True))
    run_id = server.submit(doc, target={"worker": "warm"})["run_id"]
    row = server.wait_status(run_id, "failed", timeout=60)
    assert "exited with status 1" in row["error"], row["error"]
    assert "ValueError: the warm script broke" in row["error"], row["error"]
    console = "".join(e["payload"].get("text", "") for e in _events(server, run_id) if e["type"] == "console")
    assert [p["value"] for p in server.get(f"/api/runs/{run_id}/metrics")["series"]["warm"]] == [1.0]
    assert 'fails.py", line 4, in deep' in console and "runpy" not in console and "warm_exec" not in console, console
    doc = graph(node("job", "script.Command", argv=["{python}", str(lab / "fails.py"), "3"], warm=True))
    run_id = server.submit(doc, target={"worker": "warm"})["run_id"]
    assert "exited with status 3" in server.wait_status(run_id, "failed", timeout=60)["error"]
    assert _fallbacks(server, run_id) == []


@pytest.mark.timeout(300)
def test_a_warm_script_starts_cold_and_says_why_where_no_zygote_forks_it(warm_worker, make_server, lab, tmp_path):
    server = warm_worker
    said = tmp_path / "in-process.json"
    run_id = server.submit(_probe_graph(lab, said))["run_id"]  # the server's own process: no zygote there
    seen = _said(server, run_id, said)
    assert seen["warm"] is False and seen["argv"][1:] == [str(said), "--lr", "0.5"] and seen["env"] == "yes"
    (why,) = _fallbacks(server, run_id)
    assert "server's own process" in why and "fresh interpreter" in why, why

    said = tmp_path / "env.json"
    doc = _probe_graph(lab, said)
    doc["nodes"][0]["resources"] = {"env": {"XLA_FLAGS": "--x"}}
    run_id = server.submit(doc, target={"worker": "warm"})["run_id"]
    assert _said(server, run_id, said)["warm"] is False
    (why,) = _fallbacks(server, run_id)
    assert "resources.env" in why, why

    # An agent whose zygote refuses to fork (a thread started while it imported).
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import threading, time\n"
                                           "threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n")
    agent = start_agent(server, tmp_path / "refused", enroll(server, name="refused")["command"] + " --warm 1",
                        machine="refused", TROUPE_DATA_ROOTS=str(lab), PYTHONPATH=str(site))
    try:
        read_until(agent, "cannot fork run children")
        read_until(agent, "cannot fork run children")  # once more: the pool heard the first, and tries again
        said = tmp_path / "refused.json"
        run_id = server.submit(_probe_graph(lab, said), target={"worker": "refused"})["run_id"]
        assert _said(server, run_id, said)["warm"] is False
        (why,) = _fallbacks(server, run_id)
        assert "zygote refused to fork" in why and "threads started while importing" in why, why
    finally:
        agent.terminate()
        agent.wait(30)


@pytest.mark.parametrize(("argv", "where"), [
    (["/bin/echo", "x"], "argv/0"),
    (["{python}", "-c", "print(1)"], "argv/1"),
    (["{python}", "-u", "-X", "dev", "x.py"], "argv/2"),
    (["{python}"], "argv"),
])
def test_a_warm_argv_that_is_not_a_python_script_is_refused(shared_server, argv, where):
    status, reply = shared_server.client.request(
        "POST", "/api/runs", {"graph": graph(node("job", "script.Command", argv=argv, warm=True))})
    assert status == 400 and reply["error"]["pointer"] == f"/graph/nodes/0/params/{where}", reply
