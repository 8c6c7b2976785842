"""Every ``TROUPE_*`` setting, read once at start into one frozen object.

Only ``Settings.from_env`` looks at the environment, and only ``cli`` calls it; everything
else receives the object. Malformed values never fail a start: they fall back to the
default and leave a line in ``warnings``, which ``troupe start`` logs.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from troupe.protocol.queue_key import QueueKey

if TYPE_CHECKING:  # the wire models load pydantic: only a server with S3 on needs them
    from troupe.protocol.worker import S3Bucket

DEFAULT_PORT = 8765


# ``upload:<file id>`` names a file uploaded to this server (POST /api/files).
UPLOAD_LABEL = "upload"
# The environment variables that change what a run computes or how fast: the fingerprint's.
FINGERPRINT_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUBLAS_WORKSPACE_CONFIG", "OMP_NUM_THREADS",
                   "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "PYTHONHASHSEED", "TROUPE_CPUS", "XLA_FLAGS")
ANY_QUEUE_LIMIT = 1_000_000
# A queue key a per-key limit may name: a device, or a worker's (or any's) device.
_QUEUE_KEY = re.compile(r"(?:[a-z0-9][a-z0-9_.-]{0,63}/)?(?:cpu|cuda(?::\d{1,3})?|mps(?::\d{1,3})?|auto)")


@dataclass(frozen=True)
class Settings:
    home: Path
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    run_queue_max_concurrent_gpu: int = 1
    run_queue_max_concurrent_cpu: int = 2
    run_queue_max_concurrent: Mapping[str, int] = field(default_factory=dict)
    run_interactive_max_concurrent: int = 2
    max_parallel_nodes: int = 4
    run_retention_keep_last: int = 200
    run_event_payload_cap_bytes: int = 131072
    run_events_response_cap_bytes: int = 4194304
    # A run's console output kept (its head, then the newest tail); 0 or less: no cap.
    run_console_cap_bytes: int = 8 * 1024 * 1024
    recorded_outputs_keep: int = 20
    worker_heartbeat_s: float = 10.0
    worker_resume_grace_s: float = 300.0
    # On an agent: how long a cancelled run's process has to stop before it is killed.
    worker_kill_grace_s: float = 10.0
    # From SIGTERM to SIGKILL of a cancelled (or timed out) command node's process group.
    command_kill_grace_s: float = 5.0
    # On an agent: MiB of run frames kept until the control plane acknowledges them.
    agent_outbox_mb: float = 64.0
    # On an agent: GiB of its runs' files kept on disk until the control plane has them.
    agent_artifact_outbox_gib: float = 20.0
    # On an agent, for tests only: DDP ranks on the CPU (gloo) for every run; 0: off.
    ddp_cpu_ranks: int = 0
    # How long a run for a one-shot agent waits for one before it ends interrupted.
    worker_one_shot_queue_timeout_s: float = 86400.0
    # Queued runs stay queued across a restart, in their order (default: interrupted).
    run_queue_restore: bool = False
    max_sweep_runs: int = 32
    max_sweep_params: int = 4
    max_sweep_domain: int = 32
    # Cpus lent to nodes that declare them, and the thread cap of in-process runs.
    cpus: int = 1
    max_request_bytes: int = 16 * 1024 * 1024
    # How long a JSON body may take to arrive whole, and a streamed file may stall.
    request_read_timeout_s: float = 30.0
    # How long a stream's reader may take no bytes before it is disconnected.
    stream_write_timeout_s: float = 30.0
    # Node outputs kept between two Runs of one editor session, in MiB over every
    # session (0: no cache).
    editor_cache_mb: int = 512
    stop_grace_s: float = 10.0
    allowed_hosts: tuple[str, ...] = ()
    public_url: str | None = None
    # Serve https from this certificate and key (``--tls-cert``/``--tls-key``).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    examples_dir: Path | None = None
    # Accelerator names this server pretends to have (``cuda:0,cuda:1``), for tests and
    # demos on machines without one; their runs execute on the CPU. Off by default.
    simulated_accelerators: tuple[str, ...] = ()
    # The process's CUDA_VISIBLE_DEVICES (None when unset): which cards it may use, and
    # which is its current device (the first), by CUDA's rule.
    cuda_visible_devices: str | None = None
    # What a run's CUDA context takes on a card beside its budget (shared cards).
    cuda_context_mib: int = 500
    # This server's own storage label and where it is mounted here (None: no label).
    mount_label: str = "data"
    mount_path: Path | None = None
    upload_max_mb: int = 1024  # the largest file POST /api/files takes
    # Folders a run may read files from by absolute path (TROUPE_DATA_ROOTS, os.pathsep
    # between them), besides storage labels, uploads and run folders.
    data_roots: tuple[Path, ...] = ()
    # Whether class sessions may submit privileged node types (a command, a pack's nodes
    # so marked): off, the teacher's choice (TROUPE_CLASS_PRIVILEGED_NODES).
    class_privileged_nodes: bool = False
    # Folders of packs loaded without packaging (docs/packs.md): TROUPE_HOME/packs, then
    # TROUPE_PACKS (os.pathsep between them), then each --packs.
    pack_dirs: tuple[Path, ...] = ()
    # A folder pack is imported first in a child of its own, for at most this long
    # (TROUPE_PACK_IMPORT_TIMEOUT_S; 0: no such check) and within this much address space
    # (TROUPE_PACK_IMPORT_MEMORY_MIB; 0: no limit); past either it is listed broken.
    pack_import_timeout_s: float = 10.0
    pack_import_memory_mib: int = 2048
    # The longest a login session lives, however long its link was good for (30 days,
    # as long as the browser keeps its cookie).
    session_max_s: int = 30 * 86400
    # How a queue key hands its free slots out when several people wait: ``fair`` (to
    # whoever used that key least lately, FIFO within one person) or ``fifo``
    # (TROUPE_QUEUE_ORDER), and the half-life of that use (TROUPE_FAIR_SHARE_HALF_LIFE_S).
    queue_order: str = "fair"
    fair_share_half_life_s: float = 3600.0
    # What a class link limits its sessions to when the teacher gives no limits of its
    # own (TROUPE_CLASS_MAX_RUNNING, _MAX_WAITING, _MAX_MEMORY_GIB; 0 or unset: none).
    class_quotas: Mapping[str, int] = field(default_factory=dict)
    # How many runs a class link's session may submit a minute when the teacher gives the
    # link no such limit (TROUPE_CLASS_MAX_SUBMITS_PER_MINUTE; 0: none).
    class_max_submits_per_minute: int = 30
    # The event loop the server and agents run on (TROUPE_EVENT_LOOP): ``uvloop``, or
    # ``asyncio`` (the standard library's, also where uvloop is not installed).
    event_loop: str = "uvloop"
    # Inside a SLURM job: when it ends (SLURM_JOB_END_TIME, epoch seconds).
    job_end_time: float | None = None
    transfer_max_mb: int = 256  # the most a worker run fetches of its uploads (transfer backend)
    # The S3 / MinIO bucket uploads and worker artifacts go to (TROUPE_S3_*); None: off.
    s3: S3Bucket | None = None
    warnings: tuple[str, ...] = ()

    @property
    def mounts(self) -> dict[str, str]:
        """This server's storage labels: label -> path here; ``upload`` is its uploads."""
        own = {self.mount_label: str(self.mount_path)} if self.mount_path is not None else {}
        return {**own, UPLOAD_LABEL: str(self.home / "files")}

    @property
    def readable_roots(self) -> tuple[str, ...]:
        """Where an in-process run may read files: the storage labels (uploads too), the
        data roots the owner named, the runs' folders. Checked at submission and again
        as a node opens a file."""
        return (*self.mounts.values(), *(str(root) for root in self.data_roots), str(self.home / "runs"))

    def line_limit(self, queue_key: str) -> int:
        """How many runs the queue of ``queue_key`` hands on at once. A worker's device
        (``gpu-a/cuda:0``, ``any/cpu``) only keeps the order: its ledger counts the
        slots, or the memory of a shared card, where every provider of the device meets."""
        return ANY_QUEUE_LIMIT if QueueKey.parse(queue_key).provider is not None else self.concurrency_for(queue_key)

    def concurrency_for(self, queue_key: str) -> int:
        """How many queued-lane runs may hold a slot of ``queue_key`` at once. A run for
        target ``any`` (key ``any/<device>``) is limited by the slots of the worker it
        lands on, which the placer counts, so its own queue only keeps the order."""
        key = QueueKey.parse(queue_key)
        if key.pooled:
            return ANY_QUEUE_LIMIT
        if queue_key in self.run_queue_max_concurrent:
            return self.run_queue_max_concurrent[queue_key]
        if key.device == "cpu":
            return self.run_queue_max_concurrent_cpu
        return self.run_queue_max_concurrent_gpu

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert else "http"

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str],
        *,
        default_home: Path,
        host: str | None = None,
        port: int | None = None,
        examples_dir: Path | None = None,
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
        packs: tuple[Path, ...] = (),
    ) -> Settings:
        warnings: list[str] = []
        reader = _Reader(environ, warnings)
        home = Path(environ.get("TROUPE_HOME") or default_home).expanduser()
        return cls(
            home=home,
            host=host or environ.get("TROUPE_HOST") or "127.0.0.1",
            port=port if port is not None else reader.integer("TROUPE_PORT", DEFAULT_PORT, minimum=0, maximum=65535),
            run_queue_max_concurrent_gpu=reader.limit("TROUPE_RUN_QUEUE_MAX_CONCURRENT_GPU", 1),
            run_queue_max_concurrent_cpu=reader.limit("TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU", 2),
            run_queue_max_concurrent=reader.per_key("TROUPE_RUN_QUEUE_MAX_CONCURRENT"),
            run_interactive_max_concurrent=reader.limit("TROUPE_RUN_INTERACTIVE_MAX_CONCURRENT", 2),
            max_parallel_nodes=reader.limit("TROUPE_MAX_PARALLEL_NODES", 4),
            run_retention_keep_last=reader.integer("TROUPE_RUN_RETENTION_KEEP_LAST", 200),
            run_event_payload_cap_bytes=reader.integer("TROUPE_RUN_EVENT_PAYLOAD_CAP_BYTES", 131072),
            run_events_response_cap_bytes=reader.integer("TROUPE_RUN_EVENTS_RESPONSE_CAP_BYTES", 4194304),
            run_console_cap_bytes=reader.integer("TROUPE_RUN_CONSOLE_CAP_BYTES", 8 * 1024 * 1024),
            cpus=reader.limit("TROUPE_CPUS", default_cpus()),
            max_sweep_runs=reader.limit("TROUPE_MAX_SWEEP_RUNS", 32),
            max_sweep_params=reader.limit("TROUPE_MAX_SWEEP_PARAMS", 4),
            max_sweep_domain=reader.limit("TROUPE_MAX_SWEEP_DOMAIN", 32),
            worker_heartbeat_s=reader.number("TROUPE_WORKER_HEARTBEAT_S", 10.0) or 10.0,
            worker_resume_grace_s=reader.number("TROUPE_WORKER_RESUME_GRACE_S", 300.0),
            worker_kill_grace_s=reader.number("TROUPE_WORKER_KILL_GRACE_S", 10.0),
            command_kill_grace_s=reader.number("TROUPE_COMMAND_KILL_GRACE_S", 5.0),
            agent_outbox_mb=reader.number("TROUPE_AGENT_OUTBOX_MB", 64.0),
            agent_artifact_outbox_gib=reader.number("TROUPE_AGENT_ARTIFACT_OUTBOX_GIB", 20.0),
            ddp_cpu_ranks=reader.integer("TROUPE_DDP_CPU_RANKS", 0, minimum=0),
            worker_one_shot_queue_timeout_s=reader.number("TROUPE_WORKER_ONE_SHOT_QUEUE_TIMEOUT_S", 86400.0),
            run_queue_restore=reader.flag("TROUPE_RUN_QUEUE_RESTORE", False),
            recorded_outputs_keep=reader.integer("TROUPE_RECORDED_OUTPUTS_KEEP", 20, minimum=0),
            max_request_bytes=reader.integer("TROUPE_MAX_REQUEST_BYTES", 16 * 1024 * 1024, minimum=1024),
            request_read_timeout_s=reader.number("TROUPE_REQUEST_READ_TIMEOUT_S", 30.0) or 30.0,
            stream_write_timeout_s=reader.number("TROUPE_STREAM_WRITE_TIMEOUT_S", 30.0) or 30.0,
            editor_cache_mb=reader.integer("TROUPE_EDITOR_CACHE_MB", 512, minimum=0),
            stop_grace_s=reader.number("TROUPE_STOP_GRACE_S", 10.0),
            allowed_hosts=tuple(h.lower() for h in reader.words("TROUPE_ALLOWED_HOSTS", ",")),
            public_url=environ.get("TROUPE_PUBLIC_URL") or None,
            tls_cert=tls_cert or _path(environ.get("TROUPE_TLS_CERT")),
            tls_key=tls_key or _path(environ.get("TROUPE_TLS_KEY")),
            examples_dir=examples_dir,
            simulated_accelerators=reader.devices("TROUPE_SIMULATED_ACCELERATORS"),
            cuda_visible_devices=environ.get("CUDA_VISIBLE_DEVICES"),
            cuda_context_mib=reader.integer("TROUPE_EXECUTION_CUDA_CONTEXT_MIB", 500, minimum=0),
            mount_label=environ.get("TROUPE_MOUNT_LABEL", "data").strip() or "data",
            mount_path=Path(environ["TROUPE_MOUNT_PATH"]).expanduser() if environ.get("TROUPE_MOUNT_PATH") else None,
            upload_max_mb=reader.integer("TROUPE_UPLOAD_MAX_MB", 1024, minimum=1),
            data_roots=tuple(Path(p).expanduser() for p in reader.words("TROUPE_DATA_ROOTS", os.pathsep)),
            class_privileged_nodes=reader.flag("TROUPE_CLASS_PRIVILEGED_NODES", False),
            pack_dirs=(home / "packs", *(Path(p).expanduser() for p in reader.words("TROUPE_PACKS", os.pathsep)),
                       *(p.expanduser().resolve() for p in packs)),
            pack_import_timeout_s=reader.number("TROUPE_PACK_IMPORT_TIMEOUT_S", 10.0, maximum=86400.0),
            pack_import_memory_mib=reader.integer("TROUPE_PACK_IMPORT_MEMORY_MIB", 2048, minimum=0, maximum=2**40),
            session_max_s=reader.integer("TROUPE_SESSION_MAX_S", 30 * 86400, minimum=1),
            queue_order=reader.choice("TROUPE_QUEUE_ORDER", ("fair", "fifo")),
            fair_share_half_life_s=reader.number("TROUPE_FAIR_SHARE_HALF_LIFE_S", 3600.0) or 3600.0,
            class_quotas=reader.class_quotas(),
            class_max_submits_per_minute=reader.integer("TROUPE_CLASS_MAX_SUBMITS_PER_MINUTE", 30, minimum=0),
            event_loop=reader.choice("TROUPE_EVENT_LOOP", ("uvloop", "asyncio")),
            transfer_max_mb=reader.integer("TROUPE_TRANSFER_MAX_MB", 256, minimum=0),
            job_end_time=reader.number("SLURM_JOB_END_TIME", 0.0) or None,
            s3=reader.bucket() if reader.flag("TROUPE_S3_ENABLED", False) else None,
            warnings=tuple(warnings),
        )


