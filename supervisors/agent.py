"""The agent's tree: inventory (thread actor, NVML) and link (the outbound socket).

The agent never listens, never imports torch and never touches SQLite. It runs until
SIGTERM, Ctrl+C, or a final refusal from the control plane (exit 1)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from actors.base import ActorRef, Registry
from actors.inventory import InventoryActor, Probe
from actors.link import Link, LinkConfig, Send
from actors.run_process import Cancel as RunCancel
from actors.run_process import RunProcess
from actors.threaded import ThreadActorRef, start_thread_actor
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


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.exit_code = 0

    async def run(self, stop: asyncio.Event) -> int:
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
            found = await inventory.ask(Probe())
            running = [name.removeprefix("run/") for name in registry.names("run/")]
            return wire.Hello(version=__version__, name=self.config.name, machine_id=self.config.machine_id,
                              catalog_digest=catalog.digest, node_types=sorted(catalog.types), inventory=found,
                              runs=running)

        link_holder: list[Any] = []

        def send(*frames: Any) -> None:
            if link_holder:
                link_holder[0].tell(Send(frames))

        def on_frame(frame: Any) -> None:
            if isinstance(frame, wire.Assign):
                process = RunProcess(frame, send, self.config.kill_grace_s)
                runs.start_child(ChildSpec(process.name, lambda: process.start(registry), Restart.TEMPORARY))
            elif isinstance(frame, wire.CancelRun | wire.KillRun):
                running = registry.lookup(f"run/{frame.run_id}")
                if running is not None:
                    running.tell(RunCancel(kill=isinstance(frame, wire.KillRun)))

        runs: Supervisor[ActorRef] = Supervisor("runs")
        async def free_memory() -> dict[str, int]:
            found = await inventory.ask(Probe())
            return {card.uuid: card.memory_free_mib for card in found.cards}

        link_config = LinkConfig(self.config.url, self.config.credential, hello, final, on_frame,
                                 self.config.outbox_bytes, free_memory)
        link = root.start_child(ChildSpec("link", lambda: Link(link_config).start(registry)))
        link_holder.append(link)
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(finished.wait())]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()
        await runs.stop(timeout=self.config.kill_grace_s + 5)
        await root.stop(timeout=10)
        return self.exit_code
