"""The frames of ``/ws/worker``: JSON objects with a ``type``, validated on receipt by
both ends. Every frame carries the sender's per-connection ``frame_no`` (dedup within one
connection). A run's frames (events, ended, gap) also carry the run's own ``counter``, set
by the run's child and gap-free from 1: it survives reconnects and control-plane
restarts, so the agent can resend what was not acknowledged and the control plane can
drop what it already applied. A run's event ``seq`` is never the agent's to assign.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

# Close codes of the worker socket (4000-4999 are the application's).
CLOSE_REFUSED = 4001  # handshake refused: version, credential, revoked
CLOSE_PROTOCOL = 4002  # a malformed or unexpected frame
# The largest count or size a frame may carry: SQLite's INTEGER holds it, with room to add.
COUNT_MAX = 2**62
# A batch array's task id: it names the agent's files too (``agent-NAME#ID.pid``), so no "/".
INSTANCE = r"[A-Za-z0-9_.\-]{1,64}"
# The cards one machine may report (a large box has 8 or 16); each is a ledger up here.
CARDS_MAX = 64
CARD_UUID_MAX = 128


class _Frame(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    frame_no: int = Field(default=0, ge=0, le=COUNT_MAX)


class Card(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    uuid: str = Field(min_length=1, max_length=CARD_UUID_MAX)
    name: str
    index: int = Field(ge=0, le=COUNT_MAX)
    memory_total_mib: int = Field(ge=0, le=COUNT_MAX)
    memory_free_mib: int = Field(ge=0, le=COUNT_MAX)
    pci_bus_id: str | None = None


class Inventory(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus: int = Field(ge=1, le=COUNT_MAX)
    cards: list[Card] = Field(default_factory=list, max_length=CARDS_MAX)
    mps: bool = False


class Hello(_Frame):
    """The agent's first frame."""

    type: Literal["hello"] = "hello"
    version: str
    name: str
    machine_id: str
    capabilities: list[str] = Field(default_factory=list)
    catalog_digest: str
    node_types: list[str] = Field(default_factory=list)
    inventory: Inventory
    # A one-shot agent takes one run and exits; ``spent`` once it has taken it.
    one_shot: bool = False
    spent: bool = False
    # One task of a batch array: the agents of one enrollment connect as instances of
    # one worker (``<name>#<instance>``).
    instance: str | None = Field(default=None, pattern=f"^{INSTANCE}$")
    # When the batch job ends (epoch seconds): a run expected to take longer is not sent.
    deadline: float | None = None
    # Storage labels the agent was started with (``--mount data=/mnt/nas``): label -> path.
    mounts: dict[str, str] = Field(default_factory=dict)
    # Runs this agent still executes (after a reconnect): kept or killed by the answer.
    runs: list[str] = Field(default_factory=list)
    # Started with --accept-packs: it fetches the control plane's folder packs as its runs
    # need them, so it lacks none of their node types; ``installed_digest`` is the digest
    # of its other types, which must match the control plane's.
    accept_packs: bool = False
    installed_digest: str | None = None
    # Its own packs that failed to load (name -> why): a run that names one is refused with
    # that error rather than for lacking the node type.
    broken_packs: dict[str, str] = Field(default_factory=dict)
    # Draining (``troupe agent stop``): said again on each connection, so that a draining
    # agent stays drained across a cut and a new agent process is not.
    draining: bool = False


class Welcome(_Frame):
    type: Literal["welcome"] = "welcome"
    name: str
    degraded: bool = False
    missing_node_types: list[str] = Field(default_factory=list)
    heartbeat_s: float


class Refused(_Frame):
    """The control plane will not have this agent; ``final`` means no retry can help."""

    type: Literal["refused"] = "refused"
    code: str
    reason: str
    final: bool = True


class WarmPool(BaseModel):
    """The agent's pool of warm run children (``--warm N``): how many it keeps, how many
    are ready now, and the memory they hold (None where it cannot be read)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    size: int = Field(ge=0, le=COUNT_MAX)
    ready: int = Field(ge=0, le=COUNT_MAX)
    rss_mib: int | None = Field(default=None, ge=0, le=COUNT_MAX)


class ArtifactOutboxUsage(BaseModel):
    """The agent's artifact outbox: files kept until the control plane has them. A full
    one takes no new runs until uploads free room."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bytes: int = Field(ge=0, le=COUNT_MAX)
    entries: int = Field(ge=0, le=COUNT_MAX)
    full: bool = False