INTEGER_MAX = 2**62


class _Reader:
    """Parses one kind of value each, noting what it had to ignore."""

    def __init__(self, environ: Mapping[str, str], warnings: list[str]) -> None:
        self._env = environ
        self._warnings = warnings

    def words(self, name: str, separator: str) -> list[str]:
        """The non-blank items of a list (hosts by comma, folders by the path separator)."""
        return [item.strip() for item in self._env.get(name, "").split(separator) if item.strip()]

    def class_quotas(self) -> dict[str, int]:
        """A class link's default limits, those set (a 0 is no limit)."""
        found = (("max_running", self.integer("TROUPE_CLASS_MAX_RUNNING", 0, minimum=0)),
                 ("max_waiting", self.integer("TROUPE_CLASS_MAX_WAITING", 0, minimum=0)),
                 ("max_memory_mib", math.ceil(self.number("TROUPE_CLASS_MAX_MEMORY_GIB", 0.0) * 1024)))
        return {key: value for key, value in found if value}

    def integer(self, name: str, default: int, *, minimum: int = -INTEGER_MAX, maximum: int = INTEGER_MAX) -> int:
        """Bounded even where a setting names no bound: it reaches SQLite (a LIMIT) and
        the OS, which take 64-bit integers."""
        raw = self._env.get(name, "").strip()
        if not raw:
            return default
        try:
            value = int(raw)
        except ValueError:
            self._warnings.append(f"{name}={raw!r} is not an integer; using {default}")
            return default
        if value < minimum:
            self._warnings.append(f"{name}={value} is below {minimum}; using {default}")
            return default
        if value > maximum:
            self._warnings.append(f"{name}={raw[:40]} is above {maximum}; using {default}")
            return default
        return value

    def number(self, name: str, default: float, *, maximum: float = 1e15) -> float:
        raw = self._env.get(name, "").strip()
        if not raw:
            return default
        try:
            value = float(raw)
        except ValueError:
            self._warnings.append(f"{name}={raw!r} is not a number; using {default}")
            return default
        if not 0 <= value <= maximum:  # NaN and infinity too: a setting is a finite amount
            self._warnings.append(f"{name}={raw[:40]!r} must be a number from 0 to {maximum:g}; using {default}")
            return default
        return value

    def choice(self, name: str, choices: tuple[str, ...]) -> str:
        """One of ``choices``, the first by default."""
        raw = self._env.get(name, "").strip().lower()
        if raw and raw not in choices:
            self._warnings.append(f"{name}={raw!r} is not one of {', '.join(choices)}; using {choices[0]}")
        return raw if raw in choices else choices[0]

    def flag(self, name: str, default: bool) -> bool:
        raw = self._env.get(name, "").strip().lower()
        if not raw:
            return default
        if raw in ("1", "true", "yes", "on"):
            return True
        if raw in ("0", "false", "no", "off"):
            return False
        self._warnings.append(f"{name}={raw!r} is not 1 or 0; using {int(default)}")
        return default

    def bucket(self) -> S3Bucket | None:
        """TROUPE_S3_ENABLED is on: the bucket it names (keys left unset come from the
        usual AWS places: the environment, ~/.aws), or None with a warning."""
        from pydantic import ValidationError

        from troupe.protocol.worker import S3Bucket

        env = {key: self._env.get(f"TROUPE_S3_{key.upper()}", "").strip() or None for key in (
            "bucket", "prefix", "endpoint_url", "region", "access_key_id", "secret_access_key")}
        prefix = (env.pop("prefix") or "").strip("/")
        try:
            return S3Bucket.model_validate({**env, "prefix": f"{prefix}/" if prefix else ""})
        except ValidationError as exc:
            first = exc.errors()[0]
            self._warnings.append(f"TROUPE_S3_ENABLED is on but TROUPE_S3_{str(first['loc'][0]).upper()} is not "
                                  f"usable ({first['msg']}), so S3 stays off")
            return None

    def limit(self, name: str, default: int) -> int:
        # A limit below 1 would leave a queue that can never drain, so it counts as 1.
        return max(1, self.integer(name, default))

    def devices(self, name: str) -> tuple[str, ...]:
        found = []
        for entry in filter(None, (e.strip().lower() for e in self._env.get(name, "").split(","))):
            if re.fullmatch(r"(cuda|mps):\d{1,3}", entry):
                found.append(entry)
            else:
                self._warnings.append(f"{name}: ignoring {entry!r} (want cuda:N or mps:N)")
        return tuple(found)

    def per_key(self, name: str) -> dict[str, int]:
        raw = self._env.get(name, "").strip()
        result: dict[str, int] = {}
        for entry in filter(None, (e.strip() for e in raw.split(","))):
            key, sep, value = entry.rpartition("=")
            key = key.strip()
            try:
                number = int(value.strip())
            except ValueError:
                number = None
            if not sep or not key or number is None:
                self._warnings.append(f"{name}: ignoring malformed entry {entry!r} (want KEY=N)")
                continue
            if not _QUEUE_KEY.fullmatch(key.lower()):
                self._warnings.append(f"{name}: ignoring {entry!r}: {key!r} is not a queue key (a device such as "
                                      "cpu, cuda:0 or mps, or worker/device)")
                continue
            result[normalise_key(key.lower())] = max(1, number)
        return result


def default_cpus() -> int:
    """Every core but two (kept for the event loop and the API), at least one."""
    return max(1, (os.cpu_count() or 1) - 2)


def normalise_key(key: str) -> str:
    """``cuda`` and ``cuda:0`` are one card, as are ``mps`` and ``mps:0``."""
    parsed = QueueKey.parse(key)
    device = {"cuda": "cuda:0", "mps": "mps:0"}.get(parsed.device, parsed.device)
    return str(QueueKey(parsed.provider, device))


def _path(value: str | None) -> Path | None:
    return Path(value).expanduser().resolve() if value else None
