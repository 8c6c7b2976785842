"""The frames of ``/ws/worker``: JSON objects with a ``type``, validated on receipt by
both ends. Every frame carries the sender's per-connection ``frame_no`` (for acks and
dedup); a run's event ``seq`` is never the agent's to assign.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

# Close codes of the worker socket (4000-4999 are the application's).
CLOSE_REFUSED = 4001  # handshake refused: version, credential, revoked
CLOSE_PROTOCOL = 4002  # a malformed or unexpected frame


class _Frame(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    frame_no: int = Field(default=0, ge=0)


class Card(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    uuid: str
    name: str
    index: int = Field(ge=0)
    memory_total_mib: int = Field(ge=0)
    memory_free_mib: int = Field(ge=0)
    pci_bus_id: str | None = None


class Inventory(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus: int = Field(ge=1)
    cards: list[Card] = Field(default_factory=list)
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
    # Runs this agent still executes (after a reconnect): kept or killed by the answer.
    runs: list[str] = Field(default_factory=list)


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


class Heartbeat(_Frame):
    type: Literal["heartbeat"] = "heartbeat"


class Ack(_Frame):
    """Control plane -> agent, answering each heartbeat: every frame of this connection
    up to ``upto`` arrived. Replay of what was not acked is for a later version."""

    type: Literal["ack"] = "ack"
    upto: int = Field(ge=0)


class InventoryUpdate(_Frame):
    type: Literal["inventory"] = "inventory"
    inventory: Inventory


class Drain(_Frame):
    type: Literal["drain"] = "drain"


class Assign(_Frame):
    """Control plane -> agent: execute this graph in a fresh process."""

    type: Literal["assign"] = "assign"
    run_id: str
    graph: dict[str, Any]
    seed: int | None = None
    deterministic: bool = False
    devices: list[str] = Field(default_factory=list)
    max_parallel: int = Field(default=4, ge=1)


class CancelRun(_Frame):
    type: Literal["cancel"] = "cancel"
    run_id: str


class KillRun(_Frame):
    """The control plane no longer holds this run: stop its process now."""

    type: Literal["kill"] = "kill"
    run_id: str


class RunEvent(_Frame):
    """Agent -> control plane: one event of a run, not yet numbered (the RunActor
    assigns ``seq``)."""

    type: Literal["event"] = "event"
    run_id: str
    kind: str
    node_id: str | None = None
    payload: dict[str, Any] = Field(default_factory=dict)


class RunEnded(_Frame):
    type: Literal["ended"] = "ended"
    run_id: str
    status: Literal["succeeded", "failed", "cancelled"]
    error: str | None = None
    node_id: str | None = None


Frame = Annotated[
    Hello | Welcome | Refused | Heartbeat | Ack | InventoryUpdate | Drain | Assign | CancelRun | KillRun | RunEvent
    | RunEnded,
    Field(discriminator="type"),
]
FRAME = TypeAdapter(Frame)


def parse_frame(raw: str | bytes) -> Any:
    """The frame, or ``pydantic.ValidationError`` / ``ValueError`` for a malformed one."""
    return FRAME.validate_json(raw)


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
