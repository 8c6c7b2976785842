"""The placer's one book of workers: every worker seen since this server started, what
it offered when it last connected, whether it takes runs now, and which one-shot agents
have taken their run. Eligibility (may a submission go there?) and placement (where
does a run hold its slots?) both read it; the placer fills it from the connections'
``WorkerOnline``/``WorkerOffline`` and placement marks a one-shot agent spent. It is not
an actor: it lives inside the placer and is used on the placer's turn only."""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass
from types import MappingProxyType

INSTANCE_MARK = "#"  # a batch array's task: the connection of instance ``id`` is ``name#id``
MOUNT_NEED = "mount:"  # a graph that reads label ``x`` needs a worker that mounts it: ``mount:x``


@dataclass(frozen=True)
class WorkerOffer:
    """What a worker offered when it last connected; for target ``any``, the union of
    every eligible worker's devices, and the cpus and cards of the largest one of them:
    one real machine, which is what an ask no machine can grant is cut down to."""

    name: str
    devices: tuple[str, ...]
    cpus: int
    node_types: frozenset[str] = frozenset()
    cards: int | None = None  # None: count the cuda devices
    one_shot: bool = False  # an agent in a batch job: one run, then it exits
    spent: bool = False  # a one-shot agent that has taken its run
    deadline: float | None = None  # when its batch job ends (epoch seconds)
    mounts: frozenset[str] = frozenset()  # the storage labels it holds
    broken_packs: tuple[tuple[str, str], ...] = ()  # its own packs that failed to load: (name, why)

    @property
    def card_count(self) -> int:
        return self.cards if self.cards is not None else sum(1 for d in self.devices if d.startswith("cuda"))

    @property
    def abilities(self) -> frozenset[str]:
        """What a run's graph may need of it: its node types and ``mount:`` its labels."""
        return self.node_types | {f"{MOUNT_NEED}{label}" for label in self.mounts}


class WorkerBook:
    def __init__(self) -> None:
        self._seen: dict[str, WorkerOffer] = {}
        self._taking: set[str] = set()  # connected and not draining
        self._spent: set[str] = set()  # one-shot agents that have taken their run
        self._instances: dict[str, set[str]] = {}  # a batch array's worker -> its instances seen
        self.seen: Mapping[str, WorkerOffer] = MappingProxyType(self._seen)
        self.taking: Set[str] = self._taking  # read it, never change it: only the book does

    def online(self, offer: WorkerOffer, draining: bool) -> None:
        name = offer.name
        if offer.one_shot:
            # A one-shot agent says whether it took its run; a fresh connection that has
            # not is a new agent (the next batch job), free for one run again.
            if offer.spent:
                self._spent.add(name)
            elif name not in self._taking:
                self._spent.discard(name)
        self._seen[name] = offer
        worker, mark, _ = name.partition(INSTANCE_MARK)
        if mark:
            self._instances.setdefault(worker, set()).add(name)
        (self._taking.discard if draining else self._taking.add)(name)

    def offline(self, name: str) -> None:
        self._taking.discard(name)

    def instances(self, name: str) -> list[str]:
        """The instances (``name#id``) seen of a worker whose agents are a batch array's
        tasks, in order; a named submission asks, and a lab has hundreds of workers."""
        return sorted(self._instances.get(name, ()))

    def placed_on(self, name: str) -> None:
        """A run went to ``name``: a one-shot agent takes nothing more."""
        offer = self._seen.get(name)
        if offer is not None and offer.one_shot:
            self._spent.add(name)

    def spent(self, name: str) -> bool:
        return name in self._spent

    def deadline(self, name: str) -> float | None:
        offer = self._seen.get(name)
        return offer.deadline if offer is not None else None