class Heartbeat(_Frame):
    type: Literal["heartbeat"] = "heartbeat"
    # Free memory of each card now (NVML UUID -> MiB): a shared card admits by it.
    free_mib: dict[str, Annotated[int, Field(ge=0, le=COUNT_MAX)]] = Field(default_factory=dict,
                                                                          max_length=CARDS_MAX)
    warm: WarmPool | None = None
    artifact_outbox: ArtifactOutboxUsage | None = None


class Ack(_Frame):
    """Control plane -> agent: every frame of this connection up to ``upto`` arrived, and
    for each run in ``runs`` every frame up to that counter is persisted (the agent may
    forget them). Sent at every heartbeat and after 256 run frames or 100 ms of them."""

    type: Literal["ack"] = "ack"
    upto: int = Field(default=0, ge=0, le=COUNT_MAX)
    runs: dict[str, int] = Field(default_factory=dict)


class InventoryUpdate(_Frame):
    type: Literal["inventory"] = "inventory"
    inventory: Inventory


class Drain(_Frame):
    type: Literal["drain"] = "drain"


class S3Bucket(BaseModel):
    """The bucket a run's artifacts and uploads live in (TROUPE_S3_*); a worker's run gets
    the keys with its assignment, over the worker's authenticated link."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bucket: str = Field(min_length=3, max_length=63)
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None


class Storage(BaseModel):
    """Where a worker run's artifacts go once written: the control plane's own mount
    label when the worker holds it too (both reach the same folder), else the S3 bucket,
    else the control plane itself (transfer), up to ``transfer_max_mb`` a file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mount_label: str | None = None
    s3: S3Bucket | None = None
    transfer_max_mb: int = Field(default=1024, ge=0, le=COUNT_MAX)


