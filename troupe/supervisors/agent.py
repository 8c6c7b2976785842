"""The agent's tree: inventory (thread actor, NVML) and link (the outbound socket).

The agent never listens, never imports torch and never touches SQLite. It runs until
SIGTERM, Ctrl+C, or a final refusal from the control plane (exit 1); a one-shot agent
(in a batch job) until its one run is reported, exiting with how the run ended."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from troupe.actors.artifact_outbox import ArtifactOutbox, Flush, Usage, Wake
from troupe.actors.base import ActorRef, Registry
from troupe.actors.inventory import InventoryActor, Probe
from troupe.actors.link import Announce, Link, LinkConfig, Send, Settled
from troupe.actors.recorded_outputs import OutputsShelf
from troupe.actors.run_process import RunProcess, StopChild
from troupe.actors.threaded import ThreadActorRef, start_thread_actor
from troupe.actors.warm_pool import Stats, WarmPool
from troupe.protocol import worker as wire
from troupe.protocol.version import __version__
from troupe.subprocess_runner.catalog import load_catalog
from troupe.subprocess_runner.pack_probe import ImportLimits
from troupe.subprocess_runner.pack_sync import AgentPacks
from troupe.supervisors.supervisor import ChildSpec, Restart, Supervisor

log = logging.getLogger("troupe.agent")


@dataclass(frozen=True)
class AgentConfig:
    url: str
    name: str
    credential: str
    machine_id: str
    simulated_inventory: dict[str, Any] | None = None
    kill_grace_s: float = 10.0
    outbox_bytes: int = 64 * 1024 * 1024
    cuda_visible_devices: str | None = None  # the cards the agent offers, in CUDA's order
    # One-shot (a batch job's agent): one run, reported completely, then exit with its
    # outcome; without a run within ``idle_timeout_s``, exit 4.
    one_shot: bool = False
    idle_timeout_s: float = 600.0
    instance: str | None = None  # a batch array's task id: this agent is instance ``name#id``
    deadline: float | None = None  # when its batch job ends (epoch seconds)
    unix_socket: str | None = None  # dial the control plane through this socket (an ssh -R forward)
    mounts: dict[str, str] = field(default_factory=dict)  # storage labels: label -> path here
    # Where this agent keeps its runs' recorded outputs, and for how many runs.
    outputs_dir: Path | None = None
    recorded_outputs_keep: int = 20
    warm: int = 0  # run children kept forked from a zygote (``--warm N``)
    ddp_cpu_ranks: int = 0  # test-only (TROUPE_DDP_CPU_RANKS): DDP ranks on the CPU
    # Where runs' artifacts wait until the control plane has them, and how much it holds.
    artifact_outbox: Path | None = None
    artifact_outbox_bytes: int = 20 * 2**30
    ca: str | None = None  # trusted beside the system's authorities (an https control plane's own)
    data_roots: tuple[str, ...] = ()  # folders runs may read by absolute path (TROUPE_DATA_ROOTS)
    command_kill_grace_s: float = 5.0  # a cancelled command node's group: SIGTERM, then SIGKILL after it
    pack_dirs: tuple[Path, ...] = ()  # its own folders of packs (TROUPE_HOME/packs, TROUPE_PACKS, --packs)
    accept_packs: bool = False  # --accept-packs: fetch the control plane's folder packs as runs need them
    pack_cache: Path | None = None  # where fetched packs are kept, by digest
    # Its own folder packs are imported first in a child under these (pack_probe).
    pack_import: ImportLimits = field(default_factory=ImportLimits)


# A one-shot agent's exit code: how its run ended (interrupted: the control plane
# stopped holding it), or that none came.
ONE_SHOT_EXIT = {"succeeded": 0, "failed": 1, "cancelled": 2, "interrupted": 3}
NO_RUN_CAME = 4
SETTLE_ON_STOP_S = 5.0  # how long a stopping agent waits for its last frames to be acknowledged
IDLE_SETTLE_S = 2.0  # an idle one-shot agent, draining, waits this long for a run already placed on it


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.exit_code = 0
        self._finished = asyncio.Event()  # set by a final refusal from the control plane

    async def run(self, stop: asyncio.Event, drain: asyncio.Event | None = None) -> int:
        """Until ``stop`` (stop now: running runs are cancelled, killed after the grace),
        or ``drain`` (no new runs; stop once the running ones have ended)."""
        tree = _Tree(self.config, self._final)
        try:
            link = await tree.start()
        except BaseException:
            await tree.root.stop(timeout=10)  # its thread actors would keep the process alive
            raise
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(stop.wait()),
                                            asyncio.ensure_future(self._finished.wait())]
        one_shot = asyncio.ensure_future(self._one_shot(tree.one_shot, link)) if self.config.one_shot else None
        if one_shot is not None:
            waits.append(one_shot)
        if drain is not None:
            waits.append(asyncio.ensure_future(self._drain(drain, tree, link, stop)))
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        told = one_shot is not None and one_shot.done() and not one_shot.cancelled()
        for wait in waits:
            wait.cancel()
        if self._finished.is_set() and self.config.one_shot and self.exit_code == 0:
            # Ended from outside (an SSH forward gone) before its run was reported: 0 would
            # tell the batch job that a run succeeded.
            self.exit_code = ONE_SHOT_EXIT["interrupted"] if tree.one_shot.taken else NO_RUN_CAME
        if not self._finished.is_set():
            await self._end_runs(tree.registry, link)
            if one_shot is not None and not told:  # stopped (scancel, a drain) before its run was over
                self.exit_code = ONE_SHOT_EXIT.get(tree.one_shot.status or "interrupted", 3) \
                    if tree.one_shot.taken else NO_RUN_CAME
        await tree.runs.stop(timeout=self.config.kill_grace_s + 5)
        await tree.root.stop(timeout=10)
        return self.exit_code

    def _final(self, code: int, reason: str) -> None:
        """The link's word that the control plane refused this agent for good."""
        log.error("%s", reason)
        print(f"troupe agent: {reason}", flush=True)
        self.exit_code = code
        self._finished.set()

    async def _end_runs(self, registry: Registry, link: ActorRef | ThreadActorRef) -> None:
        """Stopping with runs still going: each is cancelled (killed after the grace) and
        its end reported while the link is up, so none is left for the control plane to
        wait out."""
        for name in registry.names("run/"):
            ref = registry.lookup(name)
            if ref is not None:
                ref.tell(StopChild())
        deadline = asyncio.get_running_loop().time() + self.config.kill_grace_s + 5
        while registry.names("run/") and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(await link.ask(Settled()), SETTLE_ON_STOP_S)

    async def _drain(self, drain: asyncio.Event, tree: _Tree, link: ActorRef | ThreadActorRef,
                     stop: asyncio.Event) -> None:
        """``troupe agent stop``: the control plane sends no new runs; the running ones end
        by themselves and are reported (``stop`` cuts the wait short)."""
        await drain.wait()
        print("troupe agent: draining: no new runs; stopping once the running ones have ended", flush=True)
        tree.draining = True  # and each hello from now on says so
        link.tell(Announce(wire.Drain()))
        while tree.registry.names("run/") and not stop.is_set():
            await asyncio.sleep(0.2)
        await (await link.ask(Settled()))

    async def _one_shot(self, one_shot: _OneShot, link: ActorRef | ThreadActorRef) -> None:
        """Takes one run, waits until it is reported completely, and sets the exit code."""
        try:
            await asyncio.wait_for(one_shot.assigned.wait(), self.config.idle_timeout_s)
        except TimeoutError:
            # The control plane may have placed a run here just now: it is told to send no
            # more, and a run already on its way is taken rather than lost with the agent.
            print(f"troupe agent: one-shot: idle for {self.config.idle_timeout_s:g} s; draining", flush=True)
            link.tell(Announce(wire.Drain()))
            try:
                await asyncio.wait_for(one_shot.assigned.wait(), IDLE_SETTLE_S)
            except TimeoutError:
                print(f"troupe agent: one-shot: no run came within {self.config.idle_timeout_s:g} s", flush=True)
                self.exit_code = NO_RUN_CAME
                return
        await one_shot.ended.wait()
        await (await link.ask(Settled()))
        self.exit_code = ONE_SHOT_EXIT.get(one_shot.status or "interrupted", 3)
        print(f"troupe agent: one-shot: run {one_shot.taken} {one_shot.status}, reported; exiting "
              f"{self.exit_code}", flush=True)


