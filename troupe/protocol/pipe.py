"""The frames of the pipe between a worker agent and one of its run children.

The agent (``troupe.actors.run_process``, ``troupe.actors.warm_pool``) and a run child it spawned or
had its zygote fork (``troupe.subprocess_runner.child``, ``troupe.subprocess_runner.zygote``) are two
processes that talk over a ``multiprocessing.Pipe``; whatever goes in is pickled on one side and rebuilt on the
other. Both sides import the frames from here, so each kind of message has one name and
one shape, and both match on the class (``case ChildEvent(counter, kind, node_id,
payload)``) rather than on the position of a string in a tuple.

Down the pipe, to the child: ``StartRun`` (the run a forked child takes), ``CancelRun``,
``Dismiss`` (a forked child, or the zygote, leaves without a run). Up: the zygote's
``Ready`` or ``Unfit`` once its imports are done; a run child's ``ChildEvent`` frames
and one ``ChildEnded``, in lists: each pipe message carries the
frames that waited together (``troupe.subprocess_runner.upstream``).

A child imports this module before it sets its cards and caps its threads, so it
imports nothing but the standard library. Nothing here is validated: both ends are the
agent's own code, and the control plane validates every frame the agent builds from
these (``troupe.protocol.worker``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

EndStatus: TypeAlias = Literal["succeeded", "failed", "cancelled"]

# Down: agent -> child -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StartRun:
    """A forked child's run (a child started for its run gets ``assign`` as an argument
    instead). ``assign``: the run's assignment as a plain dict (``troupe.protocol.worker.Assign``
    dumped, plus the agent's mounts, control-plane address, DDP CPU ranks and artifact
    outbox)."""

    assign: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CancelRun:
    """Stop the run cooperatively: its nodes see the cancel flag. A kill follows after the
    agent's grace if the child has not exited by then."""


@dataclass(frozen=True, slots=True)
class Dismiss:
    """A forked child, or the zygote itself, is not needed (the pool closes): it exits
    without a run."""


# Up: child -> agent ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ready:
    """The zygote imported torch and the engine and forks children from now on. ``pid``:
    its process id."""

    pid: int


@dataclass(frozen=True, slots=True)
class Unfit:
    """The zygote cannot fork children fit for a run (``problem`` says why: CUDA was
    initialised already, or a thread was started); it exits."""

    problem: str


@dataclass(frozen=True, slots=True)
class ChildEvent:
    """One event of the run. ``counter``: the run's own frame counter, gap-free from 1
    across events and the end (the agent's replay key); ``kind``: the event type
    (``troupe.protocol.events``); ``node_id``: the node it concerns, if any; ``payload``: the
    event's JSON-ready body."""

    counter: int
    kind: str
    node_id: str | None
    payload: dict[str, Any]

    # One per event, so the cheapest pickle: rebuilt from a plain argument tuple, which
    # halves the dataclass default's cost (it pickles a state list and sets each slot).
    def __reduce__(self) -> tuple[type[ChildEvent], tuple[int, str, str | None, dict[str, Any]]]:
        return ChildEvent, (self.counter, self.kind, self.node_id, self.payload)


@dataclass(frozen=True, slots=True)
class ChildEnded:
    """How the run ended, its last frame. ``counter``: the next of the run's counter;
    ``status``: ``EndStatus``; ``error``: why it failed;
    ``node_id``: the node that failed, if one did; ``peak_mib``: the most memory the run
    used (its cards' allocator peak, else the child's resident set; None when the run ends
    before it could be read); ``out_of_memory``: it failed for lack of GPU memory."""

    counter: int
    status: EndStatus
    error: str | None
    node_id: str | None
    peak_mib: int | None
    out_of_memory: bool


ToChild: TypeAlias = StartRun | CancelRun | Dismiss
"""What the agent sends a run child."""

FromChild: TypeAlias = Ready | Unfit | ChildEvent | ChildEnded
"""What a run child sends its agent."""
