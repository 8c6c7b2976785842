"""The agent's tree: inventory (thread actor, NVML) and link (the outbound socket).

The agent never listens, never imports torch and never touches SQLite. It runs until
SIGTERM, Ctrl+C, or a final refusal from the control plane (exit 1); a one-shot agent
(in a batch job) until its one run is reported, exiting with how the run ended."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors.artifact_outbox import ArtifactOutbox, Flush, Usage, Wake
from actors.base import ActorRef, Registry
from actors.inventory import InventoryActor, Probe
from actors.link import Announce, Link, LinkConfig, Send, Settled
from actors.recorded_outputs import OutputsShelf
from actors.run_process import RunProcess, StopChild
from actors.threaded import ThreadActorRef, start_thread_actor
from actors.warm_pool import Stats, WarmPool
from protocol import worker as wire
from protocol.version import __version__
from subprocess_runner.catalog import load_catalog
from supervisors.supervisor import ChildSpec, Restart, Supervisor

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
    warm: int = 0  # run children kept started, torch imported (``--warm N``)
    ddp_cpu_ranks: int = 0  # test-only (TROUPE_DDP_CPU_RANKS): DDP ranks on the CPU
    # Where runs' artifacts wait until the control plane has them, and how much it holds.
    artifact_outbox: Path | None = None
    artifact_outbox_bytes: int = 20 * 2**30
    ca: str | None = None  # trusted beside the system's authorities (an https control plane's own)


# A one-shot agent's exit code: how its run ended (interrupted: the control plane
# stopped holding it), or that none came.
ONE_SHOT_EXIT = {"succeeded": 0, "failed": 1, "cancelled": 2, "interrupted": 3}
NO_RUN_CAME = 4
SETTLE_ON_STOP_S = 5.0  # how long a stopping agent waits for its last frames to be acknowledged


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.exit_code = 0

    async def run(self, stop: asyncio.Event, drain: asyncio.Event | None = None) -> int:
        """Until ``stop`` (stop now: running runs are cancelled, killed after the grace),
        or ``drain`` (no new runs; stop once the running ones have ended)."""
        catalog = load_catalog()
        root: Supervisor[ActorRef | ThreadActorRef] = Supervisor("agent")
        registry = Registry()
        inventory = root.start_child(ChildSpec("inventory", lambda: start_thread_actor(
            InventoryActor, "inventory", self.config.simulated_inventory, self.config.cuda_visible_devices)))
        finished = asyncio.Event()

        def final(code: int, reason: str) -> None:
            log.error("%s", reason)
            print(f"troupe agent: {reason}", flush=True)
            self.exit_code = code
            finished.set()

        async def hello() -> wire.Hello:
            if artifacts is not None:
                artifacts.tell(Wake())  # (re)connected: the control plane may be back
            found = await inventory.ask(Probe())
            running = [name.removeprefix("run/") for name in registry.names("run/")]
            return wire.Hello(version=__version__, name=self.config.name, machine_id=self.config.machine_id,
                              catalog_digest=catalog.digest, node_types=sorted(catalog.types), inventory=found,
                              runs=running, one_shot=self.config.one_shot, spent=bool(one_shot.taken),
                              instance=self.config.instance, deadline=self.config.deadline,
                              mounts=self.config.mounts)

        link_holder: list[Any] = []
        one_shot = _OneShot()
        control_plane = {"url": self.config.url, "unix_socket": self.config.unix_socket,
                         "credential": self.config.credential, "ca": self.config.ca}
        artifacts: ActorRef | None = None
        outbox_spec: dict[str, Any] | None = None
        if self.config.artifact_outbox is not None:
            folder, limit = self.config.artifact_outbox, self.config.artifact_outbox_bytes
            started = root.start_child(ChildSpec("artifact-outbox", lambda: ArtifactOutbox(
                folder, limit, control_plane).start(registry)))
            assert isinstance(started, ActorRef)
            artifacts, outbox_spec = started, {"folder": str(folder), "bytes": limit}
            # What an earlier agent here left (killed, or its control plane away) goes first.
            await (await started.ask(Flush()))
        shelf = OutputsShelf(self.config.outputs_dir, self.config.recorded_outputs_keep) \
            if self.config.outputs_dir is not None else None

        def send(*frames: Any) -> None:
            for frame in frames:
                if isinstance(frame, wire.RunEnded):
                    one_shot.end(frame.status)
            if link_holder:
                link_holder[0].tell(Send(frames))

        def on_frame(frame: Any) -> None:
            if isinstance(frame, wire.Assign):
                if self.config.one_shot and one_shot.taken:
                    log.warning("one-shot agent: run %s was offered after its one run; not taken", frame.run_id)
                    return
                if self.config.one_shot:
                    one_shot.take(frame.run_id)
                process = RunProcess(frame, send, self.config.kill_grace_s, self.config.mounts, control_plane, shelf,
                                     pool, self.config.ddp_cpu_ranks, outbox_spec, artifacts)
                runs.start_child(ChildSpec(process.name, lambda: process.start(registry), Restart.TEMPORARY))
            elif isinstance(frame, wire.ReadOutputs) and link_holder:
                kept = shelf.read(frame.run_id, frame.node_id) if shelf is not None else None
                link_holder[0].tell(Announce(wire.Outputs(request=frame.request, found=kept is not None,
                                                          outputs=kept or {})))
            elif isinstance(frame, wire.CancelRun | wire.KillRun):
                if isinstance(frame, wire.KillRun) and frame.run_id == one_shot.taken:
                    one_shot.end("interrupted")
                running = registry.lookup(f"run/{frame.run_id}")
                if running is not None:
                    running.tell(StopChild(kill=isinstance(frame, wire.KillRun)))

        runs: Supervisor[ActorRef] = Supervisor("runs")
        pool = root.start_child(ChildSpec("warm-pool", lambda: WarmPool(self.config.warm).start(registry))) \
            if self.config.warm > 0 else None

        async def heartbeat() -> wire.Heartbeat:
            found = await inventory.ask(Probe())
            usage = None
            if artifacts is not None:
                held, entries, full = await artifacts.ask(Usage())
                usage = wire.ArtifactOutboxUsage(bytes=held, entries=entries, full=full)
            return wire.Heartbeat(free_mib={card.uuid: card.memory_free_mib for card in found.cards},
                                  warm=await pool.ask(Stats()) if pool is not None else None, artifact_outbox=usage)

        link_config = LinkConfig(self.config.url, self.config.credential, hello, final, on_frame,
                                 self.config.outbox_bytes, heartbeat, self.config.unix_socket, self.config.ca)
        link = root.start_child(ChildSpec("link", lambda: Link(link_config).start(registry)))
        link_holder.append(link)
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(stop.wait()),
                                            asyncio.ensure_future(finished.wait())]
        if self.config.one_shot:
            waits.append(asyncio.ensure_future(self._one_shot(one_shot, link)))
        if drain is not None:
            waits.append(asyncio.ensure_future(self._drain(drain, link, registry, stop)))
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()
        if not finished.is_set():
            await self._end_runs(registry, link)
        await runs.stop(timeout=self.config.kill_grace_s + 5)
        await root.stop(timeout=10)
        return self.exit_code

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

    async def _drain(self, drain: asyncio.Event, link: ActorRef | ThreadActorRef, registry: Registry,
                     stop: asyncio.Event) -> None:
        """``troupe agent stop``: the control plane sends no new runs; the running ones end
        by themselves and are reported (``stop`` cuts the wait short)."""
        await drain.wait()
        print("troupe agent: draining: no new runs; stopping once the running ones have ended", flush=True)
        link.tell(Announce(wire.Drain()))
        while registry.names("run/") and not stop.is_set():
            await asyncio.sleep(0.2)
        await (await link.ask(Settled()))

    async def _one_shot(self, one_shot: _OneShot, link: ActorRef | ThreadActorRef) -> None:
        """Takes one run, waits until it is reported completely, and sets the exit code."""
        try:
            await asyncio.wait_for(one_shot.assigned.wait(), self.config.idle_timeout_s)
        except TimeoutError:
            print(f"troupe agent: one-shot: no run came within {self.config.idle_timeout_s:g} s", flush=True)
            self.exit_code = NO_RUN_CAME
            return
        await one_shot.ended.wait()
        await (await link.ask(Settled()))
        self.exit_code = ONE_SHOT_EXIT.get(one_shot.status or "interrupted", 3)
        print(f"troupe agent: one-shot: run {one_shot.taken} {one_shot.status}, reported; exiting "
              f"{self.exit_code}", flush=True)


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
