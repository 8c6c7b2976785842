"""The control plane's supervision tree (DESIGN section 3), built from its declaration
in ``troupe/supervisors/tree.py``: every supervisor, every kind of child and its restart policy
are read from there, not written again here.

Start: store (crash recovery and retention happen before the API answers), hub,
placer, then the web server. Graceful stop: refuse new work, interrupt waiting runs,
ask running ones to stop within the grace, then close the web, flush the store, and
stop the rest in reverse.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from troupe.actors.base import ActorRef, Registry, Shutdown
from troupe.actors.cpus import CpuLedger
from troupe.actors.events import Committed, EventHub
from troupe.actors.placer.actor import Placer, Quarantine, Restore, RunSpec
from troupe.actors.placer.book import INSTANCE_MARK
from troupe.actors.placer.ledger import LedgerActor
from troupe.actors.placer.queue import QueueActor
from troupe.actors.resources import read_flavors
from troupe.actors.run import RunActor
from troupe.actors.run_messages import Abandon, ReportOccupancy, WorkerFailed
from troupe.actors.run_tally import RunTally
from troupe.actors.ssh_session import SshSession, SshTarget
from troupe.actors.store import StoreActor, StoreClient
from troupe.actors.store.events import AppendEvents
from troupe.actors.store.retention import Prune
from troupe.actors.store.runs import KeepQueuedForNextStart, Recover, UpdateRun
from troupe.actors.store.schema import check_writable
from troupe.actors.store.studies import ListStudies, UpdateStudy
from troupe.actors.store.workers import WorkerExited
from troupe.actors.store.writer import Writer
from troupe.actors.study import StudyActor, Wake
from troupe.actors.submission import Admission, Submission, prepared_graph
from troupe.actors.threaded import ThreadActorRef, start_thread_actor
from troupe.actors.worker import Adopted, WorkerConnection
from troupe.protocol import events as ev
from troupe.protocol.api import RunOptions
from troupe.protocol.errors import TroupeError
from troupe.protocol.graph import Graph
from troupe.protocol.queue_key import QueueKey
from troupe.protocol.run_record import Adoption, RunRecord
from troupe.protocol.settings import Settings
from troupe.subprocess_runner.catalog import Catalog
from troupe.subprocess_runner.devices import host_machine_id, parse_device, probe_accelerators, visible_cards
from troupe.subprocess_runner.executable import ExecutableGraph
from troupe.subprocess_runner.fingerprint import CONTROL_PLANE, execution_facts
from troupe.subprocess_runner.node_cache import NodeCache
from troupe.subprocess_runner.run_marker import stop_carrying
from troupe.supervisors import tree
from troupe.supervisors.errors import StartRefused
from troupe.supervisors.failed import FailedWorkers
from troupe.supervisors.supervisor import Child, ChildSpec, ExitInfo, Supervisor
from troupe.web.app import WebService
from troupe.web.context import Services
from troupe.web.hosts import reachable_names
from troupe.web.login import LoginBook

log = logging.getLogger("troupe.root")

# Node threads per parallel-node slot: room for 16 runs executing max_parallel nodes.
NODE_POOL_PER_SLOT = 16
# Executor threads: one per in-process run executing at once, made when first needed
# and reused. Independent queue keys must never wait for each other's executors, so the
# cap is far above what the slots of one machine admit at once.
EXECUTOR_POOL_MAX = 512


class ControlPlane:
    def __init__(self, settings: Settings, catalog: Catalog, version: str) -> None:
        self.settings = settings
        self.catalog = catalog
        self.version = version
        self.token = secrets.token_urlsafe(32)
        self.port: int | None = None
        self.recovered: list[str] = []
        # Set by ``troupe stop --leave-worker-runs`` before the stop: worker runs keep
        # executing and queued runs stay queued, for the next start to adopt.
        self.leave_worker_runs = False
        # Browsers and terminals log in with links (troupe/web/login.py).
        self.login = LoginBook(token=self.token, session_max_s=settings.session_max_s)
        self.lan_hosts: tuple[str, ...] = ()  # bound beyond loopback: the names it is reached by
        # Workers whose connection actor kept crashing, with the reason (GET /api/workers).
        self.failed_workers = FailedWorkers()
        self.placer: ActorRef | None = None  # the live placer's ref, set by its factory

    @property
    def db_path(self) -> Path:
        return self.settings.home / "troupe.db"

    @property
    def runs_dir(self) -> Path:
        return self.settings.home / "runs"

    async def start(self) -> int:
        self.registry = Registry()
        self.root: Supervisor[Child] = Supervisor("root")
        self.queues: Supervisor[ActorRef] = Supervisor(tree.QUEUES.name, on_give_up=self._quarantine)
        self.ledgers: Supervisor[ActorRef] = Supervisor(tree.LEDGERS.name)
        self.runs: Supervisor[ActorRef] = Supervisor(tree.RUNS.name)
        self.studies: Supervisor[ActorRef] = Supervisor(tree.STUDIES.name, on_give_up=self._study_failed)
        self.workers: Supervisor[ActorRef] = Supervisor(tree.WORKERS.name, on_give_up=self._worker_failed)
        try:
            self.runs_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StartRefused(f"cannot make the runs folder {self.runs_dir}: {exc.strerror or exc}") from None
        try:
            await asyncio.to_thread(check_writable, self.db_path)
        except Exception as exc:  # apsw's, the schema's or the file system's: each says what is wrong
            raise StartRefused(f"cannot open the database {self.db_path}: {exc}") from None
        self.store = StoreClient(on_committed=self._publish,
                                 open_inline=functools.partial(Writer.open, self.db_path, self.runs_dir))
        # One pool for the nodes of every in-process run: a run does not start threads
        # of its own. More nodes than threads wait their turn (they never wait on each
        # other: the engine submits a node only once its inputs exist).
        self.node_pool = ThreadPoolExecutor(max_workers=NODE_POOL_PER_SLOT * self.settings.max_parallel_nodes,
                                            thread_name_prefix="nodes")
        self.executor_pool = ThreadPoolExecutor(max_workers=EXECUTOR_POOL_MAX, thread_name_prefix="executor")
        # Node outputs kept between two Runs of one editor session (interactive runs).
        self.node_cache = NodeCache(self.settings.editor_cache_mb * 1024 * 1024)
        self.tally = RunTally()  # kept across restarts of the hub that feeds it

        store_ref = self.root.start_child(ChildSpec(tree.STORE.name, self._make_store, tree.STORE.restart))
        found = await self.store.write(Recover(keep_queued=self.settings.run_queue_restore))
        self.recovered = found["interrupted"]
        if self.recovered:
            log.warning("%d runs left queued or running by the last server are now interrupted", len(self.recovered))
        if found["ran_here"]:  # a killed server could not stop its runs' commands: they are stopped now
            stopped = await asyncio.to_thread(stop_carrying, found["ran_here"], self.settings.command_kill_grace_s)
            if stopped:
                log.warning("stopped %d processes of runs the last server left running", len(stopped))
        if self.settings.run_retention_keep_last >= 0:
            await self.store.write(Prune(self.settings.run_retention_keep_last))
        assert store_ref.is_alive
        await self.login.load(self.store)  # sessions outlive a restart
        self.lan_hosts = tuple(reachable_names(self.settings.host))
        self.accelerators = probe_accelerators(self.settings.cuda_visible_devices) + _simulated(self.settings)
        # Taken once per process (it reads the packs' files): not on the first run's start.
        await asyncio.to_thread(execution_facts, CONTROL_PLANE)
        self.root.start_child(ChildSpec(tree.EVENTS.name, lambda: EventHub(tally=self.tally).start(self.registry),
                                        tree.EVENTS.restart))
        self.root.start_child(ChildSpec(tree.PLACER.name, self._make_placer, tree.PLACER.restart))
        await self._restore(found["adopted"], found["queued"])
        self.root.start_child(ChildSpec(tree.CPUS.name, lambda: CpuLedger(self.settings.cpus).start(self.registry),
                                        tree.CPUS.restart))
        # Studies left running by the last server go on (their budgets hold).
        for study in await self.store.read(ListStudies(state="running")):
            self.start_study(study["id"])
        self.web = WebService(
            Services(
                settings=self.settings, catalog=self.catalog, store=self.store, registry=self.registry,
                token=self.token, version=self.version, started_at=ev.utc_now(),
                accelerators=self.accelerators, start_study=self.start_study, start_worker=self.start_worker,
                node_cache=self.node_cache, login=self.login, failed_workers=self.failed_workers.snapshot,
                forget_failed=self.failed_workers.forget,
                start_ssh=self.start_ssh, lan_hosts=self.lan_hosts, tally=self.tally,
            )
        )
        self.port = await self.web.start()
        # The web server is not restarted in place (its port is taken until it closes);
        # aiohttp confines handler errors to their request.
        self.root.start_child(ChildSpec(tree.WEB.name, lambda: self.web, tree.WEB.restart))
        return self.port

    async def _restore(self, adopted: list[dict[str, Any]], queued: list[dict[str, Any]]) -> None:
        """Worker runs the last server left executing get RunActors (``adopting``) and
        their worker's connection (``disconnected`` until the agent reports them, for the
        grace); queued runs that were kept go back in line. The placer rebuilds their
        slots before it admits anything else."""
        specs: dict[str, list[RunSpec]] = {"adopted": [], "queued": []}
        for kind, rows in (("adopted", adopted), ("queued", queued)):
            for row in rows:
                try:
                    graph = await self._restored_graph(kind, row)
                except Exception as exc:  # the catalog, a flavor or this machine changed under a kept run
                    await self._not_restored(row, str(exc))
                    continue
                adoption = Adoption(int(row["next_seq"]), int(row.get("worker_counter") or 0),
                                    tuple((str(p), str(d)) for p, d in row.get("holds") or ())) \
                    if kind == "adopted" else None
                specs[kind].append(RunSpec(RunRecord.from_row(row), graph, adoption))
        for spec in specs["adopted"]:
            self.start_worker(str(spec.record.worker)).tell(Adopted(spec.run_id, spec.record.device))
        if specs["adopted"] or specs["queued"]:
            log.warning("adopting %d worker runs and restoring %d queued runs", len(specs["adopted"]),
                        len(specs["queued"]))
            assert self.placer is not None  # started just before
            self.placer.tell(Restore(tuple(specs["adopted"]), tuple(specs["queued"])))

    async def _restored_graph(self, kind: str, row: dict[str, Any]) -> ExecutableGraph:
        """What a kept run executes. One queued here is admitted again as a submission is:
        its row holds its graph as submitted, so its flavors, its cut-down asks and its
        labels are read against this start (a card gone, a flavor deleted: not restored)."""
        document = Graph.model_validate(row["graph"])
        if kind != "queued" or QueueKey.parse(row["queue_key"]).provider is not None:
            return prepared_graph(document, self.catalog)
        gone = [d for d in row.get("devices") or () if d != "cpu" and d not in self.accelerators]
        if gone:  # admitted for a card this start does not have: it would start on nothing
            raise ValueError(f"this server has no {', '.join(gone)} now (it has "
                             f"{', '.join(('cpu', *self.accelerators))}); submit it again")
        options = RunOptions.model_validate(row.get("options") or {})
        submission = Submission(document, row.get("name"), options, await read_flavors(self.store, document, options))
        return Admission(self.settings, self.catalog, self.accelerators).record(submission, None)[1]

    async def _not_restored(self, row: dict[str, Any], why: str) -> None:
        log.error("run %s cannot be restored: %s", row["id"], why)
        error = f"cannot be restored: {why}"
        await self.store.write(UpdateRun(row["id"], {"status": ev.INTERRUPTED, "finished_at": ev.utc_now(),
                                                     "error": error}))
        # A terminal event, so a watcher of the run's stream ends too.
        finished = ev.make_event(int(row["next_seq"]), ev.RUN_FINISHED, None,
                                 {"status": ev.INTERRUPTED, "error": error, "reason": "server_restart"})
        await self.store.write(AppendEvents(row["id"], (finished,)))

    # Children ------------------------------------------------------------------
    def _make_store(self) -> ThreadActorRef:
        ref = start_thread_actor(StoreActor, "store", self.db_path, self.runs_dir)
        self.store.bind(ref)
        return ref

    def _make_placer(self) -> ActorRef:
        # The server's cpu (and mps:0) is one physical device with a same-machine agent's.
        machine = host_machine_id()
        local = {device: (f"{device}@{machine}", self.settings.concurrency_for(device))
                 for device in ("cpu", *self.accelerators) if device in ("cpu", "mps:0")}
        placer = Placer(
            self.store, self.registry, interactive_limit=self.settings.run_interactive_max_concurrent,
            spawn_run=self._spawn_run, ensure_queue=self._ensure_queue, ensure_ledger=self._ensure_ledger,
            local_devices=local, catalog_types=frozenset(self.catalog.types),
            admission=Admission(self.settings, self.catalog, self.accelerators),
        )
        self.placer = placer.start(self.registry)
        return self.placer

    def _spawn_run(self, spec: RunSpec) -> ActorRef:
        def factory() -> ActorRef:
            actor = RunActor(spec.record, spec.graph, self.store, self.registry, self.settings,
                             executor_pool=self.executor_pool, node_pool=self.node_pool, node_cache=self.node_cache,
                             adoption=spec.adoption)
            return actor.start(self.registry)

        return self.runs.start_child(ChildSpec(f"{tree.RUNS.name}/{spec.run_id}", factory, tree.RUNS.restart))

    def _ensure_queue(self, key: str) -> ActorRef:
        name = f"queues/{key}"
        existing = self.queues.child(name)
        if existing is not None:
            return existing

        starts = 0

        def factory() -> ActorRef:
            nonlocal starts
            starts += 1
            restarted = starts > 1
            # A new key's line fills from the placer's Enqueues (on a server's start too:
            # the placer's Restore hands on each queued run): nothing to read, nothing to
            # ask of the live runs, which are hundreds in a busy lab.
            # A worker's device only keeps the order here (its ledger counts the slots, and the
            # placer takes the line at the device in fair order): FIFO, with nothing to read.
            order = self.settings.queue_order if QueueKey.parse(key).provider is None else "fifo"
            ref = QueueActor(key, self.settings.line_limit(key), self.store, self.registry, rebuild=restarted,
                             order=order, half_life_s=self.settings.fair_share_half_life_s).start(self.registry)
            if restarted:  # a restarted queue learns from the live runs which slots they hold
                for run_name in self.registry.names("runs/"):
                    run = self.registry.lookup(run_name)
                    if run is not None:
                        run.tell(ReportOccupancy())
            return ref

        return self.queues.start_child(ChildSpec(name, factory, tree.QUEUES.restart))

    def _ensure_ledger(self, physical: str) -> tuple[ActorRef, bool]:
        """The ledger of a physical device, and whether it is new (then the placer tells
        it its providers and holders). A crashed ledger is not restarted in place: the
        next ask makes a fresh one."""
        name = f"{tree.LEDGERS.name}/{physical}"
        existing = self.ledgers.child(name)
        if existing is not None:
            return existing, False
        ref = self.ledgers.start_child(ChildSpec(
            name, lambda: LedgerActor(physical, self.settings.cuda_context_mib).start(self.registry),
            tree.LEDGERS.restart))
        return ref, True

    def start_study(self, study_id: str) -> None:
        """Starts the actor of a running study, unless one is already driving it."""
        name = f"{tree.STUDIES.name}/{study_id}"
        running = self.studies.child(name)
        if running is not None:
            running.tell(Wake())
            return

        def factory() -> ActorRef:
            actor = StudyActor(study_id, self.store, self.registry)
            return actor.start(self.registry)

        self.studies.start_child(ChildSpec(name, factory, tree.STUDIES.restart))

    def start_worker(self, name: str) -> ActorRef:
        existing = self.workers.child(f"workers/{name}")
        if existing is not None:
            return existing
        self.failed_workers.forget(name)  # a fresh connection gets a fresh chance

        def factory() -> ActorRef:
            settings = self.settings
            return WorkerConnection(name, settings.worker_heartbeat_s, settings.worker_resume_grace_s,
                                    self.registry, settings.concurrency_for, frozenset(self.catalog.types),
                                    self.catalog.digest, self._retire, self.catalog.offered).start(self.registry)

        return self.workers.start_child(ChildSpec(f"{tree.WORKERS.name}/{name}", factory, tree.WORKERS.restart))

    def _retire(self, name: str) -> None:
        """A one-shot agent took its run and exited: its worker leaves the list until its
        next batch job connects (an array's instance was never listed apart from its
        worker). Its credential stays: the next job of that worker uses it."""
        if INSTANCE_MARK not in name:
            self.store.write(WorkerExited(name))

    def start_ssh(self, target: SshTarget) -> ActorRef | None:
        """Opens the SSH session that serves ``target``'s worker; None when one is open."""
        name = f"{tree.SSH.name}/{target.name}"
        if self.workers.child(name) is not None or self.port is None:
            return None
        self.failed_workers.forget(target.name)

        port, forward = self.port, self.web.forward_target

        def failed(worker: str, reason: str) -> None:
            self.failed_workers.record(worker, reason)

        return self.workers.start_child(ChildSpec(
            name, lambda: SshSession(target, port, self.store, failed, forward).start(self.registry),
            tree.SSH.restart))

    def _worker_failed(self, spec: ChildSpec[ActorRef], exit_info: ExitInfo) -> None:
        """Past the restart limit a worker shows ``failed`` with the reason; its runs are
        lost (nothing can route their frames) and its agent's next connection retries."""
        name = spec.name.removeprefix("workers/")
        log.error("worker %s failed: its connection actor kept crashing (%s)", name, exit_info.reason)
        self.failed_workers.record(name, f"crashed repeatedly: {exit_info.reason}")
        for run_name in self.registry.names("runs/"):
            run = self.registry.lookup(run_name)
            if run is not None:
                run.tell(WorkerFailed(name))

    def _study_failed(self, spec: ChildSpec[ActorRef], exit_info: ExitInfo) -> None:
        study_id = spec.name.removeprefix("studies/")
        log.error("study %s failed: its actor kept crashing (%s)", study_id, exit_info.reason)
        self.store.write(UpdateStudy(study_id, {"state": "failed",
                                                "halt_reason": f"crashed repeatedly: {exit_info.reason}"},
                                      ("running",)))

    def _quarantine(self, spec: ChildSpec[ActorRef], exit_info: ExitInfo) -> None:
        key = spec.name.removeprefix("queues/")
        placer = self.registry.lookup("placer")
        if placer is not None:
            placer.tell(Quarantine(key, f"crashed repeatedly: {exit_info.reason}"))

    def _publish(self, writes: tuple[tuple[Any, Any], ...]) -> None:
        hub = self.registry.lookup("events")
        if hub is not None:
            hub.tell(Committed(writes))

    # Running and stopping ------------------------------------------------------
    async def serve(self, stop: asyncio.Event) -> int:
        """Serves until ``stop`` is set (exit 0) or the root gives up (exit 1)."""
        stop_wait: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
        failed: asyncio.Future[Any] = self.root.failed
        try:
            await asyncio.wait([stop_wait, failed], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop_wait.cancel()
        if self.root.failed.done():
            log.critical("the control plane failed: %s", self.root.failed.result())
            await self.stop()
            return 1
        await self.stop()
        return 0

    async def stop(self) -> None:
        grace = self.settings.stop_grace_s
        shutdown = Shutdown(leave_worker_runs=self.leave_worker_runs)
        placer = self.registry.lookup("placer")
        if placer is not None:
            # Closed first, ahead of the submissions in its mailbox: one it is handling
            # starts its run while the runs supervisor still starts children, the later
            # ones are refused (503 shutting_down), none is stored without its actor.
            with contextlib.suppress(TroupeError):
                await placer.ask(shutdown, first=True)
        for supervisor in (self.root, self.queues, self.runs, self.studies, self.workers, self.ledgers):
            supervisor.stop_restarting()
        # Before the runs stop: a worker connection must not acknowledge frames of runs
        # whose actors are gone, which the next start may adopt.
        for connection in self.workers.children():
            connection.tell(shutdown)
        if self.leave_worker_runs:
            await self.store.write(KeepQueuedForNextStart())
        runs = [r for r in (self.registry.lookup(n) for n in self.registry.names("runs/")) if r is not None]
        for run in runs:
            run.tell(shutdown)
        if runs:
            waits = [asyncio.ensure_future(r.wait()) for r in runs]
            _, pending = await asyncio.wait(waits, timeout=grace)
            if pending:
                log.error("%d runs did not stop within %ss; marking them interrupted", len(pending), grace)
                for run in runs:
                    run.tell(Abandon())
                await asyncio.wait(pending, timeout=5.0)
        await self.store.drain()
        await self.web.stop()
        await self.studies.stop()
        await self.workers.stop()
        await self.runs.stop()
        await self.queues.stop()
        await self.ledgers.stop()
        await self.store.drain()
        self.store.close()  # the loop's connection; the store's own closes as it stops
        await self.root.stop(timeout=grace)
        self.node_pool.shutdown(wait=False, cancel_futures=True)
        self.executor_pool.shutdown(wait=False, cancel_futures=True)
        self.node_cache.clear()


def _simulated(settings: Settings) -> tuple[str, ...]:
    """The simulated cards this server pretends to have, filtered and ordered by its
    CUDA_VISIBLE_DEVICES as real ones are (a simulated card's uuid is its name)."""
    cards = [(index, f"GPU-sim-{index}") for d in settings.simulated_accelerators
             if (parsed := parse_device(d)) and parsed[0] == "cuda" and (index := parsed[1]) is not None]
    shown = [f"cuda:{i}" for i in visible_cards(settings.cuda_visible_devices, cards)]
    return tuple(shown + [d for d in settings.simulated_accelerators if not d.startswith("cuda:")])
