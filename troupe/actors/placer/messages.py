"""Messages the placer receives from its peers (queues, runs, worker connections) and
from submitters (``Submit``: the one admission conversation). They live apart from
``actor.py`` so that a peer can send them without importing the placer (and the
placer's imports), which keeps the actor modules free of import circles."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from troupe.actors.placer.book import WorkerOffer
from troupe.actors.submission import Submission
from troupe.protocol.run_record import Adoption, RunRecord
from troupe.subprocess_runner.engine import ExecutableGraph


@dataclass(frozen=True)
class Admit:
    """A queue's head has a slot; the placer starts it once the seed gate allows.
    ``devices`` are every device a named-worker run asks for (``target.devices``), empty
    when it asks for its key's device only: admission needs no lookup of its own."""

    run_id: str
    queue_key: str
    seeded: bool
    devices: tuple[str, ...] = ()
    budget_mib: int | None = None  # its memory budget, for a shared card
    duration_s: float | None = None  # how long it is expected to take, for a batch job's agent
    submitter: str = ""  # who submitted it: a device's line is taken in fair order


@dataclass(frozen=True)
class Released:
    """A run's graph ended (or it was withdrawn): its lane counters and gate hold go."""

    run_id: str


@dataclass(frozen=True)
class WorkerOnline:
    """A worker attached (or changed): its parked runs start, in the order they were
    admitted. ``devices`` maps each device it offers to (physical id, slot limit): the
    same physical device offered by several workers is one quota, the smallest limit.
    ``offer`` is what submissions that target it are checked against."""

    offer: WorkerOffer
    devices: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    draining: bool = False
    # Each card's memory as the worker reported it: physical id -> (total, free) MiB.
    cards: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.offer.name


@dataclass(frozen=True)
class CardMemory:
    """A worker's heartbeat changed what its cards have free: physical id -> MiB."""

    worker: str
    free_mib: Mapping[str, int]


@dataclass(frozen=True)
class CardPolicy:
    """A card's sharing policy was stored (``PUT /api/workers/{name}/devices/{device}``)."""

    physical_id: str
    sharing: str
    reserved_mib: int


@dataclass(frozen=True)
class WorkerOffline:
    name: str


@dataclass(frozen=True)
class Reannounce:
    """To a worker connection, from a restarted placer: tell me your worker again."""


@dataclass(frozen=True)
class RunSpec:
    """What a RunActor needs to exist: its record, its graph, and for a run the last
    server left executing on a worker, where it carries on from."""

    record: RunRecord
    graph: ExecutableGraph
    adoption: Adoption | None = None

    @property
    def run_id(self) -> str:
        return self.record.id


@dataclass(frozen=True)
class Submit:
    """Ask, the one admission conversation: validate a submission against its target,
    queue it, and reply ``Admitted``. A refusal is raised to the asker (an
    ``InvalidRequest`` with its pointer, or why the queue cannot take it)."""

    submission: Submission
    # A study's attempt row (without its run id), written in the run's own transaction.
    attempt: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Admitted:
    """The run as admitted, and a future that resolves to its queue position once its
    row is committed (or fails, and the run is gone)."""

    record: RunRecord
    committed: asyncio.Future[Any]


@dataclass(frozen=True)
class SubmitSweep:
    """Ask: validate and queue every variant run of a sweep at once (one target rule for
    all). Replies ``(records, commit_future)``: one transaction stores the sweep, its
    variants (each given its run's id) and its runs."""

    sweep: Mapping[str, Any]
    variants: tuple[Mapping[str, Any], ...]
    submissions: tuple[Submission, ...]


@dataclass(frozen=True)
class Check:
    """Ask: would these submissions be admitted (a study's variants, before it is
    stored)? Raises what ``Submit`` would; queues nothing."""

    submissions: tuple[Submission, ...]
