"""Which worker a submission may go to: the one place for the rules of ``options.target``
(a named worker, ``any``, several devices, drain, degraded catalogs, ``wait``).

The placer applies these rules to every submission it admits (``Submit``: runs, sweeps,
study attempts), read against its one ``WorkerBook`` (``book.py``), so no web module
decides placement; ``ResolveTarget`` asks it what a target would reach. It is not an
actor: the placer calls it from its own mailbox.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from troupe.actors.placer.book import WorkerBook, WorkerOffer
from troupe.protocol import events as ev
from troupe.protocol.api import RunOptions
from troupe.protocol.errors import CapacityRefused, InvalidRequest
from troupe.protocol.queue_key import ANY_POOL as ANY
from troupe.protocol.queue_key import ONE_SHOT_POOL as ONE_SHOT
from troupe.subprocess_runner.errors import PackBrokenNode

# The cpu count of ``any`` before any worker was seen: no node's declared cpus are refused.
UNKNOWN_CPUS = 1 << 20


@dataclass(frozen=True)
class ResolveTarget:
    """Ask (of the placer): what the worker a submission targets offers, None for the
    control plane itself; refuses a target that can never or may not be served now."""

    options: RunOptions
    node_types: frozenset[str] = frozenset()


class Eligibility:
    """The rules of ``options.target``, read against the placer's book of workers."""

    def __init__(self, book: WorkerBook) -> None:
        self._book = book

    def resolve(self, options: RunOptions, node_types: frozenset[str]) -> WorkerOffer | None:
        target = options.target
        pool = target.pool if target is not None else None
        # Both keys given is the conflict, null or not: the document says so ({"not": {"required": [...]}}).
        if target is not None and {"pool", "worker"} <= target.model_fields_set:
            raise InvalidRequest("options.target names a worker and a pool; give one", pointer="/options/target/pool",
                                 code="target_conflict")
        name = ONE_SHOT if pool is not None else target.remote if target is not None else None
        if name is None or target is None:
            return None
        if options.lane == ev.LANE_INTERACTIVE:
            raise InvalidRequest("interactive runs execute in the control plane; drop the target or the lane",
                                 pointer="/options/lane")
        if name in (ANY, ONE_SHOT):
            able = self._able(node_types, one_shot=name == ONE_SHOT)
            self._check_wait(target.wait, able)
            offer = self._union(name, able, node_types)
        else:
            offer = self._named(name, node_types)
            self._check_wait(target.wait, self._book.instances(name) or [name])
        if offer.one_shot and options.record_outputs:
            raise InvalidRequest("a one-shot agent exits after its run, so recorded outputs could never be read; drop "
                                 "record_outputs or the one-shot target", pointer="/options/record_outputs",
                                 code="one_shot_record_outputs")
        return offer

    def _named(self, name: str, node_types: frozenset[str]) -> WorkerOffer:
        instances = self._book.instances(name)
        offer = self._book.seen.get(name) or (replace(self._book.seen[instances[-1]], name=name) if instances else None)
        if offer is None:
            raise InvalidRequest(f"no worker {name!r} has connected since this server started",
                                 pointer="/options/target/worker", code="unknown_target")
        lacking = sorted(node_types - offer.node_types)
        broken = _broken_there(offer, lacking)
        if broken:  # as in this server: the pack's error, not an unknown type
            raise PackBrokenNode("; ".join(broken), pointer="/options/target/worker")
        if lacking:
            raise InvalidRequest(f"worker {name} lacks the node types {lacking}", pointer="/options/target/worker",
                                 code="worker_lacks_node_types")
        return offer

    def _able(self, node_types: frozenset[str], one_shot: bool) -> list[str]:
        """The workers of the pool (``any``: the lasting ones; one-shot: the batch jobs'
        agents) seen since start that have every node type the graph uses (#777). None
        seen yet: the run waits for one. Some seen and none of them able: it could never
        run, a 400 with the numbers."""
        seen = {name: offer for name, offer in self._book.seen.items() if offer.one_shot == one_shot}  # instances too
        able = sorted(name for name, offer in seen.items() if node_types <= offer.node_types)
        if seen and not able:
            lacking = {name: sorted(node_types - offer.node_types) for name, offer in sorted(seen.items())}
            broken = [why for name, missing in lacking.items() for why in _broken_there(seen[name], missing)]
            message = (f"target {ONE_SHOT if one_shot else ANY} needs a worker with the node types this graph uses; "
                       f"{len(seen)} seen since start, none has them all: "
                       + "; ".join(f"{name} lacks {', '.join(missing)}" for name, missing in lacking.items()))
            if broken:
                raise PackBrokenNode(f"{message} ({'; '.join(broken)})", pointer="/options/target/worker")
            raise InvalidRequest(message, pointer="/options/target/worker", code="no_eligible_worker")
        return able

    def _union(self, pool: str, names: list[str], node_types: frozenset[str]) -> WorkerOffer:
        """What the able workers offer together; with none seen yet, nothing is known:
        no devices (the run keeps the device it asked for) and no cpu bound."""
        offers = [self._book.seen[name] for name in names]
        if not offers:
            return WorkerOffer(pool, (), UNKNOWN_CPUS, node_types, cards=UNKNOWN_CPUS, one_shot=pool == ONE_SHOT)
        largest = max(offers, key=lambda offer: (offer.card_count, offer.cpus))
        return WorkerOffer(pool, tuple(sorted({d for offer in offers for d in offer.devices})),
                           largest.cpus, node_types, cards=largest.card_count, one_shot=pool == ONE_SHOT,
                           mounts=frozenset().union(*(offer.mounts for offer in offers)))

    def _check_wait(self, wait: bool | None, candidates: list[str]) -> None:
        """``wait: false`` refuses the run at once when no candidate worker is connected
        and taking runs, instead of letting it wait for one."""
        if wait is not False or any(name in self._book.taking for name in candidates):
            return
        raise CapacityRefused(
            f"no worker of {', '.join(candidates)} is connected and taking runs, and options.target.wait is "
            "false; submit with wait true to queue the run until one is", pointer="/options/target/wait",
            code="worker_offline")


def _broken_there(offer: WorkerOffer, lacking: list[str]) -> list[str]:
    """Why the worker lacks those of ``lacking`` whose pack failed to load there (its
    hello says which and why), one line per pack."""
    broken = dict(offer.broken_packs)
    packs: dict[str, list[str]] = {}
    for node_type in lacking:
        pack = node_type.split(".", 1)[0]
        if pack in broken:
            packs.setdefault(pack, []).append(node_type)
    return [f"{', '.join(types)}: pack {pack} failed to load on worker {offer.name}: {broken[pack]}"
            for pack, types in packs.items()]
