"""TensorBoard through the real server and a real agent: a script that logs with torch's
``SummaryWriter`` (its default ``./runs/`` and ``TROUPE_TENSORBOARD_DIR``) has its scalars
charted while it runs, with their steps and wall times, in-process and on a worker; the
digits training's ``TrainingLoop`` writes its losses as event files in its run's folder
(a worker's travel to the control plane as the run's artifacts), which a delete and
retention remove with the run."""

from __future__ import annotations

import time
from importlib.util import find_spec
from pathlib import Path

import pytest

from tests.helpers import graph, node
from tests.integration.test_training_functional import quick_digits
from tests.integration.test_workers_functional import enroll, read_until, start_agent

pytestmark = pytest.mark.skipif(find_spec("tensorboard") is None,
                                reason="the tensorboard package is not installed (pip install 'troupe[tensorboard]')")

SCRIPT = r'''
import os, sys, time
from torch.utils.tensorboard import SummaryWriter

go = sys.argv[1]
default = SummaryWriter()  # ./runs/<when>_<host>/ in its folder, the run's
given = SummaryWriter(os.environ["TROUPE_TENSORBOARD_DIR"])
for step in range(1, 4):
    default.add_scalar("loss", 1.0 / step, step)
    given.add_scalar("accuracy", step / 10, step)
default.flush()
given.flush()
deadline = time.monotonic() + 60
while not os.path.exists(go):  # until the test saw the points charted while this runs
    if time.monotonic() > deadline:
        sys.exit("never told to go on")
    time.sleep(0.05)
default.add_scalar("loss", 0.125, 4)
default.close()
given.close()
'''


def _script_graph(folder: Path) -> dict:
    (folder / "tb.py").write_text(SCRIPT)
    return graph(node("train", "script.Command", argv=["{python}", str(folder / "tb.py"), str(folder / "go")]),
                 name="tensorboard")


def _points(server, run_id: str, name: str) -> list[tuple[int, float]]:
    series = server.get(f"/api/runs/{run_id}/metrics")["series"].get(name, [])
    return [(p["step"], p["value"]) for p in series]


def _charts_live(server, folder: Path, **options) -> str:
    run_id = server.submit(_script_graph(folder), **options)["run_id"]
    server.poll_until(lambda: [len(_points(server, run_id, name)) for name in ("loss", "accuracy")] == [3, 3],
                      timeout=90)
    assert server.get(f"/api/runs/{run_id}")["status"] == "running"  # read as the file grew, not at the end
    (folder / "go").touch()
    assert server.wait_status(run_id, "succeeded", timeout=60)["status"] == "succeeded"
    loss = _points(server, run_id, "loss")
    assert [step for step, _ in loss] == [1, 2, 3, 4]
    assert [value for _, value in loss] == pytest.approx([1.0, 0.5, 1 / 3, 0.125], rel=1e-6)  # float32 in the file
    assert _points(server, run_id, "accuracy") == [(1, pytest.approx(0.1)), (2, pytest.approx(0.2)),
                                                   (3, pytest.approx(0.3))]
    events = server.get(f"/api/runs/{run_id}/events?tail=1000")["events"]
    walls = [e["payload"]["wall_time"] for e in events if e["type"] == "metric" and e["payload"]["name"] == "loss"]
    assert len(walls) == 4 and walls == sorted(walls) and abs(walls[-1] - time.time()) < 600, walls
    warnings = [e["payload"] for e in events if e["type"] == "warning"]
    assert warnings == [], warnings
    return run_id


def test_a_summary_writer_scripts_points_are_charted_as_it_runs_in_process(make_server, tmp_path):
    server = make_server()
    run_id = _charts_live(server, tmp_path)
    folder = server.home / "runs" / run_id
    assert list((folder / "runs").rglob("*tfevents*")) and list((folder / "tensorboard").rglob("*tfevents*"))


def test_a_summary_writer_scripts_points_are_charted_as_it_runs_on_a_worker(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"])
    try:
        read_until(agent, "connected as gpu-a")
        run_id = _charts_live(server, tmp_path, target={"worker": "gpu-a"})
        assert server.get(f"/api/runs/{run_id}")["worker"] == "gpu-a"
    finally:
        agent.terminate()
        agent.wait(30)


def _scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """What TensorBoard itself reads from the event files under ``folder``."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    found: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(folder.rglob("*tfevents*")):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                found.setdefault(value.tag, []).append((event.step, float(tensor_util.make_ndarray(value.tensor))))
    return found


def _check_board(server, run_id: str, folder: Path) -> None:
    written = _scalars(folder)
    for name in ("train_loss", "val_loss", "val_accuracy"):
        charted = _points(server, run_id, name)
        assert [step for step, _ in written[name]] == [step for step, _ in charted] == [1, 2], (name, written)
        assert [value for _, value in written[name]] == pytest.approx([value for _, value in charted], rel=1e-6)
    listed = [a for a in server.get(f"/api/runs/{run_id}")["artifacts"] if a["kind"] == "tensorboard"]
    assert [a["state"] for a in listed] == ["stored"] and listed[0]["path"].startswith("tensorboard/trainer/"), listed


@pytest.mark.timeout(240)
def test_a_training_loop_writes_its_losses_as_event_files_that_go_with_its_run(make_server):
    server = make_server(TROUPE_RUN_RETENTION_KEEP_LAST="1")
    first = server.submit(quick_digits(epochs=2))["run_id"]
    assert server.wait_status(first, "succeeded", timeout=120)["status"] == "succeeded"
    board = server.home / "runs" / first / "tensorboard" / "trainer"
    _check_board(server, first, board)
    second = server.submit(quick_digits(epochs=2, checkpoint_every=1))["run_id"]
    assert server.wait_status(second, "succeeded", timeout=120)["status"] == "succeeded"
    server.poll_until(lambda: not board.exists(), timeout=30)  # retention took the first run, folder and all
    folder = server.home / "runs" / second
    _check_board(server, second, folder / "tensorboard" / "trainer")
    assert server.client.request("DELETE", f"/api/runs/{second}")[0] == 200
    assert not (folder / "tensorboard").exists()  # a delete removes them too
    assert list((folder / "checkpoints").glob("*.pt"))  # and keeps the checkpoints, as a delete does


@pytest.mark.timeout(240)
def test_a_training_loops_event_files_travel_from_its_worker(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"])
    try:
        read_until(agent, "connected as gpu-a")
        run_id = server.submit(quick_digits(epochs=2), target={"worker": "gpu-a"})["run_id"]
        assert server.wait_status(run_id, "succeeded", timeout=180)["status"] == "succeeded"
        folder = server.home / "runs" / run_id / "tensorboard" / "trainer"
        server.poll_until(lambda: any(a["kind"] == "tensorboard" and a["state"] == "stored"
                                      for a in server.get(f"/api/runs/{run_id}")["artifacts"]), timeout=60)
        _check_board(server, run_id, folder)
    finally:
        agent.terminate()
        agent.wait(30)
