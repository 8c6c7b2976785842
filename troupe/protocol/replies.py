"""What the API answers, beside the run models of ``troupe.protocol.api``: sweeps, studies,
metrics, workers, the catalog, packs, files, logins and the rest. They state each
answer's shape for the OpenAPI document (and the clients generated from it); the
schemathesis run in CI checks every answer the server gives against them.

Open to fields they do not name (``extra="allow"``): an answer may grow a field without
breaking a generated client, which keeps the extra in its additional properties."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from troupe.protocol.flavors import Flavor
from troupe.protocol.graph import NodeResources
from troupe.protocol.replies_runs import QueueReason, _Reply
from troupe.protocol.studies import Budget, StudyObjective
from troupe.protocol.sweeps import Objective


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
    submitted_by: str | None = Field(default=None, description="the session that started it (server: the server's "
                                                               "token; null: not recorded, the teacher's)")


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
    final_metrics: dict[str, float | None] | None = Field(
        default=None, description="each series' final value (null: not finite), once the run ended")


class SweepDetail(_Reply):
    sweep_id: str
    name: str | None
    state: str
    objective: Objective | None = None
    total_combinations: int
    counts: dict[str, int] = Field(description="its runs by status")
    params: list[SweepDomain]
    variants: list[SweepVariant] = Field(description="ranked first, best first; then the unranked")
    best: SweepVariant | None = Field(default=None, description="the variant ranked first, once one is")
    created_at: str
    objective_warning: str | None = Field(default=None, description="a finished sweep whose runs never recorded "
                                                                    "the objective: what each recorded")
    submitted_by: str | None = Field(default=None, description="the session that started it (server: the server's "
                                                               "token; null: not recorded, the teacher's)")


class SweepVariantState(_Reply):
    index: int
    run_id: str
    status: str


class SweepCancelled(_Reply):
    sweep_id: str
    state: str
    cancelled: int
    already_finished: int
    variants: list[SweepVariantState] = Field(default_factory=list)


# Studies ---------------------------------------------------------------------------
class StudySummary(_Reply):
    id: str
    name: str | None
    state: str
    halt_reason: str | None = None
    budget: Budget
    created_at: str
    submitted_by: str | None = Field(default=None, description="the session that started it (server: the server's "
                                                               "token; null: not recorded, the teacher's)")


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


class StudyVariantShown(_Reply):
    name: str
    params: dict[str, Any] = Field(description="NODE.PARAM -> value")


class RankedVariant(_Reply):
    """A variant every repeat of which succeeded and recorded the objective."""

    variant: str
    params: dict[str, Any] = Field(description="NODE.PARAM -> value")
    values: list[float] = Field(description="the objective of each repeat")
    std: float | None = Field(description="their sample standard deviation (0 for one)")
    objective_value: float = Field(description="the values reduced (the objective's reduce)")
    repeats: int
    rank: int


class UnrankedVariant(_Reply):
    """A variant not ranked, and why: over_budget, repeat_failed, running, incomplete,
    not_run or no_objective."""

    variant: str
    params: dict[str, Any] = Field(description="NODE.PARAM -> value")
    values: list[float]
    std: float | None
    reason: str
    repeats_done: int


class StudyNote(_Reply):
    """What the study will do that its body does not say."""

    code: str
    message: str


class StudyDetail(StudySummary):
    """A study's summary and everything else about it."""

    objective: StudyObjective
    repeats: int
    variants: list[StudyVariantShown]
    used: StudyUse
    attempts: list[StudyAttempt]
    ranking: list[RankedVariant] = Field(description="the variants ranked, best first")
    unranked: list[UnrankedVariant]
    plugin_id: str | None = None
    notes: list[StudyNote] = Field(default_factory=list)


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


class LineageStart(_Reply):
    """With ``lineage=true``: where a run of a resumed chain took over."""

    run_id: str
    from_step: int


class RunMetrics(_Reply):
    series: dict[str, list[MetricPoint]]
    resumed: list[LineageStart] | None = Field(
        default=None, description="with lineage=true: where each run of the chain took over")


