"""A failure said once in ``troupe logs``, through the real server, a real agent and the
CLI: a failed script's traceback appears once (its console), not again in the node's
error, its traceback and the run's end; troupe's own frames (the engine, the script
node) only with ``--debug``; a pack node's own frames are shown, troupe's not."""

from __future__ import annotations

from tests.helpers import graph, node
from tests.integration.test_cli_functional import cli
from tests.integration.test_workers_functional import enroll, read_until, start_agent

SCRIPT = '''
def inner():
    raise ValueError("the data is bad")


inner()
'''

PACK = '''
from troupe import node


def _deeper(x):
    raise ValueError("the pack saw a bad value")


@node
def picky(x: float = 1.0) -> float:
    """Fails in its own code."""
    return _deeper(x)
'''


def _failed_script(server, folder, **options) -> str:
    (folder / "bad.py").write_text(SCRIPT)
    run_id = server.submit(graph(node("train", "script.Command", argv=["{python}", str(folder / "bad.py")]),
                                 name="bad"), **options)["run_id"]
    server.wait_status(run_id, "failed", timeout=90)
    return run_id


def _check_once(server, run_id: str) -> None:
    shown = cli(server, "logs", run_id)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert out.count("ValueError: the data is bad") == 1, out
    assert out.count('in inner') == 1 and out.count("Traceback (most recent call last):") == 1, out
    assert "engine.py" not in out and "_script_impl.py" not in out, out
    failed = [line for line in out.splitlines() if line.startswith("[failed] train: ")]
    assert len(failed) == 1 and failed[0].endswith("exited with status 1"), out
    ended = [line for line in out.splitlines() if line.startswith("[run] failed: ")]
    assert len(ended) == 1 and ended[0].endswith("status 1"), out
    debug = cli(server, "logs", run_id, "--debug").stdout
    assert "engine.py" in debug and "_script_impl.py" in debug, debug  # troupe's own frames, asked for
    assert debug.count("ValueError: the data is bad") == 1, debug
    # The run's error still quotes the script's stderr where no console is shown.
    assert "ValueError: the data is bad" in server.get(f"/api/runs/{run_id}")["error"]


def test_a_failed_scripts_traceback_appears_once_in_logs(make_server, tmp_path):
    server = make_server()
    _check_once(server, _failed_script(server, tmp_path))


def test_a_failed_scripts_traceback_appears_once_in_logs_on_a_worker_too(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"])
    try:
        read_until(agent, "connected as gpu-a")
        _check_once(server, _failed_script(server, tmp_path, target={"worker": "gpu-a"}))
    finally:
        agent.terminate()
        agent.wait(30)


def test_a_pack_nodes_own_frames_are_shown_and_troupes_are_not(make_server, tmp_path):
    home = tmp_path / "home"
    (home / "packs").mkdir(parents=True)
    (home / "packs" / "pickypack.py").write_text(PACK)
    server = make_server(home)
    run_id = server.submit(graph(node("p", "pickypack.picky")))["run_id"]
    server.wait_status(run_id, "failed", timeout=60)
    out = cli(server, "logs", run_id).stdout
    lines = out.splitlines()
    assert "[failed] p: ValueError: the pack saw a bad value" in lines, out
    assert "ValueError: the pack saw a bad value" not in lines, out  # the traceback's closing text: said above
    assert "in _deeper" in out and "pickypack.py" in out, out  # the pack's own code
    assert "engine.py" not in out and "node_types.py" not in out, out
    built_in = server.submit(graph(node("f", "core.Fail", message="asked to")))["run_id"]
    server.wait_status(built_in, "failed", timeout=60)
    out = cli(server, "logs", built_in).stdout
    assert out.count("asked to") == 2 and "Traceback" not in out, out  # the node's line and the run's; no frame of ours
