"""The entry point of a run child: one process per worker run, started for the run as
a fresh interpreter (multiprocessing *spawn*, ``main``) or forked from the agent's zygote
(``forked``, see ``troupe.subprocess_runner.zygote``), which imported torch and left CUDA
untouched. Either way it sets the card order and visibility before anything can
initialise CUDA, runs the graph with the same engine as the control plane, sends every
event up the pipe, and exits: a child never takes a second run. It never learns where
the database is."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import platformdirs

from troupe.protocol import pipe
from troupe.subprocess_runner.run_dirs import pool_dir_prefix, run_dir_prefix
from troupe.subprocess_runner.upstream import Upstream

if TYPE_CHECKING:
    from troupe.protocol.worker import Storage
    from troupe.subprocess_runner.artifacts import Shipper
    from troupe.subprocess_runner.console import DescriptorCapture
    from troupe.subprocess_runner.engine import Outcome

# How long a run whose agent vanished may take to end on its cancel flag before its
# process group is killed.
ORPHAN_GRACE_S = 5.0

# What the zygote imports before it forks children: the run child's own modules, torch
# and the torch pack's code, torch._dynamo (which an optimizer imports when it is made)
# and the digits example's data loader (about 2.5 s on a small CPU, once per agent), and
# script.Command's code with what a warm script's process runs (issue 65).
PRELOAD_MODULES = ("torch", "torch.nn", "torch.optim", "troupe.protocol.worker", "troupe.subprocess_runner.engine",
                   "troupe.subprocess_runner.catalog", "troupe.subprocess_runner.context",
                   "troupe.subprocess_runner.fingerprint", "troupe.subprocess_runner.artifacts",
                   "troupe.subprocess_runner.transfer", "troupe.subprocess_runner.memory",
                   "troupe.subprocess_runner.mounts", "troupe.subprocess_runner.ddp",
                   "troupe.subprocess_runner.packs._torch_train", "troupe.subprocess_runner.packs._torch_data",
                   "troupe.subprocess_runner.console", "troupe.subprocess_runner.seeding", "torch._dynamo",
                   "sklearn.datasets", "troupe.subprocess_runner.packs._script_impl",
                   "troupe.subprocess_runner.warm_exec")
# What a run imports once its cards are set (nothing may read CUDA_VISIBLE_DEVICES
# earlier) and before the thread cap, in this order; its steps then take names from them.
_RUN_MODULES = ("troupe.protocol.worker", "troupe.subprocess_runner.artifacts", "troupe.subprocess_runner.console",
                "troupe.subprocess_runner.context", "troupe.subprocess_runner.ddp", "troupe.subprocess_runner.engine",
                "troupe.subprocess_runner.memory", "troupe.subprocess_runner.mounts",
                "troupe.subprocess_runner.seeding", "troupe.subprocess_runner.transfer")
# One writer of the pipe at a time: the run's events and its end.
_PIPE = threading.Lock()
log = logging.getLogger("troupe.child")


def preload() -> Any:
    """The zygote's imports, before it forks any child; answers the node catalog. CUDA
    stays untouched (a run sets its cards first), and no thread is started."""
    from troupe.subprocess_runner.seeding import cap_threads, number_cards_by_bus

    number_cards_by_bus()
    cap_threads()
    _import_all(PRELOAD_MODULES)
    from troupe.subprocess_runner.catalog import load_catalog
    from troupe.subprocess_runner.fingerprint import static_facts

    static_facts()  # what this child's code is, taken now (it is what will execute)
    return load_catalog()


def forked(conn: Connection, catalog: Any, prime: bool = True) -> None:
    """A child forked from the zygote: waits on its pipe for its one run (``StartRun``,
    or ``Dismiss``: the pool closes). Meanwhile it does what every run does first and
    needs nothing of the run: its pipe's sender starts, and a pass over the fingerprint
    and a small graph of core nodes, executed with its events dropped, copies the pages
    those write, which it shares with the zygote until then (about 2 ms of a run's start
    on a small CPU, moved off it). Nothing of that graph reaches the run."""
    upstream = Upstream(conn, _PIPE)
    if prime:  # not for a run that already waits: the copies cost it less than the priming
        _prime(catalog)
    # The global generators are the zygote's (and the prime drew from them): every child
    # would draw alike. Each starts from fresh entropy, as an unseeded run expects.
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()
    from troupe.subprocess_runner.console import DescriptorCapture

    # Made while it waits, each a thread start or a few system calls a run's start no
    # longer pays: its console's pipes and readers, its folder, its cancel listener.
    ahead = _Ahead(upstream, DescriptorCapture(), Path(tempfile.mkdtemp(prefix=pool_dir_prefix(os.getpid()))))
    threading.Thread(target=_listen, args=(conn, ahead.cancel, ahead.armed), name="cancel-listener",
                     daemon=True).start()
    try:
        try:
            frame: pipe.ToChild = conn.recv()
        except (EOFError, OSError):
            return
        match frame:
            case pipe.StartRun(assign):
                main(conn, assign, catalog, ahead)
            case pipe.Dismiss():
                return
            case _:
                raise TypeError(f"a forked child got an unknown frame {frame!r}")
    finally:
        ahead.capture.close()
        shutil.rmtree(ahead.run_dir, ignore_errors=True)  # a dismissed child's folder (a run removed its own)


@dataclass
class _Ahead:
    """What a forked child makes while it waits for its run."""

    upstream: Upstream
    capture: DescriptorCapture
    run_dir: Path  # renamed for the run (its id in the name, as a fresh child's)
    cancel: threading.Event = field(default_factory=threading.Event)
    armed: threading.Event = field(default_factory=threading.Event)  # set once the run came: the listener reads


def _listen(conn: Connection, cancel: threading.Event, armed: threading.Event | None = None) -> None:
    """Until the agent cancels the run (or the pipe closes: the agent is gone); ``armed``:
    started ahead, it reads nothing before the run came."""
    if armed is not None:
        armed.wait()
    try:
        while True:
            match frame := conn.recv():
                case pipe.CancelRun():
                    break
                case _:
                    log.warning("the run child dropped an unknown frame %r", frame)
    except (EOFError, OSError):
        # The agent is gone without a word (killed, or hung up on): nobody will read this
        # run's events, and nobody will end its process group. Past a grace the group ends
        # itself, a node that never looks at the cancel flag included.
        if os.getpgrp() == os.getpid():
            timer = threading.Timer(ORPHAN_GRACE_S, os.killpg, (0, signal.SIGKILL))
            timer.daemon = True
            timer.start()
    cancel.set()


# A graph of core nodes a forked child executes once, its events dropped, before its run
# comes: the engine's code paths then write their own pages, not the run's time.
_PRIME_GRAPH = {"version": 1, "name": "prime", "settings": {"device": "cpu"},
                "nodes": [{"id": "c", "type": "core.Constant", "params": {"value": 1}},
                          {"id": "m", "type": "core.LogMetric", "params": {"name": "prime"}}],
                "edges": [{"source": "c", "source_port": "value", "target": "m", "target_port": "value"}]}


# An epoch of the torch pack's training on a few random points, its events dropped: the
# paths of a dataset, a loader, a model, an optimizer and the loop, as a run's first
# epoch takes them, write their pages here (the digits example's first epoch: ms sooner).
_PRIME_TRAINING = {
    "version": 1, "name": "prime-training", "settings": {"device": "cpu"},
    "nodes": [{"id": "data", "type": "torch.SyntheticClassification",
               "params": {"n": 64, "features": 64, "classes": 10, "val_fraction": 0.25, "seed": 0}},
              {"id": "train", "type": "torch.DataLoader", "params": {"batch_size": 16, "shuffle": True}},
              {"id": "val", "type": "torch.DataLoader", "params": {"batch_size": 16, "shuffle": False}},
              {"id": "mlp", "type": "torch.MLP", "params": {"hidden": "16", "activation": "relu", "dropout": 0.1}},
              {"id": "adam", "type": "torch.Optimizer", "params": {"kind": "adam", "lr": 0.01}},
              {"id": "loop", "type": "torch.TrainingLoop", "params": {"epochs": 1}},
              {"id": "eval", "type": "torch.Evaluate", "params": {}}],
    "edges": [{"source": "data", "source_port": "train", "target": "train", "target_port": "dataset"},
              {"source": "data", "source_port": "val", "target": "val", "target_port": "dataset"},
              {"source": "data", "source_port": "train", "target": "mlp", "target_port": "data"},
              {"source": "mlp", "source_port": "model", "target": "loop", "target_port": "model"},
              {"source": "adam", "source_port": "optimizer", "target": "loop", "target_port": "optimizer"},
              {"source": "train", "source_port": "loader", "target": "loop", "target_port": "train"},
              {"source": "val", "source_port": "loader", "target": "loop", "target_port": "val"},
              {"source": "loop", "source_port": "model", "target": "eval", "target_port": "model"},
              {"source": "val", "source_port": "loader", "target": "eval", "target_port": "data"}]}


def _prime(catalog: Any) -> None:
    from troupe.subprocess_runner.console import Console, capture_descriptors
    from troupe.subprocess_runner.context import ExecutionContext, Sinks
    from troupe.subprocess_runner.engine import execute_graph, prepare_executable_graph
    from troupe.subprocess_runner.fingerprint import RUN_PROCESS, take_ahead

    take_ahead(RUN_PROCESS, {"CUDA_VISIBLE_DEVICES": _visible([])})  # a CPU run's, here rather than on its start
    ctx = ExecutionContext("prime", None, "cpu", None, Sinks(lambda *_: None), threading.Event())
    with capture_descriptors(Console(lambda *_: None, 0)):  # as a run's graph runs: its console's paths
        execute_graph(prepare_executable_graph(_PRIME_GRAPH, catalog), ctx, max_parallel=2)
    # A run's folder is made and removed as here: the temporary names' generator, made
    # anew in a forked process (a seed from the OS), and both paths' pages are its own now.
    shutil.rmtree(tempfile.mkdtemp(prefix="troupe-prime-"), ignore_errors=True)
    if "torch.TrainingLoop" in catalog.types:  # an epoch of a small model, as the torch pack trains one
        ctx = ExecutionContext("prime", None, "cpu", None, Sinks(lambda *_: None), threading.Event())
        execute_graph(prepare_executable_graph(_PRIME_TRAINING, catalog), ctx, max_parallel=2)


def _import_all(names: tuple[str, ...]) -> None:
    for name in names:
        with contextlib.suppress(ImportError):  # not installed here: a run that needs it fails itself
            importlib.import_module(name)


def cuda_touched() -> str | None:
    """Why this process may no longer take a run's cards: CUDA is initialised already,
    so CUDA_VISIBLE_DEVICES would be read too late."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA was initialised before a run chose its cards"
    return None