class ResumeFiles(BaseModel):
    """One TrainingLoop's checkpoint: where the control plane serves each file, and its sha256."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    epoch: int
    weights: str  # /api/runs/<run>/artifacts/<id>
    weights_sha256: str
    state: str
    state_sha256: str


class Assign(_Frame):
    """Control plane -> agent: execute this graph in a fresh process."""

    type: Literal["assign"] = "assign"
    run_id: str
    graph: dict[str, Any]
    seed: int | None = None
    deterministic: bool = False
    devices: list[str] = Field(default_factory=list)
    max_parallel: int = Field(default=4, ge=1, le=COUNT_MAX)
    # On a shared card: the run's memory budget, which the child sets as its allocator's
    # cap (a fraction of the card's total) before the graph starts.
    memory_budget_mib: int | None = Field(default=None, ge=1, le=COUNT_MAX)
    memory_total_mib: dict[str, int] = Field(default_factory=dict)  # device -> the card's total
    provenance: Literal["identity", "content"] | None = None  # record the files the run reads
    # Keep each node's outputs on the worker, for the inspector to read through the link.
    record_outputs: bool = False
    # Where the run's artifacts go besides its own folder: mount, then S3, then transfer.
    storage: Storage | None = None
    # A resumed run: node id -> the checkpoint it continues from, fetched from the control
    # plane and checked against its sha256 before the graph starts.
    resume: dict[str, ResumeFiles] = Field(default_factory=dict)
    # The run's console output kept (TROUPE_RUN_CONSOLE_CAP_BYTES); 0: no cap.
    console_cap_bytes: int = 8 * 1024 * 1024
    # The folder packs its nodes come from: name -> the sha256 of the pack's files. An
    # agent started with --accept-packs fetches one it lacks (GET /api/packs/NAME/archive).
    packs: dict[str, str] = Field(default_factory=dict)


class CancelRun(_Frame):
    type: Literal["cancel"] = "cancel"
    run_id: str


class KillRun(_Frame):
    """The control plane no longer holds this run: stop its process now."""

    type: Literal["kill"] = "kill"
    run_id: str


class ReadOutputs(_Frame):
    """Control plane -> agent: the recorded outputs of one of its runs (every node's, or
    ``node_id``'s), answered by ``Outputs`` with the same ``request``."""

    type: Literal["read_outputs"] = "read_outputs"
    request: int = Field(ge=1, le=COUNT_MAX)
    run_id: str
    node_id: str | None = None


class Outputs(_Frame):
    """Agent -> control plane: node id -> outputs; ``found`` is false when the worker
    keeps none for that run (never recorded, or past TROUPE_RECORDED_OUTPUTS_KEEP)."""

    type: Literal["outputs"] = "outputs"
    request: int = Field(ge=1, le=COUNT_MAX)
    found: bool = True
    outputs: dict[str, Any] = Field(default_factory=dict)


# The most events one ``events`` frame carries; the agent also splits a frame whose text
# is over ``BATCH_BYTES``.
EVENTS_PER_FRAME = 512


class _RunFrame(_Frame):
    run_id: str
    # The run's own frame counter (from 1, gap-free), kept until acknowledged.
    counter: int = Field(ge=1, le=COUNT_MAX)


class RunEvents(_RunFrame):
    """Agent -> control plane: consecutive events of one run (one or more) in one frame,
    each ``[kind, node_id, payload_json]``, not yet numbered (the RunActor assigns
    ``seq``); ``counter`` is the last one's, so the first is
    ``counter - len(events) + 1``. A run emitting fast costs one frame, one parse and one
    acknowledgement per batch rather than per event; a frame replayed after a reconnect is
    applied only from the first event the RunActor has not applied yet.

    ``payload_json``: the event's payload (a JSON object) as text, which the control plane
    stores and streams as it came unless it has to change it (a non-finite number, a
    payload over the cap), instead of encoding it again; one whose text is not an object
    is refused with a warning in the run's log, as a bad metric is."""

    type: Literal["events"] = "events"
    events: list[tuple[str, str | None, str]] = Field(min_length=1, max_length=EVENTS_PER_FRAME)

    @property
    def first(self) -> int:
        return self.counter - len(self.events) + 1


class RunEnded(_RunFrame):
    type: Literal["ended"] = "ended"
    status: Literal["succeeded", "failed", "cancelled"]
    error: str | None = None
    node_id: str | None = None
    # The most memory the run used: its cards' allocator peak, or the child's resident
    # set where it had no card; exact, as the child is the run's alone.
    peak_memory_mib: int | None = Field(default=None, ge=0, le=COUNT_MAX)
    out_of_memory: bool = False


class Gap(_RunFrame):
    """Agent -> control plane: the agent's outbox overflowed (``TROUPE_AGENT_OUTBOX_MB``)
    while the link was down, and ``dropped`` events of the run up to ``counter`` were
    dropped. Recorded as a ``warning`` with code ``events_dropped``: never a silent loss."""

    type: Literal["gap"] = "gap"
    dropped: int = Field(ge=1, le=COUNT_MAX)


RUN_FRAMES = (RunEvents, RunEnded, Gap)
RunFrame = RunEvents | RunEnded | Gap

Frame = Annotated[
    Hello | Welcome | Refused | Heartbeat | Ack | InventoryUpdate | Drain | Assign | CancelRun | KillRun
    | RunEvents | RunEnded | Gap | ReadOutputs | Outputs,
    Field(discriminator="type"),
]
FRAME = TypeAdapter(Frame)
BATCH = TypeAdapter(list[Frame])
# Run frames waiting together go in one websocket message (a JSON array), up to this many
# bytes: one parse, one hop per actor and one write per run for the lot.
BATCH_BYTES = 256 * 1024


def parse_frame(raw: str | bytes) -> Any:
    """The frame, or ``pydantic.ValidationError`` / ``ValueError`` for a malformed one."""
    return FRAME.validate_json(raw)


def parse_frames(raw: str | bytes) -> list[Any]:
    """The frames of one websocket message: one frame, or a JSON array of them."""
    head = raw.lstrip()[:1]
    if head in ("[", b"["):
        return BATCH.validate_json(raw)
    return [FRAME.validate_json(raw)]


def join_frames(texts: list[str]) -> str:
    """Frames already serialised, as one message (``parse_frames`` reads it back)."""
    return texts[0] if len(texts) == 1 else "[" + ",".join(texts) + "]"


def dump_frame(frame: BaseModel, frame_no: int | None = None) -> str:
    """The frame as JSON; ``frame_no`` numbers it for the connection it goes out on."""
    if frame_no is not None:
        frame = frame.model_copy(update={"frame_no": frame_no})
    return frame.model_dump_json()


class Numbering:
    """One connection's frame numbers: those it sends (from 1) and the newest it
    received, so that a frame that comes twice is recognised and dropped."""

    def __init__(self) -> None:
        self.sent = 0
        self.received = 0

    def next(self) -> int:
        self.sent += 1
        return self.sent

    def is_new(self, frame: BaseModel) -> bool:
        number = int(getattr(frame, "frame_no", 0))
        if number == 0:
            return True  # unnumbered (frame_no left at its default): nothing to compare
        if number <= self.received:
            return False
        self.received = number
        return True