class _Tree:
    """The actors of one ``Agent.run``, held together because the link's callbacks (the
    Hello, frames in and out, heartbeats) read them all."""

    def __init__(self, config: AgentConfig, final: Callable[[int, str], None]) -> None:
        self.config = config
        self.final = final
        self.catalog = load_catalog(config.pack_dirs, config.pack_import)
        for pack, error in self.catalog.broken_packs.items():
            log.error("pack %s was not loaded: %s", pack, error)
        self.root: Supervisor[ActorRef | ThreadActorRef] = Supervisor("agent")
        self.registry = Registry()
        self.inventory = self.root.start_child(ChildSpec("inventory", lambda: start_thread_actor(
            InventoryActor, "inventory", config.simulated_inventory, config.cuda_visible_devices)))
        self.one_shot = _OneShot()
        self.control_plane = {"url": config.url, "unix_socket": config.unix_socket,
                              "credential": config.credential, "ca": config.ca}
        self.packs = AgentPacks(self.catalog.folder_packs, config.accept_packs, config.pack_cache, self.control_plane)
        self.artifacts: ActorRef | None = None
        self.outbox_spec: dict[str, Any] | None = None
        self.shelf: OutputsShelf | None = None
        self.runs: Supervisor[ActorRef] = Supervisor("runs")
        self.pool: ActorRef | ThreadActorRef | None = None
        self.link: ActorRef | ThreadActorRef | None = None
        # Whether run children may hand on frames: the link clears it while its outbox is
        # too full to take more without dropping (troupe/actors/link.py).
        self.room = threading.Event()
        self.room.set()
        self.draining = False

    async def start(self) -> ActorRef | ThreadActorRef:
        """The link starts last: its Hello, sent as soon as it connects, reads the others
        (and an outbox sends what an earlier agent left before any new run's artifacts)."""
        config = self.config
        if config.artifact_outbox is not None:
            folder, limit = config.artifact_outbox, config.artifact_outbox_bytes
            started = self.root.start_child(ChildSpec("artifact-outbox", lambda: ArtifactOutbox(
                folder, limit, self.control_plane).start(self.registry)))
            assert isinstance(started, ActorRef)
            self.artifacts, self.outbox_spec = started, {"folder": str(folder), "bytes": limit}
            # What an earlier agent here left (killed, or its control plane away) goes first.
            await (await started.ask(Flush()))
        self.shelf = OutputsShelf(config.outputs_dir, config.recorded_outputs_keep) \
            if config.outputs_dir is not None else None
        self.pool = self.root.start_child(ChildSpec("warm-pool", lambda: WarmPool(config.warm).start(
            self.registry))) if config.warm > 0 else None
        link_config = LinkConfig(config.url, config.credential, self.hello, self.final, self.on_frame,
                                 config.outbox_bytes, self.heartbeat, config.unix_socket, config.ca, self.room)
        self.link = self.root.start_child(ChildSpec("link", lambda: Link(link_config).start(self.registry)))
        return self.link

    async def hello(self) -> wire.Hello:
        if self.artifacts is not None:
            self.artifacts.tell(Wake())  # (re)connected: the control plane may be back
        found = await self.inventory.ask(Probe())
        running = [name.removeprefix("run/") for name in self.registry.names("run/")]
        config = self.config
        return wire.Hello(version=__version__, name=config.name, machine_id=config.machine_id,
                          catalog_digest=self.catalog.digest, node_types=sorted(self.catalog.types), inventory=found,
                          runs=running, one_shot=config.one_shot, spent=bool(self.one_shot.taken),
                          instance=config.instance, deadline=config.deadline, mounts=config.mounts,
                          accept_packs=config.accept_packs, installed_digest=self.catalog.installed_digest,
                          broken_packs=dict(self.catalog.broken_packs), draining=self.draining)

    async def heartbeat(self) -> wire.Heartbeat:
        found = await self.inventory.ask(Probe())
        usage = None
        if self.artifacts is not None:
            held, entries, full = await self.artifacts.ask(Usage())
            usage = wire.ArtifactOutboxUsage(bytes=held, entries=entries, full=full)
        return wire.Heartbeat(free_mib={card.uuid: card.memory_free_mib for card in found.cards},
                              warm=await self.pool.ask(Stats()) if self.pool is not None else None,
                              artifact_outbox=usage)

    def send(self, *frames: Any) -> None:
        for frame in frames:
            if isinstance(frame, wire.RunEnded):
                self.one_shot.end(frame.status)
        if self.link is not None:
            self.link.tell(Send(frames))

    def on_frame(self, frame: Any) -> None:
        if isinstance(frame, wire.Assign):
            self._assign(frame)
        elif isinstance(frame, wire.ReadOutputs) and self.link is not None:
            kept = self.shelf.read(frame.run_id, frame.node_id) if self.shelf is not None else None
            self.link.tell(Announce(wire.Outputs(request=frame.request, found=kept is not None, outputs=kept or {})))
        elif isinstance(frame, wire.CancelRun | wire.KillRun):
            if isinstance(frame, wire.KillRun) and frame.run_id == self.one_shot.taken:
                self.one_shot.end("interrupted")
            running = self.registry.lookup(f"run/{frame.run_id}")
            if running is not None:
                running.tell(StopChild(kill=isinstance(frame, wire.KillRun)))

    def _assign(self, frame: wire.Assign) -> None:
        config = self.config
        if config.one_shot and self.one_shot.taken:
            log.warning("one-shot agent: run %s was offered after its one run; not taken", frame.run_id)
            return
        if config.one_shot:
            self.one_shot.take(frame.run_id)
        process = RunProcess(frame, self.send, config.kill_grace_s, config.mounts, self.control_plane, self.shelf,
                             self.pool, config.ddp_cpu_ranks, self.outbox_spec, self.artifacts, config.data_roots,
                             self.room, config.command_kill_grace_s, self.packs)
        self.runs.start_child(ChildSpec(process.name, lambda: process.start(self.registry), Restart.TEMPORARY))


class _OneShot:
    """What a one-shot agent did with its one run."""

    def __init__(self) -> None:
        self.taken: str | None = None
        self.status: str | None = None
        self.assigned = asyncio.Event()
        self.ended = asyncio.Event()

    def take(self, run_id: str) -> None:
        self.taken = run_id
        self.assigned.set()

    def end(self, status: str) -> None:
        if self.status is None:
            self.status = status
        self.ended.set()