def main(conn: Connection, assign: dict[str, Any], warm_catalog: Any = None, ahead: _Ahead | None = None) -> None:
    """Executes one run. ``warm_catalog``: the node catalog the zygote loaded before this
    child was forked (None: a fresh interpreter started for this run); ``ahead``: what a
    forked child made while it waited."""
    if os.getpgrp() != os.getpid():
        # Its own process group: a Ctrl+C in the agent's terminal is the agent's to act on
        # (it cancels the run, which then ends `cancelled`), never a KeyboardInterrupt
        # in a node that fails the run.
        os.setpgrp()
    devices = _set_cards(assign)
    for name in _RUN_MODULES:
        importlib.import_module(name)
    from troupe.subprocess_runner.seeding import cap_threads

    cap_threads()
    from troupe.subprocess_runner.fingerprint import RUN_PROCESS, execution_facts

    if warm_catalog is None:  # its warm scripts start cold, and say why
        from troupe.subprocess_runner import warm_script

        warm_script.started_cold(assign.get("cold_because"))
    run = _Run(conn, assign, devices, ahead)
    # This process is what executes the run (``pid``); ``started_warm``: forked from the zygote.
    # Facts nobody waits for: they go up with the first node's start.
    used = tuple(sorted((assign.get("packs") or {}).items()))  # the folder packs it runs, as the control plane has them
    run.upstream.event("environment", None, {**execution_facts(RUN_PROCESS, used), "pid": os.getpid(),
                                             "started_warm": warm_catalog is not None}, hold=True)
    if ahead is not None:
        ahead.armed.set()
    else:
        threading.Thread(target=_listen, args=(conn, run.cancel), name="cancel-listener", daemon=True).start()
    run.execute(warm_catalog)


