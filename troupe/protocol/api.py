"""Request and reply schemas of the HTTP API.

The same pydantic models validate incoming bodies and produce ``/api/openapi.json``, so
the document cannot drift from what the server accepts.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, model_validator

from troupe.protocol.flavors import FLAVOR_NAME
from troupe.protocol.graph import Graph
from troupe.protocol.numbers import INTEGRAL, Integer
from troupe.protocol.replies_code import CheckpointSummary
from troupe.protocol.replies_runs import (
    ArtifactRow,
    ExecutionFacts,
    GroupBest,
    Progress,
    QueueReason,
    ResumedFrom,
    ResumePoint,
)

SEED_MAX = 2**32 - 1
# A device as the document states it; the server also takes other case and spaces.
DEVICE_PATTERN = r"^(cpu|auto|cuda|mps)(:[0-9]{1,3})?$"
QUEUE_KEY_PATTERN = r"^([a-z0-9][a-z0-9_.-]{0,63}/)?[a-z0-9]{1,16}(:[0-9]{1,3})?$"  # cpu, cuda:0, WORKER/DEVICE


class Target(BaseModel):
    """Where a run executes: ``worker`` names an enrolled worker, ``any`` lets the placer
    choose, ``local`` (or no target) is the control plane itself. Unknown keys are
    refused (``unknown_target_option``): a run meant for elsewhere never runs here. A
    worker and a pool exclude each other (``target_conflict``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True,
                              json_schema_extra={"not": {"required": ["worker", "pool"]}})

    worker: str | None = Field(default=None, min_length=1, max_length=128)
    devices: list[str] | None = Field(default=None, min_length=1, max_length=64,
                                      description="the run's devices on the worker; the first is its key")
    wait: StrictBool | None = Field(default=None, description="absent or true: wait for an offline worker; "
                                                        "false: refuse at once (503 worker_offline). On a "
                                                        "shared card, true waits for memory and absent or "
                                                        "false refuses at once (503 memory_busy)")
    memory_gib: float | None = Field(default=None, gt=0, le=1_000_000,
                                     description="the run's memory budget on a worker's shared card, in GiB")
    flavor: str | None = Field(default=None, pattern=FLAVOR_NAME,
                               description="a stored size whose memory_gib is the run's budget")
    pool: Literal["one-shot"] | None = Field(
        default=None, description="one-shot: the first free one-shot agent (a batch job's) takes the run")

    @property
    def remote(self) -> str | None:
        """The worker named, or None for the control plane itself."""
        return None if self.worker in (None, "local") else self.worker


# Params changed from the terminal: ``NODE.PARAM`` (or ``NODE.vars.NAME``) -> a value.
ParamsSet = dict[Annotated[str, Field(max_length=300)], str | int | float | bool]
PARAMS_SET_MAX = 100  # params a run keeps as set from the terminal, a rerun's own included


class RunOptions(BaseModel):
    """How a run is to be executed; every field is optional. An interactive run names
    its editor session."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, json_schema_extra={
        "if": {"required": ["lane"], "properties": {"lane": {"const": "interactive"}}},
        # An interactive run has its editor's session and runs here: never a target.
        "then": {"required": ["editor_session"], "properties": {"editor_session": {"type": "string"},
                                                                "target": {"type": "null"}}}})

    device: str | None = Field(default=None, max_length=64, description="cpu | auto | cuda | cuda:N | mps",
                               json_schema_extra={"pattern": DEVICE_PATTERN})
    seed: Annotated[int, Field(ge=0, le=SEED_MAX), INTEGRAL] | None = None
    deterministic: StrictBool = False
    record_outputs: StrictBool = False
    lane: Literal["queued", "interactive"] = "queued"
    editor_session: str | None = Field(default=None, min_length=1, max_length=128)
    target: Target | None = Field(default=None, description="a worker placement; needs an enrolled worker")
    provenance: Literal["identity", "content"] | None = Field(
        default=None, description="record what dataset and weight files the run reads: by identity (path, size, "
                                  "mtime) or by content (sha256)")
    require_device: StrictBool = Field(default=False, description="refuse the run (device_unavailable) rather than "
                                                                  "fall back to cpu when the device is not there")
    params_set: ParamsSet | None = Field(
        default=None, max_length=PARAMS_SET_MAX,
        description="what `--set` changed (NODE.PARAM -> value), kept with the run for show and the page; the graph "
                    "already holds the values")


_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# One line of printable text: a name that other people's pages and terminals show (an
# escape in it could clear a terminal or set its clipboard). The document's rule;
# _printable says it in words first.
PRINTABLE = r"^[^\x00-\x1f\x7f-\x9f]*$"
PRINTABLE_NAMED = r"^[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f][^\x00-\x1f\x7f-\x9f]*$"  # and not blank


def _printable(value: Any) -> Any:
    if isinstance(value, str) and _UNPRINTABLE.search(value):
        raise ValueError("holds a control character (a newline, a tab, an escape); a name is one line of "
                         "printable text")
    return value


def _not_blank(value: Any) -> Any:
    if isinstance(value, str) and value and not value.strip():
        raise ValueError("is blank; a name needs a printable character")
    return _printable(value)


Printable = Annotated[str, Field(pattern=PRINTABLE), BeforeValidator(_printable)]
PrintableName = Annotated[str, Field(pattern=PRINTABLE_NAMED), BeforeValidator(_not_blank)]


class SubmitRun(BaseModel):
    """Body of ``POST /api/runs``."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    graph: Graph
    name: Printable | None = Field(default=None, max_length=200)
    options: RunOptions = Field(default_factory=RunOptions)


