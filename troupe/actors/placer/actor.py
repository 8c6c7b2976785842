"""The placer owns admission: which queue key a run waits on, the interactive lane's
counters, and the seed gate.

The seed gate: a seeded in-process run starts only when no other in-process run
executes, and while it executes no other in-process run starts. Admissions pass the
gate in arrival order, so a seeded run waiting for the process is not starved by
runs that arrive after it. Interactive submissions are never made to wait: a refusal
is an immediate error (HTTP 503) that says why.

Worker runs pass no seed gate (each has a process of its own). Their slots are counted
by one LedgerActor per physical device, which the placer asks through its
WorkerPlacement (``placement.py``); it also places the runs for target ``any``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from troupe.actors.base import Actor, ActorRef, Registry, Shutdown
from troupe.actors.errors import EditorSessionBusy, LaneFull, QueueQuarantined, SeedGateClosed, ShuttingDown
from troupe.actors.placer.book import MOUNT_NEED, WorkerBook, WorkerOffer
from troupe.actors.placer.eligibility import Eligibility, ResolveTarget
from troupe.actors.placer.ledger import Policy
from troupe.actors.placer.messages import (
    Admit,
    Admitted,
    CardMemory,
    CardPolicy,
    Check,
    Reannounce,
    Released,
    RunSpec,
    Submit,
    SubmitSweep,
    WorkerOffline,
    WorkerOnline,
)
from troupe.actors.placer.placement import WorkerPlacement
from troupe.actors.placer.queue import Beside, Enqueue, Occupying, Readmit
from troupe.actors.placer.waiting import Board, Local
from troupe.actors.run_messages import Discard, Placement, Start
from troupe.actors.store import StoreClient
from troupe.actors.store.memory import CardPolicies, LastPeak
from troupe.actors.store.runs import InsertRun, MaxEnqueueSeq
from troupe.actors.store.sweeps import CreateSweep
from troupe.actors.submission import Admission, Submission
from troupe.protocol import events as ev
from troupe.protocol.queue_key import QueueKey
from troupe.protocol.run_record import RunRecord
from troupe.protocol.settings import UPLOAD_LABEL
from troupe.subprocess_runner.engine import ExecutableGraph
from troupe.subprocess_runner.mounts import labels_of
from troupe.subprocess_runner.validation import check_packs_loaded

log = logging.getLogger("troupe.placer")

# A budget from a measured peak leaves this much room above it (001).
PEAK_MARGIN = 1.2

__all__ = [
    "Admit",
    "Admitted",
    "CardMemory",
    "CardPolicy",
    "Check",
    "Placer",
    "Quarantine",
    "Quarantined",
    "Released",
    "ResolveTarget",
    "Restore",
    "RunSpec",
    "Shutdown",
    "Submit",
    "SubmitSweep",
    "WorkerOffline",
    "WorkerOnline",
]


@dataclass(frozen=True)
class Restore:
    """At start, before any submission: the worker runs the last server left executing
    (``adopted``: their queue slots and ledger holds are rebuilt before anything is
    admitted, so no card is double-booked) and the queued runs it kept, in FIFO order."""

    adopted: tuple[RunSpec, ...] = ()
    queued: tuple[RunSpec, ...] = ()


@dataclass(frozen=True)
class Quarantine:
    """The queues supervisor gave up on a key: refuse new runs for it, with a reason."""

    queue_key: str
    reason: str


@dataclass(frozen=True)
class Quarantined:
    """Ask: the quarantined keys and why."""


@dataclass(frozen=True)
class Waiting:
    """Ask: the runs their queue handed on that have not started, with why, and how many
    each queue key has here: ``{"runs": {run_id: {"queue_key", "code", "message"}},
    "held": {queue_key: count}}``; ``runs`` only of ``run_ids`` when given. A run still in
    its queue's line is not here (it waits for one of the queue's slots)."""

    run_ids: frozenset[str] | None = None


@dataclass(frozen=True)
class Predict:
    """Ask: would a run handed on now for ``queue_key`` start at once, by the rules this
    placer applies (the seed gate, the runs already waiting here, a device it shares
    with a same-machine worker, a worker's device)? Replies None, or the reason it would
    wait ``{"code", "message"}`` as a queued run's reason reads."""

    queue_key: str
    seeded: bool = False


@dataclass(frozen=True)
class PlacerView:
    """What a page reads of the placer without an ask: the runs waiting there and why
    (``board.answer()`` is what ``Waiting()`` answers), and the quarantined keys."""

    board: Board
    quarantined: dict[str, str]


class Placer(Actor):
    publishes_view = True
    quiet_messages = frozenset({Waiting, Quarantined, Predict, ResolveTarget, Check})

    def __init__(
        self,
        store: StoreClient,
        registry: Registry,
        *,
        interactive_limit: int,
        spawn_run: Callable[[RunSpec], ActorRef],
        ensure_queue: Callable[[str], ActorRef],
        ensure_ledger: Callable[[str], tuple[ActorRef, bool]],
        local_devices: Mapping[str, tuple[str, int]] | None = None,
        catalog_types: frozenset[str] = frozenset(),
        admission: Admission,
    ) -> None:
        super().__init__("placer")
        self._store = store
        self._registry = registry
        self._interactive_limit = interactive_limit
        self._spawn_run = spawn_run
        self._ensure_queue = ensure_queue
        self._next_seq = 0
        self._executing: set[str] = set()  # in-process runs that passed the gate
        self._seeded: str | None = None  # the seeded run holding the gate
        self._waiting: deque[Admit] = deque()
        self._interactive: dict[str, str | None] = {}  # run id -> editor session
        self._quarantined: dict[str, str] = {}
        # Worker runs pass no seed gate (each has its own process) but need a slot of
        # their device's ledger, as do local runs on a device a same-machine worker shares.
        self._book = WorkerBook()  # the one book of workers, read by eligibility and placement
        fair = admission.settings.queue_order == "fair"
        self._slots = WorkerPlacement(self._book, registry, ensure_ledger, lambda: registry.lookup("placer"),
                                      local_devices, admission.settings.fair_share_half_life_s if fair else None)
        self._types = catalog_types
        self._admission = admission
        self._needs: dict[str, frozenset[str]] = {}  # runs for ``any``: the node types of their graph
        self._eligibility = Eligibility(self._book)
        self._closed = False

    async def on_start(self) -> None:
        self._next_seq = await self._store.read(MaxEnqueueSeq())
        for physical, policy in (await self._store.read(CardPolicies())).items():
            await self._slots.set_policy(physical, Policy(policy["sharing"], policy["reserved_mib"]))
        await self._rebuild()

    async def _rebuild(self) -> None:
        """A restarted placer learns, before it admits anything, what the live runs hold
        (lane counters, the seed gate, slots on ledgers); the worker connections announce
        their workers again and the queues hand on again the runs they admitted, which a
        crash may have lost (a run already started ignores a second start)."""
        runs = [ref for ref in map(self._registry.lookup, self._registry.names("runs/")) if ref is not None]
        facts = await asyncio.gather(*(run.ask(Placement(), timeout=2.0) for run in runs), return_exceptions=True)
        for fact in facts:
            if not isinstance(fact, dict) or fact["released"] or fact["status"] not in (ev.RUNNING, ev.DISCONNECTED):
                continue
            run_id = fact["run_id"]
            if fact["worker"] is None:
                self._executing.add(run_id)
                if fact["seeded"]:
                    self._seeded = run_id
            if fact["lane"] == ev.LANE_INTERACTIVE:
                self._interactive[run_id] = fact["editor_session"]
            if fact["holds"]:
                self._slots.adopt(run_id, tuple(fact["holds"]), fact.get("budget_mib"))
        if runs:
            log.warning("placer started with %d live runs: rebuilt from what they hold", len(runs))
        for prefix, message in (("workers/", Reannounce()), ("queues/", Readmit())):
            for name in self._registry.names(prefix):
                ref = self._registry.lookup(name)
                if ref is not None:
                    ref.tell(message)

    async def receive(self, message: Any) -> Any:
        match message:
            case Submit(submission, attempt):
                record, graph = await self._admission_of(submission)
                return self._submit(record, graph, attempt)
            case SubmitSweep(sweep, variants, submissions):
                rule = submissions[0] if submissions else None
                runs = [await self._admission_of(each, rule) for each in submissions]
                return self._submit_sweep(sweep, variants, runs)
            case Check(submissions):
                offer = self._offer(submissions[0]) if submissions else None
                for each in submissions:
                    self._admission.record(each, offer)
            case ResolveTarget(options, node_types):
                return self._eligibility.resolve(options, node_types)
            case Admit(run_id, key) if run_id in self._executing or self._slots.holds(run_id):
                pass  # handed on again after a restart, and already started
            case Admit(run_id, key):
                if QueueKey.parse(key).provider is not None:
                    # A run for ``any`` needs a worker with its graph's node types (after a
                    # restart of this placer, unknown: one with every type of this server).
                    await self._slots.admit(message, self._needs.get(run_id, self._types))
                else:
                    self._waiting.append(message)
                    await self._drain()
            case WorkerOnline(offer, devices, draining, cards):
                self._book.online(offer, draining)
                await self._slots.online(offer.name, devices, draining, cards)
                for device in devices:  # its devices' lines open with their ledgers, not under their first runs
                    self._ensure_queue(str(QueueKey(offer.name, device)))
            case CardMemory(_, free_mib):
                await self._slots.card_memory(free_mib)
            case CardPolicy(physical, sharing, reserved_mib):
                await self._slots.set_policy(physical, Policy(sharing, reserved_mib))
            case WorkerOffline(name):
                self._book.offline(name)
                await self._slots.offline(name)
                await self._drain()  # local runs waiting for a device the worker shared
            case Restore(adopted, queued):
                self._restore(adopted, queued)
            case Released(run_id):
                await self._release(run_id)
            case Quarantine(key, reason):
                self._quarantined[key] = reason
            case Quarantined():
                return dict(self._quarantined)
            case Waiting(run_ids):
                return self._board().answer(run_ids)
            case Predict(key, seeded):
                return await self._predict(key, seeded)
            case Shutdown(_):
                self._closed = True
                self._waiting.clear()
            case _:
                raise TypeError(f"{self.name} got an unknown message {message!r}")
        return None

    def make_view(self) -> PlacerView:
        return PlacerView(self._board(), dict(self._quarantined))

    def _board(self) -> Board:
        parked, lines, anywhere = self._slots.waiting()
        local = Local(tuple(self._waiting), self._seeded is not None, bool(self._executing))
        return Board(local, parked, lines, anywhere)

    async def _predict(self, key: str, seeded: bool) -> dict[str, str] | None:
        if QueueKey.parse(key).provider is None:  # a local key: the seed gate, then the device
            if not self._gate_allows(seeded) or (seeded and self._waiting):
                return {"code": "seed_gate", "message": "waits for the seed gate: a seeded run executes alone in "
                                                        "this server"}
            if any(admit.queue_key == key for admit in self._waiting):
                return {"code": "device_busy", "message": f"waits behind the runs already waiting for {key}"}
        return await self._slots.predict(key)

    def _restore(self, adopted: tuple[RunSpec, ...], queued: tuple[RunSpec, ...]) -> None:
        for spec in adopted:
            self._spawn_run(spec)
            self._ensure_queue(str(spec.record.queue_key)).tell(Occupying(spec.run_id, spec.record.submitted_by or ""))
            self._slots.adopt(spec.run_id, spec.adoption.holds if spec.adoption is not None else (),
                              spec.record.memory_budget_mib)
        for spec in sorted(queued, key=lambda q: q.record.enqueue_seq):
            self._start_run(spec.record, spec.graph)

    def _offer(self, submission: Submission) -> WorkerOffer | None:
        """What the worker a submission targets offers (None: this server), by the
        target rules, which refuse what cannot or may not go there."""
        options = submission.options
        target = options.target
        if target is None or (target.remote is None and target.pool is None
                              and not {"pool", "worker"} <= target.model_fields_set):  # both: refused, null or not
            return None
        # A node of a pack broken here is that pack's error, not the worker's lack of it.
        check_packs_loaded(submission.graph, self._admission.catalog, submission.prefix)
        return self._eligibility.resolve(options, submission.node_types)

    async def _admission_of(self, submission: Submission, rule: Submission | None = None
                            ) -> tuple[RunRecord, ExecutableGraph]:
        """A submission's record, its memory budget set; ``rule``: the submission whose
        target decides (a sweep's first: its variants share target and node types)."""
        record, graph = self._admission.record(submission, self._offer(rule or submission))
        return await self._memory_budget(record), graph

    async def _memory_budget(self, record: RunRecord) -> RunRecord:
        """A worker run on a card without a declared budget gets one from the last peak
        its graph measured on as many cards (+20%, or more after it ran out of memory
        under such a budget). A run for a named worker's shared card is refused now if it
        could never fit, has no budget, or does not fit now and did not ask to wait."""
        worker, anywhere = record.worker, record.queue_key.pooled
        if record.lane != ev.LANE_QUEUED or (worker is None and not anywhere):
            return record
        cards = sum(1 for device in record.devices if device.startswith("cuda") or device == "auto")
        if record.memory_budget_mib is None and cards and record.graph_digest is not None:
            found = await self._store.read(LastPeak(record.graph_digest, cards))
            if found is not None:
                record = record.with_changes(memory_budget_source="measured", memory_budget_mib=derived_budget(
                    found["peak_mib"], found["failed_budget_mib"]))
        if worker is not None:
            wait = (record.options.get("target") or {}).get("wait")
            await self._slots.check(worker, record.devices, record.memory_budget_mib, wait)
        return record

    def _check_open(self, key: str) -> None:
        if self._closed:
            raise ShuttingDown("the server is stopping; submit the run again after it restarts")
        if key in self._quarantined:
            raise QueueQuarantined(f"queue {key} is quarantined: {self._quarantined[key]}")

    def _submit(self, record: RunRecord, graph: ExecutableGraph, attempt: Mapping[str, Any] | None = None
                ) -> Admitted:
        self._check_open(str(record.queue_key))
        if record.lane == ev.LANE_INTERACTIVE:
            self._check_interactive(record.editor_session, record.seeded)
        self._next_seq += 1
        record = record.with_changes(enqueue_seq=self._next_seq)
        committed = self._store.write(InsertRun(record, {**attempt, "run_id": record.id} if attempt else None))
        self._start_run(record, graph)
        committed.add_done_callback(functools.partial(self._discard_unless_stored, (record.id,)))
        return Admitted(record, committed)

    def _submit_sweep(self, sweep: Mapping[str, Any], variants: tuple[Mapping[str, Any], ...],
                      runs: list[tuple[RunRecord, ExecutableGraph]]
                      ) -> tuple[tuple[RunRecord, ...], asyncio.Future[Any]]:
        for record, _ in runs:
            self._check_open(str(record.queue_key))
        records = []
        for record, _ in runs:
            self._next_seq += 1
            records.append(record.with_changes(enqueue_seq=self._next_seq))
        variants = tuple({**variant, "run_id": record.id} for variant, record in zip(variants, records, strict=True))
        committed = self._store.write(CreateSweep(sweep, variants, tuple(records)))
        for record, (_, graph) in zip(records, runs, strict=True):
            self._start_run(record, graph)
        committed.add_done_callback(functools.partial(self._discard_unless_stored, tuple(r.id for r in records)))
        return tuple(records), committed

    def _discard_unless_stored(self, run_ids: tuple[str, ...], committed: asyncio.Future[Any]) -> None:
        """Runs start before their rows commit (the hot path); runs whose rows could not
        be stored were refused to the submitter, so they go without a trace."""
        if committed.cancelled() or committed.exception() is None:
            return
        for run_id in run_ids:
            run = self._registry.lookup(f"runs/{run_id}")
            if run is not None:
                run.tell(Discard())

    def _start_run(self, record: RunRecord, graph: ExecutableGraph) -> None:
        run_id = record.id
        self._spawn_run(RunSpec(record, graph))
        if record.lane == ev.LANE_INTERACTIVE:
            self._interactive[run_id] = record.editor_session
            if record.submitted_by:
                self._ensure_queue(str(record.queue_key)).tell(Beside(run_id, record.submitted_by))
            self._grant(run_id, record.seeded)
        else:
            if record.queue_key.pooled:  # what a worker must have: node types, storage labels
                document = dict(record.graph)
                self._needs[run_id] = frozenset(str(n["type"]) for n in document.get("nodes", ())) | {
                    f"{MOUNT_NEED}{label}" for label in labels_of(document) - {UPLOAD_LABEL}}
            asked = record.devices if len(record.devices) > 1 else ()
            self._ensure_queue(str(record.queue_key)).tell(Enqueue(run_id, record.enqueue_seq, record.seeded, asked,
                                                                   record.memory_budget_mib, record.duration_s,
                                                                   record.submitted_by or ""))

    def _check_interactive(self, session: str | None, seeded: bool) -> None:
        if len(self._interactive) >= self._interactive_limit:
            raise LaneFull(
                f"{len(self._interactive)} interactive runs are executing, the limit is "
                f"{self._interactive_limit} (TROUPE_RUN_INTERACTIVE_MAX_CONCURRENT); wait for one to finish"
            )
        if session is not None and session in self._interactive.values():
            raise EditorSessionBusy("this editor session already has a run executing; wait for it to finish")
        if self._seeded is not None or any(w.seeded for w in self._waiting):
            raise SeedGateClosed("a seeded run needs the server to itself and is executing or waiting")
        if seeded and (self._executing or self._waiting):
            raise SeedGateClosed(
                f"a seeded run executes alone and {len(self._executing)} in-process runs are executing; "
                "try again when they finish, or submit it to the queue"
            )

    def _gate_allows(self, seeded: bool) -> bool:
        if self._seeded is not None:
            return False
        return not (seeded and self._executing)

    async def _drain(self) -> None:
        """Grants waiting local runs in arrival order. The seed gate is one line for the
        whole process (a waiting seeded run holds back everything behind it), but a run
        waiting for its device's ledger holds back only its own key: independent keys
        never wait on each other (a cpu run waiting for a shared cpu never delays cuda:0)."""
        kept: deque[Admit] = deque()
        blocked: set[str] = set()  # keys whose head waits for its ledger
        while self._waiting and not self._closed:
            head = self._waiting.popleft()
            if self._registry.lookup(f"runs/{head.run_id}") is None:
                continue  # withdrawn while it waited
            if head.queue_key in blocked:
                kept.append(head)
                continue
            if not self._gate_allows(head.seeded):
                kept.append(head)
                break  # retried when a run releases
            if not await self._slots.hold_local(head.run_id, head.queue_key):
                blocked.add(head.queue_key)
                kept.append(head)
                continue
            self._grant(head.run_id, head.seeded)
        kept.extend(self._waiting)
        self._waiting = kept

    def _grant(self, run_id: str, seeded: bool) -> None:
        self._executing.add(run_id)
        if seeded:
            self._seeded = run_id
        run = self._registry.lookup(f"runs/{run_id}")
        if run is None:
            self.ref.tell(Released(run_id))  # withdrawn meanwhile
            return
        run.tell(Start())

    async def _release(self, run_id: str) -> None:
        self._needs.pop(run_id, None)
        await self._slots.release(run_id)
        self._executing.discard(run_id)
        self._interactive.pop(run_id, None)
        if self._seeded == run_id:
            self._seeded = None
        self._waiting = deque(w for w in self._waiting if w.run_id != run_id)
        await self._drain()


def derived_budget(peak_mib: int, failed_budget_mib: int | None) -> int:
    """The budget a measured peak gives: 20% above it, and 20% above a budget that was
    derived the same way and ran out of memory (beyond the seeds). At least 1 MiB: a
    budget of 0 would be no budget at all (and no run frame may carry it)."""
    return max(1, math.ceil(peak_mib * PEAK_MARGIN), math.ceil((failed_budget_mib or 0) * PEAK_MARGIN))