def _set_cards(assign: dict[str, Any]) -> list[str]:
    """The run's cards, made the only ones CUDA sees, and its nodes' environment: both
    before any import can read them."""
    from troupe.subprocess_runner.seeding import number_cards_by_bus

    devices = [d for d in assign.get("devices", []) if d.startswith("cuda:")]
    number_cards_by_bus()
    os.environ["CUDA_VISIBLE_DEVICES"] = _visible(devices)
    for node in assign["graph"].get("nodes", []):  # resources.env (XLA_FLAGS...): before any import reads it
        os.environ.update((node.get("resources") or {}).get("env") or {})
    return devices


def _visible(devices: list[str]) -> str:
    """CUDA_VISIBLE_DEVICES for a run's cards (``cuda:N``, N in bus order)."""
    return ",".join(d.split(":", 1)[1] for d in devices)


class _Run:
    """One run in this process: what its steps share (the pipe, the run's own directory,
    its cards, the cancel request). Its frames go up the pipe through its ``Upstream``."""

    def __init__(self, conn: Connection, assign: dict[str, Any], devices: list[str], ahead: _Ahead | None) -> None:
        self.conn = conn
        self.capture = ahead.capture if ahead is not None else None
        self.assign = assign
        self.devices = devices
        # Numbers the run's frames and sends them in batches.
        self.upstream = ahead.upstream if ahead is not None else Upstream(conn, _PIPE)
        # The run's files live in a directory of its own; its artifacts are stored from there
        # (their paths relative to it: the control plane refuses one that points elsewhere).
        prefix = run_dir_prefix(assign["run_id"])
        if ahead is None:
            self.run_dir = Path(tempfile.mkdtemp(prefix=prefix))
        else:  # the folder made ahead, named for the run as a fresh child's is
            self.run_dir = ahead.run_dir = ahead.run_dir.rename(
                ahead.run_dir.with_name(prefix + ahead.run_dir.name.removeprefix(pool_dir_prefix(os.getpid()))))
        self.cancel = ahead.cancel if ahead is not None else threading.Event()

    def emit(self, kind: str, node_id: str | None, payload: dict[str, Any]) -> None:
        self.upstream.event(kind, node_id, payload)

    def end(self, status: pipe.EndStatus, error: str | None, node_id: str | None, peak_mib: int | None,
            out_of_memory: bool) -> None:
        self.upstream.end(status, error, node_id, peak_mib, out_of_memory)

    def execute(self, warm_catalog: Any) -> None:
        """Runs the graph and reports its end, a failed one when any step of the run
        raised: the agent always hears how the run ended."""
        from troupe.protocol.worker import Storage
        from troupe.subprocess_runner.artifacts import Shipper, destination
        from troupe.subprocess_runner.engine import Outcome
        from troupe.subprocess_runner.memory import apply_cap, is_out_of_memory, peak_mib

        assign, devices = self.assign, self.devices
        budget = assign.get("memory_budget_mib")
        if budget:  # a shared card: the cap is set before the graph allocates anything
            totals = assign.get("memory_total_mib") or {}
            apply_cap(int(budget), [int(totals.get(d, 0)) for d in devices],
                      lambda message: self.emit("log", None, {"message": message}))
        mounts = dict(assign.get("mounts") or {})
        control_plane = assign.get("control_plane") or {}
        storage = Storage.model_validate(assign["storage"]) if assign.get("storage") else None
        shipper = Shipper(assign["run_id"], self.run_dir, destination(storage, mounts, control_plane,
                                                                      assign.get("artifact_outbox")), self.emit,
                          folder_kept=False)
        try:
            outcome = self._run_graph(warm_catalog, mounts, control_plane, storage, shipper)
        except BaseException as exc:  # the run fails; the child still reports it
            outcome = Outcome("failed", f"the run child failed: {type(exc).__name__}: {exc}")
        shipper.close()  # its artifacts are stored (or warned about) before its end is reported
        error, out_of_memory = outcome.error, is_out_of_memory(outcome.error)
        if out_of_memory and budget:
            error = f"{error} (out of memory under the run's budget of {budget} MiB per card)"
        status = cast("pipe.EndStatus", outcome.status)  # the engine's three (the agent's RunEnded validates it)
        self.end(status, error, outcome.node_id, peak_mib(range(len(devices))), out_of_memory)
        # Nothing is left behind on the worker: what the run wrote is stored, or waits in the
        # agent's outbox under links of its own. Removed once the end is on its way (the
        # process leaves only after this).
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def _run_graph(self, warm_catalog: Any, mounts: dict[str, str], control_plane: dict[str, Any],
                   storage: Storage | None, shipper: Shipper) -> Outcome:
        from troupe.subprocess_runner.catalog import load_catalog, with_folder_packs
        from troupe.subprocess_runner.console import Console, capture_descriptors
        from troupe.subprocess_runner.context import ExecutionContext, NodeLimits, Sinks
        from troupe.subprocess_runner.ddp import plan_for, when_stuck
        from troupe.subprocess_runner.engine import execute_graph, prepare_executable_graph
        from troupe.subprocess_runner.mounts import confine
        from troupe.subprocess_runner.mounts import resolve as resolve_mounts

        assign, run_dir = self.assign, self.run_dir
        resume = self._fetch_inputs(mounts, control_plane, storage)
        resolved = resolve_mounts(assign["graph"], mounts)
        readable = (*mounts.values(), str(run_dir), *(assign.get("data_roots") or ()))
        confine(resolved, readable)
        catalog = with_folder_packs(warm_catalog or load_catalog(), [Path(p) for p in assign.get("pack_paths") or ()])
        graph = prepare_executable_graph(resolved, catalog)
        ddp = plan_for(list(assign.get("devices") or []), resolved, assign["run_id"], run_dir, assign.get("seed"),
                       bool(assign.get("deterministic")), int(assign.get("ddp_cpu_ranks") or 0))
        if ddp is not None:
            when_stuck(lambda error: _end_now(self, error))
        console = Console(self.emit, int(assign.get("console_cap_bytes") or 0))
        # Renumbered from cuda:0 in the order the run listed its cards.
        device = "cuda:0" if self.devices else "cpu"
        ctx = ExecutionContext(assign["run_id"], None, device, assign.get("seed"), Sinks(self.emit, shipper),
                               self.cancel, deterministic=bool(assign.get("deterministic")), run_dir=run_dir,
                               provenance=assign.get("provenance"), ddp=ddp, resume=resume,
                               limits=NodeLimits(float(assign.get("command_kill_grace_s", 5.0)),
                                                 assign.get("memory_budget_mib"), readable))
        with capture_descriptors(console, self.capture):  # the whole process is the run's: fds 1 and 2 are its console
            return execute_graph(graph, ctx, max_parallel=int(assign.get("max_parallel", 4)),
                                 deterministic=bool(assign.get("deterministic")))

    def _fetch_inputs(self, mounts: dict[str, str], control_plane: dict[str, Any],
                      storage: Storage | None) -> dict[str, dict[str, str]] | None:
        """The run's uploaded files (their folder becomes the ``upload`` mount) and the
        checkpoints it resumes from, if any."""
        from troupe.subprocess_runner.transfer import fetch_resume, fetch_uploads, upload_ids

        assign = self.assign
        if upload_ids(assign["graph"]) and control_plane.get("url"):  # the transfer backend
            cache = Path(platformdirs.user_cache_dir("troupe")) / "files"
            mounts["upload"] = str(fetch_uploads(assign["graph"], control_plane["url"], cache,
                                                 control_plane.get("unix_socket"), storage.s3 if storage else None,
                                                 control_plane.get("credential", ""), control_plane.get("ca")))
        if not assign.get("resume"):
            return None
        return fetch_resume(assign["resume"], control_plane.get("url", ""), self.run_dir / "resume",
                            control_plane.get("unix_socket"), control_plane.get("credential", ""),
                            control_plane.get("ca"))


def _end_now(run: _Run, error: str) -> None:
    """A DDP rank died and the loop is stuck in a collective: the run ends failed now,
    reported before this process leaves (the agent sees the end, then the exit)."""
    run.end("failed", error, None, None, False)
    os._exit(1)