class ExportGraph(BaseModel):
    """Body of ``POST /api/export``."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    graph: Graph
    seed: Annotated[int, Field(ge=0, le=SEED_MAX), INTEGRAL] | None = None
    deterministic: StrictBool = False


class EstimateGraph(BaseModel):
    """Body of ``POST /api/estimates``."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    graph: Graph
    devices: list[str] | None = Field(default=None, min_length=1, max_length=64,
                                      description="the run's devices; the estimate is for as many cards")


class Estimate(BaseModel):
    estimate_mib: Integer = Field(description="what the run's cards would hold, the CUDA context included")
    budget_mib: Integer = Field(description="the part to give as target.memory_gib: the server adds the context")
    cards: int
    basis: str
    parts: dict[str, float]
    notes: list[str]


class ExportedScript(BaseModel):
    filename: str
    script: str


class RunCreated(BaseModel):
    run_id: str
    status: str
    device: str
    queue_key: str
    lane: str
    queue_position: int | None
    warnings: list[str]


class RunRow(BaseModel):
    id: str
    name: str | None
    status: str
    device: str
    queue_key: str
    lane: str
    queue_position: int | None
    submitted_by: str | None = Field(default=None, description="the session that submitted it (server: the "
                                                               "server's token)")
    submitted_label: str | None = Field(default=None, description="the name that session goes by now")
    created_at: str
    started_at: str | None
    finished_at: str | None
    final_loss: float | None
    final_loss_non_finite: Literal["nan", "inf", "-inf"] | None = Field(
        default=None, description="the final loss diverged: final_loss is null and this says to what")
    sweep_id: str | None
    sweep_variant: int | None
    study_id: str | None = None
    error: str | None
    queue_reason: QueueReason | None = Field(default=None, description="a queued run: what it waits for")
    progress: Progress | None = Field(default=None, description="a training's place")
    tags: list[str] = Field(default_factory=list, description="what people tagged it with, sorted")
    note: str | None = Field(default=None, description="a person's note on the run")
    sort_value: float | None = Field(default=None, description="with ?sort=: the series' newest value it was "
                                                               "ordered by")
    params: dict[str, Any] | None = Field(default=None, description="with ?values=true: its graph's scalar params "
                                                                    "by node.param")
    metrics: dict[str, float | str | None] | None = Field(
        default=None, description="with ?values=true: each series' newest value (a diverged one as nan, inf, -inf)")
    logged_params: dict[str, str] | None = Field(default=None, description=(
        "with ?values=true: the params its script logged (MLflow's log_param), name -> value as text"))


class RunDetail(RunRow):
    seed: int | None
    deterministic: bool
    record_outputs: bool
    error_detail: str | None
    warnings: list[str]
    artifacts: list[ArtifactRow]
    graph: Graph
    options: RunOptions = Field(default_factory=RunOptions, description="the options it was submitted with")
    worker: str | None = None
    memory_budget_mib: Annotated[int, Field(description="its budget on a shared card, MiB"), INTEGRAL] | None = None
    memory_budget_source: Literal["declared", "measured"] | None = Field(
        default=None, description="declared (target.memory_gib) or measured (the graph's last peak + 20%)")
    peak_memory_mib: Annotated[int, Field(description="the most memory the run used, MiB"), INTEGRAL] | None = None
    peak_memory_exact: bool | None = Field(
        default=None, description="true from a worker run's own process; false in the server, whose runs share one")
    out_of_memory: bool = False
    execution_facts: ExecutionFacts | None = Field(default=None, description="what executed the run")
    rerun_of: str | None = Field(default=None, description="the run this one was made again from")
    reruns: list[str] = Field(default_factory=list, description="the runs made again from this one, oldest first")
    resumed_from: ResumedFrom | None = Field(default=None, description="the checkpoint this run continues from")
    resume_point: ResumePoint | None = Field(default=None, description="an ended run's newest complete checkpoint")
    checkpoints: CheckpointSummary | None = Field(default=None, description=(
        "its checkpoints in a few words (count, newest, best, size); artifacts lists them"))
    logged_params: dict[str, str] = Field(default_factory=dict, description=(
        "the params its script logged (MLflow's log_param), name -> value as text"))
    logged_tags: dict[str, str] = Field(default_factory=dict, description=(
        "the tags its script set (MLflow's set_tag), name -> value; not the run's own tags"))


