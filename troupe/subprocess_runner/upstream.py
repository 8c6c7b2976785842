"""A run child's frames up the pipe to its agent, numbered and sent by one thread of
their own.

A node that emits fast (a metric per step, a log line per batch) used to pay a pickle
and a pipe write per event, and its agent a read and an unpickle per event: those were
most of what a relayed event cost on the worker's side. Here the node only appends the
event to a list; the sender thread takes everything that waits as one pipe message (a
list of frames). The sender waits ``LINGER_S`` after an event for the rest of its burst;
events coming while a send is under way go together in the next.

The list is bounded (``BACKLOG`` frames): past it, the node waits for the sender, as it
used to wait on a full pipe. It imports nothing but the standard library and
``troupe.protocol.pipe``: the child imports it before it sets its cards.
"""

from __future__ import annotations

import threading
from multiprocessing.connection import Connection
from typing import Any

from troupe.protocol import pipe

# Frames waiting for the sender before an emitting node waits too: about a pipe message
# of metric events, so a stalled agent holds the node back instead of the child's memory.
BACKLOG = 1024
# How long the sender waits after an event for the rest of its burst (a short node's
# start, its logs and its end come within a fraction of a millisecond): each pipe message
# becomes a frame on the link and a message through the control plane, so a run of short
# nodes costs a few of each instead of one per event. Every event waits this long on its
# way (2 ms made a digits training's first epoch on a worker about 2 ms later); a node
# that emits faster than the sender sends batches anyway, while a send is under way.
LINGER_S = 0.0005
# How long a frame sent with ``hold`` waits for the next one (the run's environment
# facts, taken before its graph is loaded, wait for its first node): each frame that
# goes up alone costs the control plane a message, a commit and an acknowledgement.
HOLD_S = 0.25


class Upstream:
    """The run's own frame counter (gap-free from 1: the agent's replay key) and the
    frames not yet handed to the pipe. ``lock``: the pipe's one-writer lock, shared with
    whatever else of the child writes to the same pipe."""

    def __init__(self, conn: Connection, lock: threading.Lock) -> None:
        self._conn = conn
        self._pipe_lock = lock
        self._cond = threading.Condition(threading.Lock())
        self._waiting: list[pipe.FromChild] = []
        self._counter = 0
        self._closed = False  # the end was queued, or the pipe broke: nothing more is taken
        self._held = False  # what waits is only frames sent with ``hold``
        self._sending = False  # the sender took a batch and has not put it in the pipe yet
        self._sender = threading.Thread(target=self._send_all, name="upstream", daemon=True)
        self._sender.start()

    def event(self, kind: str, node_id: str | None, payload: dict[str, Any], hold: bool = False) -> None:
        """``hold``: a frame nobody watches for, which waits up to ``HOLD_S`` for the next
        one to go up with it."""
        with self._cond:
            while len(self._waiting) >= BACKLOG and not self._closed:
                self._cond.wait()
            if self._closed:
                return  # the run has ended (or its agent is gone): a late event has no reader
            self._counter += 1
            self._waiting.append(pipe.ChildEvent(self._counter, kind, node_id, payload))
            if len(self._waiting) == 1 or self._held:
                self._held = hold and len(self._waiting) == 1
                self._cond.notify_all()

    def end(self, status: pipe.EndStatus, error: str | None, node_id: str | None, peak_mib: int | None,
            out_of_memory: bool) -> None:
        """Sends the run's last frame, with whatever still waits, and returns once every
        frame is in the pipe (the process may exit right after). Sent from this thread:
        handing it to the sender would cost a switch between threads on the way out; a
        batch the sender took before is in the pipe first (the pipe's lock)."""
        batch: list[pipe.FromChild] = []
        with self._cond:
            while self._sending:  # a batch taken before this one goes into the pipe first
                self._cond.wait()
            if not self._closed:
                self._counter += 1
                self._waiting.append(pipe.ChildEnded(self._counter, status, error, node_id, peak_mib,
                                                     out_of_memory))
                self._closed = True
                batch, self._waiting = self._waiting, []
                self._cond.notify_all()  # the sender finds nothing left and ends
        if batch:
            try:
                with self._pipe_lock:
                    self._conn.send(batch)
            except OSError:  # the agent is gone: nobody reads the end
                pass

    def _send_all(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if self._held and not self._closed:
                    self._cond.wait(HOLD_S)  # until the next frame comes (then its burst)
                    self._held = False
                if not self._closed and len(self._waiting) < BACKLOG:
                    self._cond.wait(LINGER_S)  # the rest of a burst goes with its first event
                if not self._waiting:
                    return
                batch, self._waiting, self._sending = self._waiting, [], True
                self._cond.notify_all()  # a node waiting on a full backlog goes on
            try:
                with self._pipe_lock:
                    self._conn.send(batch)
            except OSError:  # the agent is gone: the cancel listener stops the run
                with self._cond:
                    self._closed, self._waiting, self._sending = True, [], False
                    self._cond.notify_all()
                return
            with self._cond:
                self._sending = False
                self._cond.notify_all()  # the end, waiting for this batch to go first
