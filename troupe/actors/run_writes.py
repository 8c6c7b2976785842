"""A run's writes to the store, in the order its RunActor makes them. A write a full
disk refused is tried again as soon as a write is stored again (the store's ``Room``
says when), until it is stored; meanwhile the run's producer waits (its events settle
only once stored), so a run hit by a full disk pauses, keeps nothing but what is
waiting, loses nothing, and carries on once there is room. A finished run stops only
once every write it made has been (a run is never left active without an owner). A
committed change of status is told to the run's study, if it has one."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from troupe.actors.base import ActorRef, Registry
from troupe.actors.run_messages import RunStatusChanged
from troupe.actors.store import StoreClient
from troupe.actors.store.runs import UpdateRun
from troupe.protocol.errors import DiskFull


@dataclass(frozen=True)
class Unwritten:
    """To the RunActor itself: a write of the run did not fit on a full disk."""

    op: Any


@dataclass(frozen=True)
class RetryWrites:
    """To the RunActor itself: a write was stored since its writes did not fit; time to
    try them again."""


@dataclass(frozen=True)
class Written:
    """To the RunActor itself: every write sent so far has an outcome."""


WriteNote = Unwritten | RetryWrites | Written


class RunWrites:
    """Owned by one RunActor and used on its turn only; what it learns from the store's
    futures comes back as a ``WriteNote`` in the actor's mailbox."""

    def __init__(self, run_id: str, study_id: str | None, store: StoreClient, registry: Registry,
                 ref: ActorRef) -> None:
        self._run_id = run_id
        self._study_id = study_id
        self._store = store
        self._registry = registry
        self._ref = ref
        self.last: asyncio.Future[Any] | None = None  # the newest write's outcome
        self._unwritten: list[Any] = []
        self._retry_scheduled = False
        self._held: list[Callable[[], None]] = []  # producers' settles, held while writes are unwritten
        self._done: Callable[[], None] | None = None  # what to do once all is written
        self._discarded = False

    def send(self, op: Any) -> None:
        if self._discarded:
            return
        self.last = self._store.write(op)
        self.last.add_done_callback(functools.partial(_retry_if_full, self._ref, op))
        if self._study_id and isinstance(op, UpdateRun) and "status" in op.fields:
            self.last.add_done_callback(functools.partial(
                _tell_study, self._registry, self._study_id, RunStatusChanged(self._run_id, op.fields["status"])))

    def discard(self) -> None:
        """The run's row was never stored: nothing more of it is written."""
        self._discarded = True
        self._release_held()

    def after_committed(self, done: Callable[[], None]) -> None:
        """Calls ``done`` once the newest write made so far is committed (at once when
        none is on its way); not when it failed: a worker's frames it carried are then
        replayed by the agent, never acknowledged."""
        last = self.last
        if last is None or last.done():
            done()
        else:
            last.add_done_callback(functools.partial(_if_committed, done))

    def after_settled(self, done: Callable[[], None]) -> None:
        """Calls ``done`` once the newest write made so far is stored, or will never be
        (it failed otherwise than for a full disk, or the run stops writing); at once when
        none is on its way. One a full disk refused holds ``done`` until the writes it
        left unwritten are stored: a run's producer then waits (its events in flight are
        bounded) instead of piling up what the disk has no room for."""
        last = self.last
        if last is None or self._discarded:
            done()
        elif not last.done():
            last.add_done_callback(functools.partial(self._settle, done))
        elif _refused(last) and (self._unwritten or self._retry_scheduled):
            self._held.append(done)
        else:
            done()

    def _settle(self, done: Callable[[], None], future: asyncio.Future[Any]) -> None:
        # After ``_retry_if_full`` of the same write: its ``Unwritten`` is on its way.
        if _refused(future) and not self._discarded:
            self._held.append(done)
        else:
            done()

    def _release_held(self) -> None:
        held, self._held = self._held, []
        for settle in held:
            settle()

    def then(self, done: Callable[[], None]) -> None:
        """Calls ``done`` once every write made so far (and retried) is stored."""
        self._done = done
        self._when_written()

    def handle(self, note: WriteNote) -> None:
        match note:
            case Unwritten(op):
                self._unwritten.append(op)
                if not self._retry_scheduled:
                    self._retry_scheduled = True
                    self._store.room.when_room(functools.partial(self._ref.tell, RetryWrites()))
            case RetryWrites():
                ops, self._unwritten = self._unwritten, []
                self._retry_scheduled = False
                for op in ops:
                    self.send(op)
                self._when_written()
            case Written():
                if self.last is not None and not self.last.done():
                    return  # a retried write is still on its way; its own Written follows
                if not self._unwritten and not self._retry_scheduled:
                    self._release_held()
                    done, self._done = self._done, None
                    if done is not None:
                        done()

    def _when_written(self) -> None:
        if self.last is None:
            self._release_held()
            done, self._done = self._done, None
            if done is not None:
                done()
            return
        self.last.add_done_callback(lambda _: self._ref.tell(Written()))


def _if_committed(done: Callable[[], None], future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and future.exception() is None:
        done()


def _refused(future: asyncio.Future[Any]) -> bool:
    """Whether a done write was refused for a full disk."""
    return not future.cancelled() and isinstance(future.exception(), DiskFull)


def _retry_if_full(ref: ActorRef, op: Any, future: asyncio.Future[Any]) -> None:
    if _refused(future):
        ref.tell(Unwritten(op))


def _tell_study(registry: Registry, study_id: str, change: RunStatusChanged, future: asyncio.Future[Any]) -> None:
    # Only a committed status: one a full disk refused is written again, and told then.
    if future.cancelled() or future.exception() is not None:
        return
    study = registry.lookup(f"studies/{study_id}")
    if study is not None:  # a halted or finished study has no actor, and reads the store when resumed
        study.tell(change)