class RerunRequest(BaseModel):
    """Body of ``POST /api/runs/{id}/rerun``: ``{}`` runs it again from the start;
    ``resume`` continues each TrainingLoop from its newest complete checkpoint;
    ``params_set`` changes params of its graph first (``NODE.PARAM`` or ``NODE.vars.NAME``
    -> value, as ``troupe rerun --set`` sends them)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    resume: StrictBool = False
    params_set: ParamsSet | None = Field(default=None, max_length=PARAMS_SET_MAX)


class RunGroup(BaseModel):
    """In ``GET /api/runs?grouped=true``: the runs of one sweep or study, folded."""

    kind: Literal["sweep", "study"]
    id: str
    name: str | None
    runs: int = Field(description="how many of its runs match the filters")
    counts: dict[str, int] = Field(description="those runs by status")
    best: GroupBest | None = Field(description="the best objective so far")
    newest_seq: int


class RunList(BaseModel):
    runs: list[RunRow | RunGroup] = Field(description="runs; with grouped=true, sweeps and studies folded into one "
                                                      "row each (those have a kind)")
    next_cursor: str | None


TAG_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:+/-]{0,39}$"


class RunEdit(BaseModel):
    """Body of ``PATCH /api/runs/{id}``: what a person adds to a run. A field left out
    stays; ``tags`` replaces the whole set; ``null`` clears the name or the note."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, json_schema_extra={"minProperties": 1})

    name: Printable | None = Field(default=None, min_length=1, max_length=200)
    tags: list[Annotated[str, Field(pattern=TAG_PATTERN)]] | None = Field(default=None, max_length=20)
    note: str | None = Field(default=None, max_length=4096)

    @model_validator(mode="before")
    @classmethod
    def _something(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data:
            raise ValueError("nothing to change: give name, tags or note")
        return data


class Event(BaseModel):
    seq: int
    type: str
    ts: str
    node_id: str | None
    payload: dict[str, Any]


class EventPage(BaseModel):
    events: list[Event]
    next_cursor: int | None


class CancelReply(BaseModel):
    run_id: str
    status: str


class EditorSessionCache(BaseModel):
    """Reply of ``GET /api/editor-sessions/{session}``: what the session's node cache
    holds (``bytes`` is an estimate)."""

    editor_session: str
    entries: int
    bytes: int
    budget_bytes: int


class EditorSessionClosed(BaseModel):
    """Reply of ``DELETE /api/editor-sessions/{session}``."""

    editor_session: str
    dropped_entries: int


class QueueShare(BaseModel):
    """The one physical device a queue key shares with other keys (the server's cpu and
    a same-machine worker's): its slots, and the runs holding it through any of them."""

    device: str = Field(description="the physical device: cpu@MACHINE, mps:0@MACHINE, a card's UUID")
    queue_keys: list[str] = Field(description="every key that offers it now, this one among them")
    limit: int = Field(description="its slots: the smallest limit of the keys that offer it")
    running: int = Field(description="runs holding it now, through any of those keys")


class QueueRow(BaseModel):
    queue_key: str
    limit: int
    running: int
    queued: int
    state: Literal["ok", "quarantined"]
    reason: str | None = None
    shares: QueueShare | None = Field(default=None, description="null unless its device is one quota with other keys")


class QueueList(BaseModel):
    queues: list[QueueRow]


class ErrorBody(BaseModel):
    code: str
    message: str
    pointer: str | None = None
    node_id: str | None = None
    offset: int | None = Field(default=None, description="where_invalid: where in the filter's text it went "
                                                          "wrong (0-based, in characters)")
    expected: list[str] | None = Field(default=None, description="where_invalid: what could have stood there")
    key: str | None = Field(default=None, description="where_unknown_key: the key, as written")


class ErrorReply(BaseModel):
    error: ErrorBody


_NAME = r"[a-z0-9][a-z0-9_.-]{0,63}"


def _not_reserved(name: str | None) -> str | None:
    if name in _RESERVED:
        raise ValueError(f"{name!r} is reserved (a target word or a route name), not a worker name")
    return name


# A host as ssh takes it: a name or an IPv4 address, or an IPv6 address bare (two colons at
# least, a zone after %), never ``host:port`` or ``[::1]``. The pattern is the rule (the
# OpenAPI document shows it); the validator before it says what is wrong in words.
SSH_HOST = (r"^(?:[A-Za-z0-9_][A-Za-z0-9_.\-]{0,252}"
            r"|[0-9A-Fa-f.]{0,39}:[0-9A-Fa-f.]{0,39}:[0-9A-Fa-f:.]{0,39}(?:%[A-Za-z0-9_.\-]{1,32})?)$")
_SSH_HOST = re.compile(SSH_HOST)


def _ssh_host(host: Any) -> Any:
    if isinstance(host, str) and not _SSH_HOST.fullmatch(host):
        raise ValueError(f"{host[:60]!r} is not a host name or an address ssh takes: no leading '-', the port in "
                         "'port', an IPv6 address without brackets (::1)")
    return host


def _one_line(value: Any) -> Any:
    if isinstance(value, str) and _CONTROL.search(value):
        raise ValueError("holds a control character (a NUL, a newline, a tab), which ssh would cut or misread")
    return value


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
ONE_LINE = r"^[^\x00-\x1f\x7f]*$"  # the document's rule; _one_line says it in words first
# Target words, and the names of the routes beside /api/workers/{name}.
_RESERVED = ("any", "local", "one-shot", "credentials", "enrollments", "ssh")


def worker_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a worker's name, or None."""
    if not re.fullmatch(_NAME, name):
        return f"{name[:80]!r} is not a worker name (lowercase letters, digits, '_', '.', '-'; up to 64)"
    if name in _RESERVED:
        return f"{name!r} is reserved (a target word or a route name), not a worker name"
    return None
WorkerName = Annotated[str | None, Field(default=None, pattern=f"^{_NAME}$"), AfterValidator(_not_reserved)]


class NewEnrollment(BaseModel):
    """Body of ``POST /api/workers/enrollments``: a one-time join token."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: WorkerName = None
    ttl_s: float = Field(default=86400, gt=0, le=365 * 86400)
    uses: Integer = Field(default=1, ge=1, le=1000)


class SshWorker(BaseModel):
    """Body of ``POST /api/workers/ssh``: a worker on a machine that cannot reach the
    control plane, served through an SSH session the control plane opens."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: Annotated[str, Field(pattern=f"^{_NAME}$"), AfterValidator(_not_reserved)]
    # Never an option to ssh: no leading dash, no spaces.
    host: Annotated[str, Field(pattern=SSH_HOST), BeforeValidator(_ssh_host)]
    user: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,31}$")
    port: Annotated[int, Field(ge=1, le=65535), INTEGRAL] | None = None
    identity_file: Annotated[str | None, Field(min_length=1, max_length=4096, pattern=ONE_LINE),
                             BeforeValidator(_one_line)] = Field(
        default=None, description="a private key on the control plane's machine")
    known_hosts_file: Annotated[str | None, Field(min_length=1, max_length=4096, pattern=ONE_LINE),
                                BeforeValidator(_one_line)] = Field(
        default=None, description="the host keys to trust (default: ssh's own known_hosts)")
    remote_command: Annotated[str, Field(min_length=1, max_length=1024, pattern=ONE_LINE),
                              BeforeValidator(_one_line)] = Field(
        default="troupe", description="how the remote shell starts troupe")


class CardSharing(BaseModel):
    """Body of ``PUT /api/workers/{name}/devices/{device}``: how a card admits runs,
    stored for the physical card (its NVML UUID) whichever worker offers it."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    sharing: Literal["exclusive", "memory"] = Field(
        description="exclusive: count its slots; memory: admit runs while their budgets fit")
    reserved_mib: Integer = Field(default=0, ge=0, le=2**31,
                              description="memory never promised to runs (the desktop, another user)")


class Redeem(BaseModel):
    """Body of ``POST /api/workers/credentials``: an agent trades its join token for a credential."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    token: str = Field(min_length=1, max_length=200)
    name: WorkerName = None
    machine_id: str = Field(min_length=1, max_length=200)


def held_devices(options: Any, device: str) -> list[str]:
    """The devices a run holds, in their order: ``target.devices`` when it names several,
    else its one device. Resolved where a run's row is made (submission) or read back (the
    store), and kept in the row as ``devices``: nothing downstream derives it again.
    ``options``: the row's options, as stored (a dict, or None)."""
    named = ((options or {}).get("target") or {}).get("devices") or []
    return list(named) if len(named) > 1 else [device]
