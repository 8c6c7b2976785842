"""The agent's tree: inventory (thread actor, NVML) and link (the outbound socket).

The agent never listens, never imports torch and never touches SQLite. It runs until
SIGTERM, Ctrl+C, or a final refusal from the control plane (exit 1)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from actors.inventory import InventoryActor, Probe
from actors.link import Link, LinkConfig
from actors.threaded import start_thread_actor
from protocol import worker as wire
from protocol.version import __version__
from subprocess_runner.catalog import load_catalog
from supervisors.supervisor import ChildSpec, Supervisor

log = logging.getLogger("troupe.agent")


@dataclass(frozen=True)
class AgentConfig:
    url: str
    name: str
    credential: str
    machine_id: str
    simulated_inventory: dict[str, Any] | None = None


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.exit_code = 0

    async def run(self, stop: asyncio.Event) -> int:
        catalog = load_catalog()
        root = Supervisor("agent")
        inventory = root.start_child(ChildSpec("inventory", lambda: start_thread_actor(
            InventoryActor, "inventory", self.config.simulated_inventory)))
        finished = asyncio.Event()

        def final(code: int, reason: str) -> None:
            log.error("%s", reason)
            print(f"troupe agent: {reason}", flush=True)
            self.exit_code = code
            finished.set()

        async def hello() -> wire.Hello:
            found = await inventory.ask(Probe())  # type: ignore[attr-defined]  # a ThreadActorRef
            return wire.Hello(version=__version__, name=self.config.name, machine_id=self.config.machine_id,
                              catalog_digest=catalog.digest, node_types=sorted(catalog.types), inventory=found)

        root.start_child(ChildSpec("link", lambda: Link(LinkConfig(
            self.config.url, self.config.credential, hello, final)).start()))
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(finished.wait())]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()
        await root.stop(timeout=10)
        return self.exit_code
