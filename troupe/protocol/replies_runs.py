"""The parts of a run's answers that have a shape of their own: its progress, its
artifacts, what executed it, where it resumed from and can resume from, why it waits,
and the pages beside it (fingerprint, provenance, outputs). Named so that the OpenAPI
document, and a client generated from it, has a type for each instead of a bare
``object``. ``troupe.protocol.api``'s run rows are made of them, and ``troupe.protocol.replies``
(every other answer) builds on the base here: this module imports nothing of ours but
``troupe.protocol.replies_code`` (the code a run ran, its checkpoints).

Open to fields they do not name (``extra="allow"``): an answer may grow a field without
breaking a generated client, which keeps the extra in its additional properties. The
test of the document closes them (tests/schemathesis_hooks.py): every field the server
sends today is declared."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from troupe.protocol.replies_code import CodeRecord


class _Reply(BaseModel):
    model_config = ConfigDict(extra="allow")


class QueueReason(_Reply):
    """Why a queued run has not started (or would not start now): which limit it waits on."""

    code: Literal["slots_busy", "session_at_limit", "seed_gate", "device_busy", "memory_busy", "memory_budget_required",
                  "worker_offline", "no_free_worker", "one_shot_spent", "job_ends_too_soon", "queue_quarantined"]
    message: str


class Progress(_Reply):
    """A training's place: epoch ``epoch`` of ``epochs``, with the wall times of the first
    epoch it saw end and of the newest (a list estimates the rest from them)."""

    epoch: int | None
    epochs: int | None = None
    first_epoch: int | None = None
    first_at: str
    at: str


class ArtifactRow(_Reply):
    """A file the run wrote and the server keeps (or was refused: ``state``)."""

    id: int
    node_id: str | None
    kind: str = Field(description="checkpoint, file...")
    path: str = Field(description="inside the run's folder")
    backend: str = Field(description="where it lives: local, transfer (sent by a worker), mount, s3")
    label: str | None = None
    size: int | None = None
    sha256: str | None = None
    created_at: str
    state: str | None = Field(default=None, description="stored, pending, failed or removed")
    reason: str | None = Field(default=None, description="why it failed")


class TroupeBuild(_Reply):
    version: str
    commit: str | None


class TorchBuild(_Reply):
    version: str | None
    cuda: str | None


class PackFingerprint(_Reply):
    name: str
    version: str | None = None
    digest: str | None
    source: str | None = Field(default=None, description="folder: a pack loaded from a folder, its files' digest")


class EnvironmentFingerprint(_Reply):
    """What executed a run (schema 2): the code, the interpreter, the platform, torch, the
    packs, the cards it saw and the variables that change results."""

    schema_: int = Field(alias="schema")
    troupe: TroupeBuild
    python: str
    platform: str
    torch: TorchBuild
    packs: list[PackFingerprint]
    accelerators: list[str]
    env: dict[str, str | None]
    code: dict[str, CodeRecord] | None = Field(default=None, description=(
        "the code each command node ran (script.Command), by node id"))


class ExecutionFacts(_Reply):
    """The fingerprint of the process that executed the run, its digest (equal digests:
    equal environments) and which process took it."""

    fingerprint: EnvironmentFingerprint
    fingerprint_digest: str
    fingerprint_source: Literal["control_plane", "run_process"]
    pid: int | None = Field(default=None, description="a worker run's own process")
    started_warm: bool | None = Field(default=None, description="forked from a warm process of its agent")


class ResumedFrom(_Reply):
    """The checkpoint a resumed run continues from."""

    run_id: str
    artifact_id: int
    epoch: int
    sha256: str


class ResumePoint(_Reply):
    """Where an ended run can be resumed from: the epoch (the lowest of its loops'), each
    node's own, and until when the checkpoints are kept."""

    epoch: int
    nodes: dict[str, int]
    until: str


class GroupBest(_Reply):
    """A sweep's or study's best run so far by its objective."""

    metric: str
    value: float | None
    run_id: str


class Differs(_Reply):
    this: Any
    other: Any


class FingerprintAgainst(_Reply):
    """What differs between this run's fingerprint and another's (``a.b`` -> both values)."""

    run_id: str
    fingerprint_digest: str
    fingerprint_source: str
    differs: dict[str, Differs]


class Fingerprint(ExecutionFacts):
    run_id: str
    against: FingerprintAgainst | None = Field(default=None, description="with ?against=")


class ProvenanceRecord(_Reply):
    """One file a node read: by identity (size, mtime) or by content (sha256)."""

    node_id: str | None
    ts: str
    kind: str = Field(description="dataset, checkpoint...")
    ref: str
    mode: Literal["identity", "content"]
    size: int | None = None
    mtime: float | None = None
    sha256: str | None = None
    epoch: int | None = Field(default=None, description="a resumed run's checkpoint: its epoch")
    resume: Literal["weights", "state"] | None = None


class Provenance(_Reply):
    run_id: str
    mode: Literal["identity", "content"] | None
    records: list[ProvenanceRecord]


class RunOutputs(_Reply):
    run_id: str
    record_outputs: bool
    outputs: dict[str, dict[str, Any]] = Field(description="node id -> its outputs by port")


class NodeOutputs(_Reply):
    run_id: str
    node_id: str
    outputs: dict[str, Any] = Field(description="port -> what the node gave")


class GroupStats(_Reply):
    """A series over one group's runs: how many had a newest value, and those values'
    mean, min, max and sample standard deviation (null below two values)."""

    series: str
    runs: int
    mean: float | None
    min: float | None
    max: float | None
    std: float | None


class RunGroupRow(_Reply):
    """One value of ``group_by`` and the runs that have it (null: the runs without it)."""

    value: bool | int | float | str | None = Field(description="the key's value (a boolean param reads 1 or 0)")
    label: str | None = Field(default=None, description="by, sweep, study: the name beside the id")
    runs: int
    metric: GroupStats | None = Field(default=None, description="with metric=SERIES")


class RunGroupList(_Reply):
    """``GET /api/runs?group_by=KEY``: a row per value, by value (null last)."""

    groups: list[RunGroupRow]
    group_by: str = Field(description="the key as read")
    metric: str | None
    next_cursor: str | None


class RunKey(_Reply):
    key: str = Field(description="as where writes it: adam.lr, s.vars.seed, params.lr (a script's log_param), "
                                 "metric.val_loss, metric.val_loss.best")
    kind: Literal["fixed", "param", "var", "logged", "metric", "best"]
    runs: int = Field(description="how many stored runs have it")
    direction: Literal["minimize", "maximize"] | None = Field(
        default=None, description="a series': which way best reads (maximize once an objective says so)")


class NodeTypeCount(_Reply):
    name: str
    runs: int


class RunKeyList(_Reply):
    """``GET /api/runs/keys``: every key a filter can name, and the node types ``type`` takes."""

    keys: list[RunKey]
    types: list[NodeTypeCount]
