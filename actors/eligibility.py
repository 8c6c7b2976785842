"""Which worker a submission may go to: the one place for the rules of ``options.target``
(a named worker, ``any``, several devices, drain, degraded catalogs, ``wait``).

The placer owns the one ``WorkerBook`` (filled by the worker connections' ``WorkerOnline``
and ``WorkerOffline``) and answers ``ResolveTarget`` asks from every submitter (the run
and sweep routes, studies), so no web module decides placement. It is not an actor: the
placer calls it from its own mailbox.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol import events as ev
from protocol.api import RunOptions
from protocol.errors import CapacityRefused, InvalidRequest
from protocol.settings import ANY_PREFIX

ANY = ANY_PREFIX.rstrip("/")


@dataclass(frozen=True)
class WorkerOffer:
    """What a worker offered when it last connected; for target ``any``, the union of
    every eligible worker's devices and the largest cpu count."""

    name: str
    devices: tuple[str, ...]
    cpus: int
    node_types: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ResolveTarget:
    """Ask (of the placer): what the worker a submission targets offers, None for the
    control plane itself; refuses a target that can never or may not be served now."""

    options: RunOptions
    node_types: frozenset[str] = frozenset()


class WorkerBook:
    """Every worker seen since this server started and whether it takes runs now."""

    def __init__(self, catalog_types: frozenset[str]) -> None:
        self._catalog_types = catalog_types
        self._seen: dict[str, WorkerOffer] = {}
        self._taking: set[str] = set()  # connected and not draining

    def online(self, offer: WorkerOffer, draining: bool) -> None:
        self._seen[offer.name] = offer
        (self._taking.discard if draining else self._taking.add)(offer.name)

    def offline(self, name: str) -> None:
        self._taking.discard(name)

    def resolve(self, options: RunOptions, node_types: frozenset[str]) -> WorkerOffer | None:
        target = options.target
        name = target.remote if target is not None else None
        if name is None or target is None:
            return None
        if options.lane == ev.LANE_INTERACTIVE:
            raise InvalidRequest("interactive runs execute in the control plane; drop the target or the lane",
                                 pointer="/options/lane")
        if name == ANY:
            eligible = self._eligible()
            self._check_wait(target.wait, eligible)
            return self._union(eligible)
        offer = self._seen.get(name)
        if offer is None:
            raise InvalidRequest(f"no worker {name!r} has connected since this server started",
                                 pointer="/options/target/worker", code="unknown_target")
        lacking = sorted(node_types - offer.node_types)
        if lacking:
            raise InvalidRequest(f"worker {name} lacks the node types {lacking}", pointer="/options/target/worker",
                                 code="worker_lacks_node_types")
        self._check_wait(target.wait, [name])
        return offer

    def _eligible(self) -> list[str]:
        """The workers target ``any`` may use: those with every node type of this server
        (a degraded worker lacking some is skipped). 400 when there is none."""
        eligible = sorted(name for name, offer in self._seen.items() if not self._catalog_types - offer.node_types)
        if not eligible:
            seen = sorted(self._seen)
            raise InvalidRequest(
                f"target any needs a worker with every node type of this server; {len(seen)} seen since start"
                + (f" ({', '.join(seen)}), none has them all" if seen else ""),
                pointer="/options/target/worker", code="no_eligible_worker")
        return eligible

    def _union(self, names: list[str]) -> WorkerOffer:
        offers = [self._seen[name] for name in names]
        return WorkerOffer(ANY, tuple(sorted({d for offer in offers for d in offer.devices})),
                           max(offer.cpus for offer in offers), frozenset(self._catalog_types))

    def _check_wait(self, wait: bool | None, candidates: list[str]) -> None:
        """``wait: false`` refuses the run at once when no candidate worker is connected
        and taking runs, instead of letting it wait for one."""
        if wait is not False or any(name in self._taking for name in candidates):
            return
        raise CapacityRefused(
            f"no worker of {', '.join(candidates)} is connected and taking runs, and options.target.wait is "
            "false; submit with wait true to queue the run until one is", pointer="/options/target/wait",
            code="worker_offline")