class ConsolePage(_Reply):
    text: str
    next_offset: int
    size: int


class QueuePrediction(_Reply):
    queue_key: str
    starts: bool
    reason: QueueReason | None


class RunDeleted(_Reply):
    run_id: str
    deleted: bool


class FileDeleted(_Reply):
    file_id: str
    deleted: bool


class FlavorDeleted(_Reply):
    name: str
    deleted: bool


class Revoked(_Reply):
    """What a revoke or a logout answers: the session's or the link's ``id``, or the
    worker's ``name``, and that it opens nothing any more."""

    id: str | None = Field(default=None, description="a session's or a login link's")
    name: str | None = Field(default=None, description="a worker's")
    revoked: bool
    sessions_ended: list[str] | None = Field(default=None, description="a login link's: the sessions it ended")


class ArtifactStored(_Reply):
    """A worker's file, stored (its size and digest), or given up on (``state: failed``
    with the reason)."""

    run_id: str
    path: str
    size: int | None = None
    sha256: str | None = None
    state: str | None = None
    reason: str | None = None


# The catalog -----------------------------------------------------------------------
class PortInfo(_Reply):
    name: str
    type: str
    required: bool


class ParamInfo(_Reply):
    """A node type's param: its type (int, float, bool, string, select, secret, list,
    mapping), whether a graph must give it, and its default, bounds and options."""

    name: str
    type: str
    required: bool
    default: Any = Field(default=None, description="present when it is not required")
    min: float | None = None
    max: float | None = None
    options: list[str] | None = Field(default=None, description="a select's choices")
    description: str | None = None


class NodeTypeInfo(_Reply):
    type: str
    description: str
    inputs: list[PortInfo]
    outputs: list[PortInfo]
    params: list[ParamInfo]
    privileged: bool = False
    resources: NodeResources | None = Field(default=None, description="what each node of it asks for unless the "
                                                                      "graph's node says otherwise")


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
    graph: dict[str, Any] = Field(description="the example's file as it is (a graph document, not checked here)")


class ExampleList(_Reply):
    examples: list[Example]


class FileRow(_Reply):
    id: str
    name: str
    size: int
    sha256: str
    created_at: str
    uploaded_by: str | None = Field(default=None, description="the session that uploaded it (server: the server's "
                                                              "token; null: not recorded, the teacher's)")


class FileList(_Reply):
    files: list[FileRow]


class FileStored(_Reply):
    file_id: str
    name: str
    size: int
    sha256: str
    ref: str = Field(description="how a run's param names it: upload:ID")
    uploaded_by: str | None = Field(default=None, description="whose file it is: this session, or whoever uploaded "
                                                              "the same content first (server: the server's token; "
                                                              "null: not recorded, the teacher's)")


class FlavorList(_Reply):
    flavors: list[Flavor]


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
                                                                    "max_waiting, max_memory_mib, "
                                                                    "max_submits_per_minute")


class LoginLinks(_Reply):
    links: list[LoginLink]


class LoginLinkCreated(_Reply):
    """What ``POST /api/login-links`` answers (its body is ``NewLoginLink``)."""

    login_url: str = Field(description="the link; its token is in it, and nowhere else")
    kind: str
    uses: int
    expires_s: float
    quotas: dict[str, int] = Field(default_factory=dict, description="limits of the sessions it opens")


class SessionRow(_Reply):
    id: str
    kind: str = Field(description="teacher, class or read")
    label: str
    created_at: str
    last_seen_at: str | None
    revoked: bool
    expires_at: float
    link_id: str | None
    quotas: dict[str, int] | None = None


class Sessions(_Reply):
    sessions: list[SessionRow]


class SessionNamed(_Reply):
    id: str
    label: str


class LoggedIn(_Reply):
    kind: str
    id: str
    session: str | None = Field(default=None, description="a terminal's session secret, its bearer token from now "
                                                          "on (a browser gets a cookie instead)")
    expires_at: float | None = Field(default=None, description="when the session ends (Unix time); a terminal's")
