"""What the web layer is handed by the control plane: settings, the catalog, the store's
asyncio face and the registry in which it finds actors by name."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from aiohttp import web

from troupe.actors.base import ActorRef, Registry
from troupe.actors.errors import ActorDeadError
from troupe.actors.run_tally import RunTally
from troupe.actors.ssh_session import SshTarget
from troupe.actors.store import StoreClient
from troupe.protocol.settings import Settings
from troupe.subprocess_runner.catalog import Catalog
from troupe.subprocess_runner.node_cache import NodeCache
from troupe.web.login import LoginBook


@dataclass
class Services:
    settings: Settings
    catalog: Catalog
    store: StoreClient
    registry: Registry
    token: str
    version: str
    accelerators: tuple[str, ...] = ()
    started_at: str = ""
    # The URL this server is reached at (TROUPE_PUBLIC_URL, else the address it bound).
    public_url: str = ""
    # Bound beyond loopback: the names it is reached by (admitted as Host), and whether
    # every read needs a session then.
    lan_hosts: tuple[str, ...] = ()
    # Starts (or wakes) the actor that drives a running study; the root provides it.
    start_study: Callable[[str], None] = lambda study_id: None
    # Finds or starts the WorkerConnection actor of an enrolled worker.
    start_worker: Callable[[str], ActorRef] = lambda name: None  # type: ignore[assignment,return-value]  # a stand-in; the root sets it
    # Node outputs of editor sessions, kept between their interactive runs.
    node_cache: NodeCache = field(default_factory=lambda: NodeCache(0))
    # Login links and the cookies of logged-in browsers.
    login: LoginBook = field(default_factory=LoginBook)
    # Workers whose connection actor kept crashing, or whose SSH session cannot be kept
    # up, with the reason: an immutable snapshot of the root's record, which only the
    # root changes (``forget_failed`` when a worker is removed).
    failed_workers: Callable[[], Mapping[str, str]] = lambda: {}
    forget_failed: Callable[[str], str | None] = lambda name: None
    # Opens the SSH session of a worker served over ``ssh -R``; None when one is open.
    start_ssh: Callable[[SshTarget], ActorRef | None] = lambda target: None
    # What runs did since the server started (counters, histograms) for /metrics.
    tally: RunTally = field(default_factory=RunTally)

    def actor(self, name: str) -> ActorRef:
        ref = self.registry.lookup(name)
        if ref is None:
            raise ActorDeadError(f"{name} is not running")
        return ref


SERVICES = web.AppKey("services", Services)


def services(request: web.Request) -> Services:
    return request.app[SERVICES]
