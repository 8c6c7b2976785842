"""The in-process executor: one pykka thread actor per executing run.

Its one message, ``Execute``, runs the whole graph in the actor's thread (nodes on a
small pool of their own) and pushes every event into the loop with
``call_soon_threadsafe``, so the RunActor numbers and persists them in order. The
cancel token is a ``threading.Event`` the RunActor sets; node code polls it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from typing import Any

from actors.base import ActorRef
from actors.threaded import ThreadActor
from subprocess_runner.context import ExecutionContext, Sinks
from subprocess_runner.engine import ExecutableGraph, Outcome, execute_graph

log = logging.getLogger("troupe.executor")


@dataclass(frozen=True)
class Execute:
    graph: ExecutableGraph
    run_id: str
    device: str
    seed: int | None
    deterministic: bool
    max_parallel: int
    cancel: threading.Event


@dataclass(frozen=True)
class NodeEvent:
    """An event produced by node code, not yet numbered (sent to the RunActor)."""

    type: str
    node_id: str | None
    payload: dict[str, Any]


@dataclass(frozen=True)
class GraphEnded:
    """The graph stopped executing (sent to the RunActor after its last NodeEvent)."""

    outcome: Outcome


class InProcessExecutor(ThreadActor):
    def __init__(self, name: str, loop: asyncio.AbstractEventLoop, on_exit: Any, run: ActorRef) -> None:
        super().__init__(name, loop, on_exit)
        self._run = run

    def handle(self, message: Any) -> Any:
        if not isinstance(message, Execute):
            raise TypeError(f"executor cannot handle {type(message).__name__}")
        loop, run = self._loop, self._run

        def emit(kind: str, node_id: str | None, payload: dict[str, Any]) -> None:
            loop.call_soon_threadsafe(run.tell, NodeEvent(kind, node_id, payload))

        ctx = ExecutionContext(message.run_id, None, message.device, message.seed, Sinks(emit), message.cancel)
        try:
            outcome = execute_graph(
                message.graph, ctx, max_parallel=message.max_parallel, deterministic=message.deterministic
            )
        except BaseException as exc:  # never let node trouble reach pykka (it would stop every actor)
            log.exception("run %s: the engine failed", message.run_id)
            outcome = Outcome("failed", f"internal error in the engine: {type(exc).__name__}: {exc}")
        loop.call_soon_threadsafe(run.tell, GraphEnded(outcome))
        self.stop()
        return None
