"""A run as it was admitted: the one typed record the placer answers a submission with.

Made once from a validated submission (``troupe/actors/submission.py``), it travels unchanged
to the store (its row's admission columns), the RunActor (which executes it, or sends it
to a worker as its assign frame) and back to the submitter (the HTTP reply). Its target
is resolved once: the queue key parsed, the devices it holds listed. Nothing downstream
derives them again. What happens to a run later (its status, where a pool placed it,
the slots it holds) is the RunActor's state and the store's row, never this record.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from troupe.protocol.queue_key import QueueKey

_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class SharedGraph:
    """A sweep's or a study's variant: the base graph is stored once (its digest and
    text), and the run's own graph column holds only its params over it."""

    digest: str
    text: str
    params: Mapping[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRecord:
    id: str
    name: str | None
    queue_key: QueueKey
    device: str  # the device it executes on; ``auto`` in a pool until it is placed
    devices: tuple[str, ...]  # every device it holds (``target.devices``, or its device)
    lane: str
    graph: Mapping[str, Any]  # the document as stored (as submitted: flavors and labels unresolved)
    options: Mapping[str, Any]
    created_at: str
    enqueue_seq: int = 0  # set by the placer: the queue's FIFO order
    worker: str | None = None  # a named worker; a pool's run gets one when it is placed
    one_shot: bool = False
    editor_session: str | None = None
    seed: int | None = None
    deterministic: bool = False
    record_outputs: bool = False
    warnings: tuple[Any, ...] = ()
    graph_digest: str | None = None
    duration_s: float | None = None
    memory_budget_mib: int | None = None
    memory_budget_source: str | None = None  # "declared", or "measured" from a peak
    sweep_id: str | None = None
    sweep_variant: int | None = None
    study_id: str | None = None
    rerun_of: str | None = None
    resumed_from: Mapping[str, Any] | None = None  # the checkpoints a resumed run continues from
    submitted_by: str | None = None  # the session that submitted it, or "server" (the server's token)
    shared_graph: SharedGraph | None = None
    # Its params of type secret, as "node.param": the store's index of params (what
    # ``where`` and a search read) never holds their values.
    secret_params: tuple[str, ...] = ()

    @property
    def seeded(self) -> bool:
        return self.seed is not None

    @property
    def provenance(self) -> Any:
        return self.options.get("provenance")

    def with_changes(self, **changes: Any) -> RunRecord:
        return dataclasses.replace(self, **changes)

    def columns(self) -> dict[str, Any]:
        """The admission columns of the run's row (the store adds the rest)."""
        row = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in ("devices", "shared_graph", "secret_params")}
        row["queue_key"] = str(self.queue_key)
        row["status"] = "queued"
        row["graph"], row["options"] = dict(self.graph), dict(self.options)
        row["warnings"] = list(self.warnings)
        return row

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> RunRecord:
        """A stored run's record, as it was admitted (a kept queued run, an adopted one)."""
        known = {f.name for f in dataclasses.fields(cls)} - {"queue_key", "devices", "shared_graph", "warnings",
                                                             "one_shot", "options", "secret_params"}
        values = {name: row[name] for name in known if row.get(name) is not None}
        return cls(**values, queue_key=QueueKey.parse(row["queue_key"]), devices=tuple(row["devices"]),
                   warnings=tuple(row.get("warnings") or ()), one_shot=bool(row.get("one_shot")),
                   options=row.get("options") or _EMPTY)


@dataclass(frozen=True, slots=True)
class Adoption:
    """What a run the last server left executing on a worker carries on from."""

    next_seq: int
    worker_counter: int = 0
    holds: tuple[tuple[str, str], ...] = ()
