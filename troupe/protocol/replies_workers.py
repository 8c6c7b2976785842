"""What the API answers about the machines: the workers (their cards, slots, inventory
and instances), the server itself (``/api/info``) and its cpu ledger. Each nested part
is named, so a client generated from the OpenAPI document has a type for it; open to
fields they do not name, as every reply is (``troupe.protocol.replies_runs``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from troupe.protocol.replies_runs import _Reply
from troupe.protocol.worker import ArtifactOutboxUsage, WarmPool


class WorkerSlot(_Reply):
    device: str
    physical_id: str | None = Field(default=None, description="the card's NVML UUID, or cpu@MACHINE: devices of "
                                                              "one physical id share their slots")
    limit: int
    running: int


class WorkerCard(_Reply):
    """A card as its agent reported it, with its sharing policy and the memory promised
    on it (each holder's budget plus the CUDA context)."""

    device: str
    index: int
    uuid: str
    name: str
    pci_bus_id: str | None = None
    sharing: Literal["exclusive", "memory"]
    reserved_mib: int
    total_mib: int
    free_mib: int
    context_mib: int
    budgets: dict[str, int] = Field(description="run id -> its budget, MiB")
    promised_mib: int


class WorkerInventory(_Reply):
    """What the agent's machine offers besides its cards (listed in ``cards``)."""

    cpus: int
    mps: bool = False


class WorkerInstance(_Reply):
    """One connection of a batch array's worker (``name#id``)."""

    instance: str
    state: str
    machine_id: str | None
    devices: list[str]
    run_id: str | None


class SshSession(_Reply):
    """The SSH session the server holds open for a worker it serves that way."""

    name: str
    host: str
    state: str
    attempts: int
    output: list[str] = Field(description="ssh's last lines")


class WorkerRow(_Reply):
    name: str
    state: str = Field(description="connected, disconnected, connecting or failed")
    degraded: bool
    draining: bool
    missing_node_types: list[str]
    version: str | None = None
    one_shot: bool = False
    deadline: float | None = Field(default=None, description="a batch job's agent: when its job ends (Unix time)")
    mounts: dict[str, str] = Field(default_factory=dict, description="storage label -> the folder on the worker")
    machine_id: str | None = None
    devices: list[str] = Field(default_factory=list, description="what a run may target on it: cpu, cuda:N, mps:0")
    inventory: WorkerInventory | None = None
    cards: list[WorkerCard] = Field(default_factory=list)
    slots: list[WorkerSlot] = Field(default_factory=list)
    running_runs: list[str] = Field(default_factory=list)
    warm_pool: WarmPool | None = None
    artifact_outbox: ArtifactOutboxUsage | None = None
    instances: list[WorkerInstance] = Field(default_factory=list)
    enrolled_at: str | None = None
    heard_s_ago: float | None = None
    failed_reason: str | None = None
    ssh: SshSession | None = None


class WorkerList(_Reply):
    workers: list[WorkerRow]


class Enrollment(_Reply):
    token: str
    command: str = Field(description="the agent's start command, the token in it")
    uses: int
    name: str | None
    expires_at: str


class WorkerCredential(_Reply):
    name: str
    credential: str


class WorkerAdded(_Reply):
    name: str
    host: str
    state: str


class CardPolicySet(_Reply):
    worker: str
    device: str
    uuid: str
    sharing: Literal["exclusive", "memory"]
    reserved_mib: int
    total_mib: int


# The server ------------------------------------------------------------------------
class Capabilities(_Reply):
    runs: bool
    interactive_lane: bool
    sweeps: bool
    studies: bool
    workers: bool
    s3: bool
    editor_cache: bool


class CatalogDigest(_Reply):
    digest: str
    packs: list[str]
    broken_packs: dict[str, str] = Field(description="pack -> why it did not load")


class ServerLimits(_Reply):
    run_queue_max_concurrent_cpu: int
    run_queue_max_concurrent_gpu: int
    run_queue_max_concurrent: dict[str, int] = Field(description="queue key -> its own slot count")
    run_interactive_max_concurrent: int
    max_parallel_nodes: int
    run_retention_keep_last: int
    run_retention_per: str | None = Field(default=None, description="whose runs the kept count is counted per")
    cpus: int | None = Field(description="the cpus lent to declared nodes (TROUPE_CPUS)")


class LoginRule(_Reply):
    reads_need_session: bool
    session: Literal["teacher", "class", "read"] | None = Field(
        default=None, description="the kind of session the request came with (the server's token: teacher); null: none")


class EditorCacheStats(_Reply):
    budget_bytes: int
    entries: int
    bytes: int
    sessions: int
    hits: int
    misses: int
    evictions: int


class Runtime(_Reply):
    switch_interval_s: float
    torch_imported: bool


class Info(_Reply):
    name: Literal["troupe"]
    version: str
    started_at: str
    devices: list[str]
    capabilities: Capabilities
    catalog: CatalogDigest
    limits: ServerLimits
    public_url: str | None = None
    login: LoginRule
    machine_id: str = Field(description="an agent reporting this machine id shares this server's cpus")
    editor_cache: EditorCacheStats
    runtime: Runtime


class CpuHolder(_Reply):
    run_id: str
    node_id: str
    cpus: int


class CpuBook(_Reply):
    total: int
    free: int
    holders: list[CpuHolder]
    waiters: list[CpuHolder]


class CpuLedgerReply(_Reply):
    cpus: CpuBook
