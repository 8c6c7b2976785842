"""The frames between an agent and its run child cross a real pipe intact, and the
module a child imports before it sets its cards brings nothing heavy with it."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys

import pytest

from tests.helpers import REPO
from troupe.protocol import pipe

FRAMES = [pipe.StartRun({"run_id": "r1", "graph": {"nodes": []}}), pipe.CancelRun(), pipe.Dismiss(),
          pipe.Ready(41), pipe.Unfit("CUDA was initialised before a run chose its cards"),
          pipe.ChildEvent(1, "node_finished", "train", {"outputs": {"loss": 0.5}}),
          pipe.ChildEnded(2, "failed", "boom", "train", 12, False)]


@pytest.mark.parametrize("frame", FRAMES, ids=lambda frame: type(frame).__name__)
def test_a_frame_arrives_as_the_same_frame_of_the_same_class(frame):
    ours, theirs = multiprocessing.Pipe()
    ours.send(frame)
    arrived = theirs.recv()
    assert type(arrived) is type(frame) and arrived == frame
    assert not hasattr(arrived, "__dict__")  # slotted


def test_an_event_frame_is_matched_by_position():
    match pipe.ChildEvent(3, "log", None, {"message": "hi"}):
        case pipe.ChildEvent(counter, kind, node_id, payload):
            assert (counter, kind, node_id, payload) == (3, "log", None, {"message": "hi"})


def test_the_pipe_module_imports_nothing_but_the_standard_library():
    code = ("import sys\nbefore = set(sys.modules)\nimport troupe.protocol.pipe\n"
            "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] not in sys.stdlib_module_names))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['troupe', 'troupe.protocol', 'troupe.protocol.pipe']"
