"""What the API answers, beside the run models of ``protocol.api``: sweeps, studies,
metrics, workers, the catalog, packs, files, logins and the rest. They state each
answer's shape for the OpenAPI document (and the clients generated from it); the
schemathesis run in CI checks every answer the server gives against them.

Open to fields they do not name (``extra="allow"``): an answer may grow a field without
breaking a generated client, which keeps the extra in its additional properties."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Reply(BaseModel):
    model_config = ConfigDict(extra="allow")


# Sweeps ----------------------------------------------------------------------------
class SweepDomain(_Reply):
    key: str = Field(description="NODE.PARAM")
    node_id: str
    param: str
    values: list[Any]


class SweepVariantQueued(_Reply):
    index: int
    params: dict[str, Any]
    seed: int | None
    run_id: str
    status: str


class SweepCreated(_Reply):
    sweep_id: str
    total_combinations: int
    params: list[SweepDomain]
    variants: list[SweepVariantQueued]


class SweepSummary(_Reply):
    id: str
    name: str | None
    state: str
    total: int
    created_at: str


class SweepList(_Reply):
    sweeps: list[SweepSummary]


class SweepVariant(_Reply):
    index: int
    run_id: str
    status: str
    params: dict[str, Any]
    seed: int | None = None
    objective_value: float | None = None
    rank: int | None = None
    run_exists: bool = True
    final_metrics: dict[str, Any] | None = None


class SweepDetail(_Reply):
    sweep_id: str
    name: str | None
    state: str
    objective: dict[str, Any] | None = None
    total_combinations: int
    counts: dict[str, int]
    params: list[SweepDomain]
    variants: list[SweepVariant]


class SweepCancelled(_Reply):
    sweep_id: str
    state: str
    cancelled: int
    already_finished: int


# Studies ---------------------------------------------------------------------------
class StudySummary(_Reply):
    id: str
    name: str | None
    state: str
    halt_reason: str | None = None
    budget: dict[str, Any]
    created_at: str


class StudyList(_Reply):
    studies: list[StudySummary]


class StudyUse(_Reply):
    runs: int
    active_seconds: float


class StudyAttempt(_Reply):
    variant: str
    repeat: int
    attempt: int
    run_id: str | None = None
    status: str
    objective_value: float | None = None


class StudyDetail(StudySummary):
    """A study's summary and everything else about it."""

    objective: dict[str, Any]
    repeats: int
    variants: list[dict[str, Any]]
    used: StudyUse
    attempts: list[StudyAttempt]
    ranking: list[dict[str, Any]] = Field(description="variants ranked: {variant, params, values, std, "
                                                       "objective_value, repeats, rank}")
    unranked: list[dict[str, Any]]
    plugin_id: str | None = None
    notes: list[dict[str, Any]] = Field(default_factory=list)


class PluginJobRow(_Reply):
    id: str
    plugin_id: str
    kind: str
    idempotency_key: str
    study_id: str | None
    state: str
    created_at: str


class PluginJobList(_Reply):
    jobs: list[PluginJobRow]


# A run's parts ---------------------------------------------------------------------
class MetricPoint(_Reply):
    step: int
    value: float | None
    ts: str
    non_finite: str | None = Field(default=None, description="nan, inf or -inf where value is null")
    run_id: str | None = Field(default=None, description="with lineage=true: the run of the chain it is from")


class RunMetrics(_Reply):
    series: dict[str, list[MetricPoint]]
    resumed: list[dict[str, Any]] | None = Field(
        default=None, description="with lineage=true: where each run of the chain took over ({run_id, from_step})")


class ConsolePage(_Reply):
    text: str
    next_offset: int
    size: int


class RunOutputs(_Reply):
    run_id: str
    record_outputs: bool
    outputs: dict[str, Any]


class NodeOutputs(_Reply):
    run_id: str
    node_id: str


class Provenance(_Reply):
    run_id: str
    mode: str | None
    records: list[dict[str, Any]]


class Fingerprint(_Reply):
    run_id: str
    fingerprint: dict[str, Any] | None


class QueuePrediction(_Reply):
    queue_key: str
    starts: bool
    reason: dict[str, Any] | None


class Deleted(_Reply):
    """What a delete or a revoke answers: the thing's id or name, and that it is gone."""


class ArtifactStored(_Reply):
    run_id: str
    path: str


# Workers ---------------------------------------------------------------------------
class WorkerSlot(_Reply):
    device: str
    limit: int
    running: int


class WorkerRow(_Reply):
    name: str
    state: str = Field(description="connected, disconnected, connecting or failed")
    degraded: bool
    draining: bool
    missing_node_types: list[str]
    version: str | None = None
    machine_id: str | None = None
    cards: list[dict[str, Any]] = Field(default_factory=list)
    slots: list[WorkerSlot] = Field(default_factory=list)
    running_runs: list[str] = Field(default_factory=list)
    heard_s_ago: float | None = None


class WorkerList(_Reply):
    workers: list[WorkerRow]


class Enrollment(_Reply):
    token: str
    command: str


class WorkerCredential(_Reply):
    name: str
    credential: str


class WorkerAdded(_Reply):
    name: str
    state: str


class CardPolicySet(_Reply):
    worker: str
    device: str
    sharing: str


# The server and its catalog --------------------------------------------------------
class Info(_Reply):
    name: Literal["troupe"]
    version: str
    started_at: str
    devices: list[str]
    capabilities: dict[str, Any]
    catalog: dict[str, Any]
    limits: dict[str, Any]


class PortInfo(_Reply):
    name: str
    type: str
    required: bool


class NodeTypeInfo(_Reply):
    type: str
    description: str
    inputs: list[PortInfo]
    outputs: list[PortInfo]
    params: list[dict[str, Any]]
    privileged: bool = False
    resources: dict[str, Any] | None = None


class Catalog(_Reply):
    digest: str
    packs: list[str]
    broken_packs: dict[str, str]
    nodes: list[NodeTypeInfo]


class PackInfo(_Reply):
    name: str
    version: str
    digest: str | None
    source: Literal["installed", "folder"]
    node_types: list[str]


class BrokenPack(_Reply):
    name: str
    error: str


class PackList(_Reply):
    packs: list[PackInfo]
    broken: list[BrokenPack]


class IdMatches(_Reply):
    runs: list[str]
    sweeps: list[str]
    studies: list[str]


class Example(_Reply):
    name: str
    graph: dict[str, Any]


class ExampleList(_Reply):
    examples: list[Example]


class CpuLedgerReply(_Reply):
    cpus: dict[str, Any]


class FileList(_Reply):
    files: list[dict[str, Any]]


class FileStored(_Reply):
    file_id: str
    name: str
    size: int
    sha256: str


class FlavorList(_Reply):
    flavors: list[dict[str, Any]]


# Logging in ------------------------------------------------------------------------
class LoginLink(_Reply):
    id: str
    kind: str
    uses_left: int
    expires_at: float
    created_at: str
    revoked: bool
    sessions: int
    quotas: dict[str, int] | None = Field(default=None, description="limits of the sessions it opens: max_running, "
                                                                    "max_waiting, max_memory_mib")


class LoginLinks(_Reply):
    links: list[LoginLink]


class NewLoginLink(_Reply):
    login_url: str
    kind: str
    quotas: dict[str, int] = Field(default_factory=dict, description="limits of the sessions it opens")


class Sessions(_Reply):
    sessions: list[dict[str, Any]]


class SessionNamed(_Reply):
    id: str
    label: str


class LoggedIn(_Reply):
    kind: str
    id: str
