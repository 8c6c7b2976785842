"""A supervisor starts children from specs and decides what happens when one ends.

Restart policies have Erlang's names: ``permanent`` children are always restarted,
``transient`` ones only after a crash, ``temporary`` ones never. More than ``intensity``
restarts of one child within ``period`` seconds and the supervisor gives up on it (a
crash provoked by what one caller asked is restarted but not counted: a client must not
be able to spend the intensity that protects the process):
``on_give_up`` decides whether that quarantines the child (per-kind supervisors) or
escalates (the root's own services). Children stop in reverse start order.

The supervisor knows children only through the small ``Child`` protocol, never their
concrete classes.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, Protocol, TypeVar

log = logging.getLogger("troupe.supervisor")


class Restart(StrEnum):
    PERMANENT = "permanent"
    TRANSIENT = "transient"
    TEMPORARY = "temporary"


class ExitInfo(Protocol):
    name: str
    reason: str
    error: BaseException | None
    provoked: bool  # crashed answering a caller's ask: not counted toward the intensity


class Child(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def is_alive(self) -> bool: ...

    async def wait(self) -> Any: ...

    def on_exit(self, callback: Callable[[Any], None]) -> None: ...

    def stop(self, *args: Any) -> Any: ...


C = TypeVar("C", bound=Child)


@dataclass(frozen=True)
class ChildSpec(Generic[C]):
    name: str
    factory: Callable[[], C]
    restart: Restart = Restart.PERMANENT


class MaxRestartsExceeded(Exception):
    """Raised (as the supervisor's failure) when a child crashed past the intensity limit
    and the supervisor escalates."""

    def __init__(self, supervisor: str, child: str, last: ExitInfo) -> None:
        super().__init__(f"{supervisor}: child {child} crashed too often; last: {last.reason}")
        self.child = child
        self.last = last


class Supervisor(Generic[C]):
    """Children of one kind ``C`` (the root's children are of several: ``Child``)."""

    def __init__(
        self,
        name: str,
        *,
        intensity: int = 5,
        period: float = 10.0,
        on_give_up: Callable[[ChildSpec[C], ExitInfo], None] | None = None,
        on_exit: Callable[[ChildSpec[C], ExitInfo], None] | None = None,
    ) -> None:
        self.name = name
        self.intensity = intensity
        self.period = period
        self._on_give_up = on_give_up
        self._on_exit = on_exit
        self._children: dict[str, C] = {}
        self._restarts: dict[str, deque[float]] = {}
        self._stopping = False
        self.failed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

    def start_child(self, spec: ChildSpec[C]) -> C:
        """Starts ``spec``'s child, replacing the spec of a same-named child that ended."""
        if self._stopping:
            raise RuntimeError(f"supervisor {self.name} is stopping")
        child = spec.factory()
        self._children[spec.name] = child
        # A callback on the child's end, not a task awaiting it: a lab starts a child per
        # run, and a task with a shield for each cost more than the rest of the watch.
        child.on_exit(functools.partial(self._ended, spec, child))
        return child

    def child(self, name: str) -> C | None:
        child = self._children.get(name)
        return child if child is not None and child.is_alive else None

    def children(self) -> list[C]:
        return [c for c in self._children.values() if c.is_alive]

    def _ended(self, spec: ChildSpec[C], child: C, exit_info: ExitInfo) -> None:
        if self._children.get(spec.name) is child:
            del self._children[spec.name]
        if spec.restart == Restart.TEMPORARY:
            self._restarts.pop(spec.name, None)
        if self._on_exit is not None:
            self._on_exit(spec, exit_info)
        if self._stopping:
            return
        crashed = exit_info.error is not None
        if spec.restart == Restart.TEMPORARY or (spec.restart == Restart.TRANSIENT and not crashed):
            return
        if not (exit_info.provoked or self._may_restart(spec.name)):
            log.error("%s: %s exceeded %d restarts in %ss", self.name, spec.name, self.intensity, self.period)
            if self._on_give_up is not None:
                self._on_give_up(spec, exit_info)
            elif not self.failed.done():
                self.failed.set_result(MaxRestartsExceeded(self.name, spec.name, exit_info))
            return
        log.warning("%s: restarting %s after: %s", self.name, spec.name, exit_info.reason)
        try:
            self.start_child(spec)
        except Exception as exc:
            log.exception("%s: restarting %s failed", self.name, spec.name)
            if not self.failed.done():
                self.failed.set_result(exc)

    def _may_restart(self, name: str) -> bool:
        now = time.monotonic()
        history = self._restarts.setdefault(name, deque())
        while history and now - history[0] > self.period:
            history.popleft()
        if len(history) >= self.intensity:
            return False
        history.append(now)
        return True

    def stop_restarting(self) -> None:
        """From now on children that end stay ended (the first step of a graceful stop)."""
        self._stopping = True

    async def stop(self, timeout: float = 10.0) -> None:
        """Stops every child, newest first, waiting up to ``timeout`` for each."""
        self._stopping = True
        for name in reversed(list(self._children)):
            child = self._children.get(name)
            if child is None:
                continue
            result = child.stop()
            if inspect.isawaitable(result):
                await result
            try:
                await asyncio.wait_for(child.wait(), timeout)
            except TimeoutError:
                log.error("%s: %s did not stop within %ss", self.name, name, timeout)
