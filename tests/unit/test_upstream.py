"""A run child's frames go up a real pipe numbered gap-free, several to a pipe message
when they come faster than the pipe takes them, and the end flushes everything first."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import threading

from tests.helpers import REPO
from troupe.protocol import pipe
from troupe.subprocess_runner.upstream import BACKLOG, HOLD_S, Upstream


def read_all(conn) -> list[list[pipe.FromChild]]:
    messages = []
    while True:
        message = conn.recv()
        assert isinstance(message, list) and message
        messages.append(message)
        if isinstance(message[-1], pipe.ChildEnded):
            return messages


def test_events_waiting_behind_a_send_go_together_and_the_end_comes_last():
    agent, child = multiprocessing.Pipe()
    lock = threading.Lock()
    upstream = Upstream(child, lock)
    with lock:  # the pipe is busy: whatever is emitted meanwhile waits in one list
        for step in range(1, 101):
            upstream.event("metric", "t", {"name": "loss", "step": step, "value": float(step)})
    upstream.end("succeeded", None, None, 12, False)
    messages = read_all(agent)
    frames = [frame for message in messages for frame in message]
    assert [f.counter for f in frames] == list(range(1, 102))
    assert [f.payload["step"] for f in frames[:-1]] == list(range(1, 101))
    assert frames[-1] == pipe.ChildEnded(101, "succeeded", None, None, 12, False)
    assert len(messages) <= 3  # the first event alone at most, then the rest, then the end


def test_the_end_sent_from_its_own_thread_follows_a_batch_the_sender_took_first():
    """The end goes into the pipe from the thread that ends the run, not the sender's; a
    batch the sender took before it, still waiting for the pipe, goes first."""
    agent, child = multiprocessing.Pipe()
    lock = threading.Lock()
    upstream = Upstream(child, lock)
    with lock:  # the sender takes the first event and waits for the pipe
        upstream.event("metric", "t", {"name": "loss", "step": 1, "value": 1.0})
        while not agent.poll(0) and not upstream._sending:  # the sender has it in hand
            threading.Event().wait(0.001)
        ender = threading.Thread(target=upstream.end, args=("succeeded", None, None, None, False))
        ender.start()
        ender.join(0.2)
        assert ender.is_alive()  # the end waits for the batch taken before it
    ender.join(10)
    assert [[f.counter for f in message] for message in read_all(agent)] == [[1], [2]]


def test_a_held_frame_waits_for_the_next_one_and_goes_up_with_it():
    agent, child = multiprocessing.Pipe()
    upstream = Upstream(child, threading.Lock())
    upstream.event("environment", None, {"pid": 1}, hold=True)
    assert not agent.poll(HOLD_S / 5)  # nothing goes up alone while it may get company
    upstream.event("node_started", "a", {})
    upstream.event("node_finished", "a", {})
    first = agent.recv()
    assert [(f.counter, f.kind) for f in first] == [(1, "environment"), (2, "node_started"), (3, "node_finished")]
    upstream.end("succeeded", None, None, None, False)
    assert [type(f).__name__ for f in agent.recv()] == ["ChildEnded"]


def test_a_held_frame_with_no_company_goes_up_alone_after_the_hold():
    agent, child = multiprocessing.Pipe()
    upstream = Upstream(child, threading.Lock())
    upstream.event("environment", None, {"pid": 1}, hold=True)
    assert agent.poll(30)
    assert [f.kind for f in agent.recv()] == ["environment"]
    upstream.event("node_started", "a", {})  # later frames are not held
    assert [f.kind for f in agent.recv()] == ["node_started"]
    upstream.end("succeeded", None, None, None, False)
    assert [type(f).__name__ for f in agent.recv()] == ["ChildEnded"]


def test_a_full_backlog_holds_the_emitting_node_until_the_pipe_takes_it():
    agent, child = multiprocessing.Pipe()
    lock = threading.Lock()
    upstream = Upstream(child, lock)
    lock.acquire()
    emitter = threading.Thread(target=lambda: [upstream.event("log", None, {"message": str(i)})
                                               for i in range(2 * BACKLOG + 10)])
    emitter.start()
    emitter.join(timeout=0.5)
    assert emitter.is_alive()  # held back: the sender cannot hand anything to the pipe
    reader = threading.Thread(target=lambda: result.extend(read_all(agent)))
    result: list[list[pipe.FromChild]] = []
    reader.start()
    lock.release()
    emitter.join(timeout=30)
    assert not emitter.is_alive()
    upstream.end("cancelled", None, None, None, False)
    reader.join(timeout=30)
    frames = [frame for message in result for frame in message]
    assert [f.counter for f in frames] == list(range(1, 2 * BACKLOG + 12))


def test_an_event_after_the_end_is_not_sent():
    agent, child = multiprocessing.Pipe()
    upstream = Upstream(child, threading.Lock())
    upstream.event("log", None, {"message": "before"})
    upstream.end("failed", "boom", "n", None, False)
    upstream.event("log", None, {"message": "after"})
    frames = [frame for message in read_all(agent) for frame in message]
    assert [type(f).__name__ for f in frames] == ["ChildEvent", "ChildEnded"]
    assert not agent.poll(0.1)


def test_the_upstream_module_imports_nothing_but_the_standard_library_and_the_pipe():
    code = ("import sys\nbefore = set(sys.modules)\nimport troupe.subprocess_runner.upstream\n"
            "print(sorted(m for m in set(sys.modules) - before\n"
            "             if m.split('.')[0] not in sys.stdlib_module_names and m != '__mp_main__'))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    # (``__mp_main__`` is multiprocessing's alias of the main module.)
    assert result.stdout.strip() == ("['troupe', 'troupe.protocol', 'troupe.protocol.pipe', "
                                     "'troupe.subprocess_runner', 'troupe.subprocess_runner.upstream']")
