"""StudyActor: drives one running study through the ordinary run queue.

It looks at the study and its attempts in the store (the durable facts) when something
changed, never on a clock: when it starts, when it is woken (created, resumed), when the
RunActor of one of its attempts tells it that the run's status changed (committed), and
when the nearest budget deadline comes (an attempt's ``max_run_seconds``, the study's
``max_active_seconds``). Then it acts: it stops children past ``max_run_seconds``, halts
past ``max_active_seconds``, starts owed attempts while ``max_parallel_runs`` and
``max_runs`` allow, and halts or finishes. An attempt whose run was ``interrupted`` (a
restart) is owed again, as a new attempt; every attempt started counts against
``max_runs``, across restarts. A halted, finished or cancelled study's actor stops
normally; resume starts a fresh one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from troupe.actors.base import Actor, Registry
from troupe.actors.errors import ShuttingDown, TroupeError
from troupe.actors.placer.actor import Submit
from troupe.actors.resources import read_flavors
from troupe.actors.run_messages import Cancel, RunStatusChanged
from troupe.actors.store import StoreClient
from troupe.actors.store.studies import GetStudy, SetAttemptStatus, UpdateStudy
from troupe.actors.submission import Submission, shared_base
from troupe.protocol import events as ev
from troupe.protocol.api import RunOptions
from troupe.protocol.graph import Graph
from troupe.subprocess_runner.studies import attempt_seed
from troupe.subprocess_runner.sweeps import with_params

log = logging.getLogger("troupe.study")

# The active time is written this often while the study runs (a write, no read): a
# restart loses at most that much of it.
PERSIST_ACTIVE_S = 1.0
_RETRY = frozenset({ev.INTERRUPTED})
_EARLIEST_S = 0.01  # a deadline already past is looked at on the next loop turns
RUNNING = ("running",)  # the study's own state writes: a cancel committed first wins


@dataclass(frozen=True)
class Wake:
    """Something changed (created, resumed): look now."""


@dataclass(frozen=True)
class Stepped:
    """Ask: answers once the study has looked, and started the attempts it owes, since it
    was started or woken (a session's quota holds its turn until those runs are stored)."""


@dataclass(frozen=True)
class _Look:
    """Look at the store now: one look for a burst of changes told together."""


@dataclass(frozen=True)
class _Deadline:
    """The nearest budget deadline came."""


@dataclass(frozen=True)
class _Persist:
    """Time to write the active seconds counted so far."""


class StudyActor(Actor):
    def __init__(self, study_id: str, store: StoreClient, registry: Registry) -> None:
        super().__init__(f"studies/{study_id}")
        self.study_id = study_id
        self._store = store
        self._registry = registry
        self._active: float | None = None  # active seconds, counted from the row
        self._last = time.monotonic()
        self._deadline: asyncio.TimerHandle | None = None
        self._persist: asyncio.TimerHandle | None = None
        self._look_pending = False
        self._alive_after_step = True

    async def on_start(self) -> None:
        self._look()

    async def on_stop(self, reason: str) -> None:
        for timer in (self._deadline, self._persist):
            if timer is not None:
                timer.cancel()

    async def receive(self, message: Any) -> Any:
        match message:
            case Wake() | RunStatusChanged() | _Deadline():
                self._look()
            case Stepped() if not self._look_pending:
                pass  # every look asked for is done
            case _Look() | Stepped():  # a Stepped that came before its look takes the look now
                self._look_pending = False
                await self._step()
                if self._alive_after_step and self._persist is None:
                    self._persist = asyncio.get_running_loop().call_later(PERSIST_ACTIVE_S, self.ref.tell, _Persist())
            case _Persist():
                self._persist = asyncio.get_running_loop().call_later(PERSIST_ACTIVE_S, self.ref.tell, _Persist())
                self._count_active()
                self._store.write(UpdateStudy(self.study_id, {"active_seconds": round(self._active or 0.0, 3)}))
            case _:
                raise TypeError(f"{self.name} got an unknown message {message!r}")
        return None

    def _look(self) -> None:
        if not self._look_pending:
            self._look_pending = True
            self.ref.tell(_Look())

    def _count_active(self) -> None:
        now = time.monotonic()
        if self._active is not None:
            self._active += now - self._last
        self._last = now

    def _wake_at(self, seconds: float | None) -> None:
        """The next look on a clock: the nearest deadline, or none."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if seconds is not None:
            self._deadline = asyncio.get_running_loop().call_later(
                max(seconds, _EARLIEST_S), self.ref.tell, _Deadline())

    async def _step(self) -> None:
        self._alive_after_step = False
        study = await self._store.read(GetStudy(self.study_id))
        if study is None or study["state"] != "running":
            if study is not None and study["state"] == "cancelled":
                # The cancel's own pass saw the attempts of its read; one this actor
                # started meanwhile is stopped here.
                for attempt in study["attempts"]:
                    if attempt["status"] in ev.ACTIVE_STATES:
                        await self._cancel_run(attempt["run_id"], "study_cancelled")
            self.stop_self("not running")
            return
        if self._active is None:
            self._active = float(study["active_seconds"])
            self._last = time.monotonic()
        else:
            self._count_active()
        budget, spec, attempts = study["budget"], study["spec"], study["attempts"]
        in_flight = [a for a in attempts if a["status"] in ev.ACTIVE_STATES]

        limit = budget.get("max_active_seconds")
        if limit is not None and self._active >= limit:
            for attempt in in_flight:
                await self._stop_attempt(attempt, "budget_active_seconds")
            self._halt("budget_active_seconds")
            return
        deadlines = [] if limit is None else [limit - self._active]
        limit = budget.get("max_run_seconds")
        if limit is not None:
            for attempt in in_flight:
                if attempt["run_status"] != ev.RUNNING:
                    continue
                left = limit - _age(attempt["started_at"])
                if left <= 0:
                    await self._stop_attempt(attempt, "budget_run_seconds")
                else:
                    deadlines.append(left)

        owed = self._owed(spec, attempts)
        if not owed and not in_flight:
            finished = {"state": "finished", "active_seconds": round(self._active, 3)}
            self._store.write(UpdateStudy(self.study_id, finished, RUNNING))
            self.stop_self("finished")
            return
        room = len(owed)
        if budget.get("max_parallel_runs") is not None:
            room = min(room, budget["max_parallel_runs"] - len(in_flight))
        left = None if budget.get("max_runs") is None else budget["max_runs"] - len(attempts)
        if left is not None:
            room = min(room, left)
        next_attempt = max((a["attempt"] for a in attempts), default=-1) + 1
        for variant, repeat in owed[: max(room, 0)]:
            try:
                await self._start_attempt(spec, variant, repeat, next_attempt, study["name"])
            except ShuttingDown:
                return  # the next start takes the study up where it is
            except TroupeError as exc:
                # Refused as a single run would be (a flavor edited since, a target worker
                # not back after a restart): nothing would wake a study left running, so
                # it halts and says why; resume tries again.
                self._halt(f"attempt_refused: {exc.code}: {exc}")
                return
            next_attempt += 1
        if left is not None and left <= 0 and owed and not in_flight:
            self._halt("budget_max_runs")
            return
        self._wake_at(min(deadlines, default=None))
        self._alive_after_step = True

    def _owed(self, spec: dict[str, Any], attempts: list[dict[str, Any]]) -> list[tuple[int, int]]:
        latest: dict[tuple[int, int], dict[str, Any]] = {}
        for attempt in attempts:
            latest[(attempt["variant"], attempt["repeat"])] = attempt
        owed = []
        for variant in range(len(spec["variants"])):
            for repeat in range(spec["repeats"]):
                last = latest.get((variant, repeat))
                if last is None or last["status"] in _RETRY:
                    owed.append((variant, repeat))
        return owed

    async def _start_attempt(self, spec: dict[str, Any], variant: int, repeat: int, attempt: int,
                             name: str | None) -> None:
        chosen = spec["variants"][variant]
        base = spec.get("base_graph")
        document = with_params(base, chosen["params"]) if base is not None else chosen["graph"]  # older studies
        graph = Graph.model_validate(document)
        options = RunOptions.model_validate(spec.get("options") or {})
        placer = self._registry.lookup("placer")
        if placer is None:
            return
        # A worker target applies to every attempt, checked as a single run's target is.
        submission = Submission(
            graph, name, options, await read_flavors(self._store, graph, options), "/base_graph",
            seed=attempt_seed(spec.get("seed"), repeat), study_id=self.study_id,
            shared=(shared_base(base), document, chosen["params"]) if base is not None else None,
            submitted_by=spec.get("submitted_by"))
        row = {"study_id": self.study_id, "variant": variant, "repeat": repeat, "attempt": attempt}
        admitted = await placer.ask(Submit(submission, row))
        await admitted.committed

    async def _stop_attempt(self, attempt: dict[str, Any], reason: str) -> None:
        self._store.write(SetAttemptStatus(self.study_id, attempt["attempt"], "over_budget"))
        await self._cancel_run(attempt["run_id"], reason)

    async def _cancel_run(self, run_id: str, reason: str) -> None:
        run = self._registry.lookup(f"runs/{run_id}")
        if run is not None:
            await run.ask(Cancel(reason))

    def _halt(self, reason: str) -> None:
        log.info("study %s halted: %s", self.study_id, reason)
        self._store.write(UpdateStudy(self.study_id, {"state": "halted", "halt_reason": reason,
                                                      "active_seconds": round(self._active or 0.0, 3)}, RUNNING))
        self.stop_self("halted")


def _age(started_at: str | None) -> float:
    if not started_at:
        return 0.0
    started = datetime.fromisoformat(started_at.replace("Z", "+00:00"))
    return (datetime.now(started.tzinfo) - started).total_seconds()
