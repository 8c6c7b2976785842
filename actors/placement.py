"""The placer's part that answers the placement question for worker runs: of every
attached machine, which could grant the ask, and which has it free now.

It is not an actor: the Placer owns it and calls it from its own mailbox, so nothing
here runs concurrently. The counts live in one LedgerActor per physical device; this
keeps what it needs to route releases and to rebuild a fresh ledger (which run it
placed on which device, which provider offers which device at which limit).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from actors.base import ActorRef, Registry
from actors.ledger import Adopt, Free, Offer, TryHold, Withdraw
from actors.placer_messages import Admit, Released
from actors.run_messages import Start
from protocol.settings import ANY_PREFIX

LOCAL = "local"  # the provider name of the server's own devices


class WorkerPlacement:
    def __init__(self, registry: Registry, ensure_ledger: Callable[[str], tuple[ActorRef, bool]],
                 placer: Callable[[], ActorRef | None],
                 local: Mapping[str, tuple[str, int]] | None = None) -> None:
        self._registry = registry
        self._ensure_ledger = ensure_ledger
        self._placer = placer
        self._online: set[str] = set()
        self._types: dict[str, frozenset[str]] = {}  # node types of each worker (``any`` needs the graph's)
        self._parked: dict[str, list[Admit]] = {}  # runs for a worker that is offline
        self._providers: dict[str, dict[str, tuple[str, int]]] = {}  # provider -> device -> (physical, limit)
        if local:  # the server's own devices that a same-machine worker can share
            self._providers[LOCAL] = dict(local)
            self._online.add(LOCAL)
        self._held: dict[str, list[tuple[str, str]]] = {}  # run -> [(provider, physical)]
        self._device_waiting: dict[str, deque[Admit]] = {}  # physical -> named-worker runs
        # Target ``any``, in admission order, with the node types each run's graph needs.
        self._any_waiting: deque[tuple[Admit, frozenset[str]]] = deque()
        # Local runs on a device no worker shares: the queue's limit is the whole quota,
        # so they skip the ledger (no ask on the core path) until a worker shares it.
        self._unshared: dict[str, str] = {}  # run -> physical

    # Providers ---------------------------------------------------------------------
    async def online(self, name: str, devices: Mapping[str, tuple[str, int]], draining: bool,
                     node_types: frozenset[str] = frozenset()) -> None:
        before = self._providers.get(name, {})
        self._providers[name] = dict(devices)
        gone = {physical for physical, _ in before.values()} - {physical for physical, _ in devices.values()}
        for physical in gone:
            self._ledger(physical).tell(Withdraw(name))
        if draining:
            self.offline(name)
            return
        self._online.add(name)
        self._types[name] = node_types
        for physical, limit in devices.values():
            self._share(physical)
            self._ledger(physical).tell(Offer(name, limit))
        for parked in self._parked.pop(name, []):
            await self.admit_named(parked)
        await self._place_anywhere()

    def offline(self, name: str) -> None:
        self._online.discard(name)
        for physical, _ in self._providers.get(name, {}).values():
            self._ledger(physical).tell(Withdraw(name))

    # Admission ---------------------------------------------------------------------
    async def admit(self, admit: Admit, needs: frozenset[str] = frozenset()) -> None:
        """``needs``: for target ``any``, the node types a worker must have to take it."""
        if admit.queue_key.startswith(ANY_PREFIX):
            self._any_waiting.append((admit, needs))
            await self._place_anywhere()
        else:
            await self.admit_named(admit)

    async def admit_named(self, admit: Admit) -> None:
        worker, device = admit.queue_key.split("/", 1)
        if worker not in self._online:
            self._parked.setdefault(worker, []).append(admit)
            return
        offered = self._providers.get(worker, {})
        asked = admit.devices or (device,)
        # Every device of the ask, or none: a run on two cards never holds one of them waiting.
        for name in asked:
            physical, _ = offered.get(name, (f"{worker}/{name}", 1))
            if not await self._hold(admit.run_id, worker, physical):
                self._free_all(admit.run_id)
                self._device_waiting.setdefault(physical, deque()).append(admit)
                return
        self._start(admit.run_id, Start(holds=tuple(self._held[admit.run_id])))

    async def hold_local(self, run_id: str, device: str) -> bool:
        """A local queued run on a device the server shares with a same-machine worker
        takes a slot of that device's ledger too; True when it may start."""
        offered = self._providers.get(LOCAL, {}).get(device)
        if offered is None:
            return True
        physical = offered[0]
        if not any(provider != LOCAL and any(on == physical for on, _ in devices.values())
                   for provider, devices in self._providers.items() if provider in self._online):
            self._unshared[run_id] = physical
            return True
        return await self._hold(run_id, LOCAL, physical)

    def _share(self, physical: str) -> None:
        """A worker now offers a device of the server's own: the local runs on it count."""
        moved = tuple(run for run, on in self._unshared.items() if on == physical)
        for run_id in moved:
            del self._unshared[run_id]
            self._held.setdefault(run_id, []).append((LOCAL, physical))
        if moved:
            self._ledger(physical).tell(Adopt(moved))

    def adopt(self, run_id: str, holds: tuple[tuple[str, str], ...]) -> None:
        """A run the last server left executing on a worker holds its slots again, before
        anything is admitted (its providers come back online when its worker does)."""
        self._held[run_id] = list(holds)
        for _, physical in holds:
            self._ledger(physical).tell(Adopt((run_id,)))

    def holds(self, run_id: str) -> bool:
        """Whether the run holds slots of some ledger (placed, or adopted)."""
        return run_id in self._held or run_id in self._unshared

    async def release(self, run_id: str) -> None:
        """The run's slot goes back; the runs waiting for that device, or for any, retry."""
        self._any_waiting = deque(a for a in self._any_waiting if a[0].run_id != run_id)
        self._unshared.pop(run_id, None)
        for physical in self._free_all(run_id):
            waiting, self._device_waiting[physical] = self._device_waiting.get(physical, deque()), deque()
            for admit in waiting:  # in order; those that still do not fit wait again
                if admit.run_id != run_id and self._registry.lookup(f"runs/{admit.run_id}") is not None:
                    await self.admit_named(admit)
        await self._place_anywhere()

    def _free_all(self, run_id: str) -> list[str]:
        freed = [physical for _, physical in self._held.pop(run_id, [])]
        for physical in freed:
            self._ledger(physical).tell(Free(run_id))
        return freed

    def waiting(self) -> Iterator[tuple[Admit, str, str]]:
        """Every run admitted here that has not started, with the code and the words of
        what it waits for."""
        for worker, parked in self._parked.items():
            for admit in parked:
                yield admit, "worker_offline", f"waits for worker {worker}, which is not connected"
        for physical, line in self._device_waiting.items():
            for admit in line:
                yield admit, "device_busy", f"waits for a free slot of {physical}"
        for admit, needs in self._any_waiting:
            asked = admit.queue_key.removeprefix(ANY_PREFIX)
            what = "a free card" if asked == "auto" else f"a free {asked}"
            yield admit, "no_free_worker", (f"waits for a connected worker with {what}"
                                            + (" and the node types of its graph" if needs else ""))

    # Target ``any`` ----------------------------------------------------------------
    async def _place_anywhere(self) -> None:
        """Places the runs for target ``any`` that fit somewhere now, in admission order:
        of every online worker with the node types the run's graph uses, workers with
        cards first, then the least busy, then by name, the first that has the asked
        device free."""
        waiting, self._any_waiting = self._any_waiting, deque()
        for admit, needs in waiting:
            if self._registry.lookup(f"runs/{admit.run_id}") is None:
                continue  # withdrawn while it waited
            spot = await self._free_spot(admit.run_id, admit.queue_key.removeprefix(ANY_PREFIX), needs)
            if spot is None:
                self._any_waiting.append((admit, needs))
                continue
            worker, device = spot
            self._start(admit.run_id, Start(worker=worker, device=device, holds=tuple(self._held[admit.run_id])))

    async def _free_spot(self, run_id: str, asked: str, needs: frozenset[str]) -> tuple[str, str] | None:
        able = {worker for worker in self._online if needs <= self._types.get(worker, frozenset())}
        workers = sorted(able - {LOCAL},
                         key=lambda w: (-self._has_cards(w), self._load(w), w))
        for worker in workers:
            devices = self._providers.get(worker, {})
            if asked == "auto":
                candidates = [d for d in devices if d != "cpu"] or ["cpu"]
            else:
                candidates = [asked] if asked in devices else []
            for device in candidates:
                if await self._hold(run_id, worker, devices[device][0]):
                    return worker, device
        return None

    def _has_cards(self, worker: str) -> bool:
        return any(device != "cpu" for device in self._providers.get(worker, {}))

    def _load(self, worker: str) -> int:
        return sum(1 for held in self._held.values() for provider, _ in held if provider == worker)

    # Ledgers -----------------------------------------------------------------------
    async def _hold(self, run_id: str, provider: str, physical: str) -> bool:
        if not await self._ledger(physical).ask(TryHold(run_id)):
            return False
        held = self._held.setdefault(run_id, [])
        if (provider, physical) not in held:
            held.append((provider, physical))
        return True

    def _ledger(self, physical: str) -> ActorRef:
        ledger, fresh = self._ensure_ledger(physical)
        if fresh:  # a new (or restarted) ledger learns its providers and holders
            for provider in self._online:
                for held, limit in self._providers.get(provider, {}).values():
                    if held == physical:
                        ledger.tell(Offer(provider, limit))
            ledger.tell(Adopt(tuple(run for run, held in self._held.items() if any(on == physical for _, on in held))))
        return ledger

    def _start(self, run_id: str, start: Any) -> None:
        run = self._registry.lookup(f"runs/{run_id}")
        if run is not None:
            run.tell(start)
            return
        placer = self._placer()
        if placer is not None:
            placer.tell(Released(run_id))  # withdrawn meanwhile: the slot goes back
