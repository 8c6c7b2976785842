"""Messages a RunActor receives from its peers (routes, studies, the placer, queues,
worker connections, the supervisor), and the one it tells its study: all of them here,
once. They live apart from ``run.py`` so that peers send them without importing the
RunActor, which itself sends to worker connections: no import circle."""

from __future__ import annotations

from dataclasses import dataclass

from troupe.protocol import worker as wire


@dataclass(frozen=True)
class Cancel:
    """Ask: stop this run. Queued: removed and cancelled. Running: cooperative stop.
    ``reason`` (``budget_run_seconds``) becomes the run's error."""

    reason: str | None = None


@dataclass(frozen=True)
class ReportOccupancy:
    """A queue restarted: tell it whether this run holds one of its slots."""


@dataclass(frozen=True)
class Abandon:
    """The stop grace ran out and the graph still executes: end the run ``interrupted``
    now, so the record is right even though its thread is left behind."""


@dataclass(frozen=True)
class NeverFits:
    """From the placer: the card the queued run waits for was changed (more reserved) so
    that its budget can never fit there; it fails with the reason, not waits for ever."""

    reason: str


@dataclass(frozen=True)
class Start:
    """From the placer: the run holds a slot and passed the seed gate. For target
    ``any`` the placer names the worker and device it chose. ``holds`` are the
    (provider, physical device) slots it holds, persisted so that a restarted control
    plane rebuilds them before it admits anything."""

    worker: str | None = None
    device: str | None = None
    holds: tuple[tuple[str, str], ...] = ()
    # The shared cards it holds, (device, card total MiB): its budget is its cap on each.
    caps: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Discard:
    """From the placer: the run's row could not be stored (a full disk), so the run was
    refused to its submitter and must leave no trace: it stops, writing nothing."""


@dataclass(frozen=True)
class WorkerGone:
    """The run's worker disconnected; it may come back within the grace."""


@dataclass(frozen=True)
class WorkerBack:
    """The run's worker reconnected and reports the run as its own: it goes on, and the
    agent replays what the control plane had not acknowledged."""

    worker: str


@dataclass(frozen=True)
class WorkerLost:
    """The run's worker stayed away past the grace, or came back without the run: the
    run ends interrupted (``worker_lost``)."""


@dataclass(frozen=True)
class WorkerFailed:
    """The connection actor of ``worker`` kept crashing and was given up on: a run on that
    worker ends interrupted (``worker_failed``); nothing of it could be routed any more."""

    worker: str


@dataclass(frozen=True)
class Placement:
    """Ask, from a restarted placer: what this run holds (lane, gate, slots), so the
    placer rebuilds its counters before it admits anything."""


@dataclass(frozen=True)
class WorkerFrames:
    """Run frames (event, ended, gap) as they came from ``worker``, in order. The RunActor
    drops those whose counter it already applied, and those from a worker the run was
    not assigned to."""

    worker: str
    frames: tuple[wire.RunFrame, ...]


@dataclass(frozen=True)
class ArtifactArrived:
    """Ask, from the route a worker transfers an artifact through: the whole file is in the
    run's folder and its sha256 matched. The reply is the future of the row's write (the
    route answers the worker once it committed), or None when the run is no longer
    executing on ``worker`` (the file is then not the run's to keep)."""

    worker: str
    node_id: str | None
    kind: str
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class RunStatusChanged:
    """To a study's actor, from the RunActor of one of its attempts, once the run's new
    status (running, or an end) is committed: the study looks at the store then, so it
    never polls it, and what it reads already holds the change."""

    run_id: str
    status: str
