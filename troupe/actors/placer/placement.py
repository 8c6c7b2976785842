"""The placer's part that answers the placement question for worker runs: of every
attached machine, which could grant the ask, and which has it free now.

It is not an actor: the Placer owns it and calls it from its own mailbox, so nothing
here runs concurrently. The counts live in one LedgerActor per physical device; this
keeps what it needs to route releases and to rebuild a fresh ledger (which run it
placed on which device, which provider offers which device at which limit).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from troupe.actors.base import ActorRef, Registry
from troupe.actors.errors import MemoryBudgetRequired, MemoryBudgetTooLarge, MemoryBusy
from troupe.actors.placer.book import INSTANCE_MARK, WorkerBook
from troupe.actors.placer.fair_share import DeviceUse
from troupe.actors.placer.holds import Holds
from troupe.actors.placer.ledger import MEMORY, Adopt, Fits, Free, FreeMemory, Offer, Policy, TryHold, Withdraw
from troupe.actors.placer.messages import Admit, Released
from troupe.actors.placer.waiting import Anywhere, Line, Parked, in_time, parked_facts
from troupe.actors.run_messages import NeverFits, Start
from troupe.protocol.queue_key import QueueKey

LOCAL = "local"  # the provider name of the server's own devices


class WorkerPlacement:
    def __init__(self, book: WorkerBook, registry: Registry, ensure_ledger: Callable[[str], tuple[ActorRef, bool]],
                 placer: Callable[[], ActorRef | None],
                 local: Mapping[str, tuple[str, int]] | None = None, fair_half_life_s: float | None = None) -> None:
        self._book = book  # the placer's: who is online, what it can run, which one-shot agent is spent
        self._registry = registry
        self._ensure_ledger = ensure_ledger
        self._placer = placer
        self._parked: dict[str, list[Admit]] = {}  # runs for a worker that is offline
        self._providers: dict[str, dict[str, tuple[str, int]]] = {}  # provider -> device -> (physical, limit)
        # The same, by device: physical -> its providers, online or not (a local run asks
        # whether a worker shares its device, and a lab has thousands of devices).
        self._offering: dict[str, set[str]] = {}
        self._names: dict[str, str] = {}  # physical -> as people name it (``_named``)
        if local:  # the server's own devices that a same-machine worker can share
            self._set_offer(LOCAL, local)
        self._held = Holds()  # run -> [(provider, physical)], and who holds each device
        self._budgets: dict[str, int | None] = {}  # run -> its memory budget, while it holds
        self._caps: dict[str, dict[str, int]] = {}  # run -> {device: card total} of the shared cards it holds
        self._cards: dict[str, tuple[int, int]] = {}  # physical -> (total, free) MiB, as last reported
        self._policies: dict[str, Policy] = {}  # physical -> its sharing policy (exclusive when absent)
        self._device_waiting: dict[str, deque[Admit]] = {}  # physical -> named-worker runs
        self._mixed: set[str] = set()  # lines that hold more than one kind of ask (``_alike``)
        # Target ``any``, in admission order, with the node types each run's graph needs.
        self._any_waiting: deque[tuple[Admit, frozenset[str]]] = deque()
        # Local runs on a device no worker shares: the queue's limit is the whole quota,
        # so they skip the ledger (no ask on the core path) until a worker shares it.
        self._unshared: dict[str, str] = {}  # run -> physical
        self._adopted: set[str] = set()  # runs a restarted server found holding devices
        # Exclusive devices whose ledger said all its slots are held, with nothing sent to
        # it since: a line of 300 runs for one card asks once per freed slot, not twice.
        self._full: set[str] = set()
        # Who used each device lately, for fair order in its line (None: FIFO, the setting).
        self._use: DeviceUse[Admit] | None = DeviceUse(fair_half_life_s, lambda a: a.submitter) \
            if fair_half_life_s else None
        self._whose: dict[str, str] = {}  # run -> its submitter, from its admission until it frees its devices

    # Providers ---------------------------------------------------------------------
    async def online(self, name: str, devices: Mapping[str, tuple[str, int]], draining: bool,
                     cards: Mapping[str, tuple[int, int]] | None = None) -> None:
        """After the book took the worker's offer: its devices are offered to their ledgers."""
        before = self._set_offer(name, devices)
        self._cards.update(cards or {})
        gone = {physical for physical, _ in before.values()} - {physical for physical, _ in devices.values()}
        for physical in gone:
            self._ledger(physical).tell(Withdraw(name))
        if draining:
            await self.offline(name)
            return
        for device, (physical, limit) in devices.items():
            self._share(physical)
            self._ledger(physical).tell(self._offer(name, device, physical, limit))
        # Runs parked for this worker, or for the worker whose instance this is.
        for parked in self._parked.pop(name, []) + self._parked.pop(name.split(INSTANCE_MARK)[0], []):
            await self.admit_named(parked)
        await self._place_anywhere()

    def _set_offer(self, name: str, devices: Mapping[str, tuple[str, int]]) -> dict[str, tuple[str, int]]:
        """What ``name`` offers from now on; returns what it offered before."""
        before = self._providers.get(name, {})
        self._names.clear()
        for physical, _ in before.values():
            self._offering.get(physical, set()).discard(name)
        self._providers[name] = dict(devices)
        for physical, _ in devices.values():
            self._offering.setdefault(physical, set()).add(name)
        return before

    def _shared_with_a_worker(self, physical: str) -> bool:
        """Whether a worker online now offers this device of the server's own."""
        return any(provider != LOCAL and self._is_online(provider) for provider in self._offering.get(physical, ()))

    async def offline(self, name: str) -> None:
        """``name`` offers nothing more (gone, or draining). A device it shared may now
        allow more (its limit was the smallest of its providers'): the runs waiting for
        those devices try again at once, not at the next release of an unrelated run."""
        physicals = [physical for physical, _ in self._providers.get(name, {}).values()]
        for physical in physicals:
            self._ledger(physical).tell(Withdraw(name))
        await self._retry(physicals)

    async def card_memory(self, free_mib: Mapping[str, int]) -> None:
        """A heartbeat's free memory: the shared cards among them may fit a waiting run now."""
        for physical, free in free_mib.items():
            total = self._cards.get(physical, (free, free))[0]
            self._cards[physical] = (total, free)
            self._ledger(physical).tell(FreeMemory(free))
        await self._retry([p for p in free_mib if self._shared(p)])

    async def set_policy(self, physical: str, policy: Policy) -> None:
        self._policies[physical] = policy
        self._ledger(physical).tell(policy)
        for admit in list(self._device_waiting.get(physical, ())):  # more reserved: some may never fit now
            fits = await self._ledger(physical).ask(Fits(admit.budget_mib))
            run = self._registry.lookup(f"runs/{admit.run_id}")
            if fits["sharing"] == MEMORY and admit.budget_mib is not None and not fits["ever"] and run is not None:
                self._device_waiting[physical].remove(admit)
                numbers = fits["numbers"]
                run.tell(NeverFits(f"memory_budget_too_large: its budget of {admit.budget_mib} MiB plus "
                                   f"{numbers['context_mib']} MiB of CUDA context can never fit the card it waited "
                                   f"for now: {numbers['total_mib']} MiB, {numbers['reserved_mib']} MiB reserved"))
        await self._retry([physical])

    def _shared(self, physical: str) -> bool:
        return self._policies.get(physical, Policy()).sharing == MEMORY

    def _offer(self, provider: str, device: str, physical: str, limit: int) -> Offer:
        total, free = self._cards.get(physical, (None, None))
        key = QueueKey(None if provider == LOCAL else provider, device)
        return Offer(provider, limit, total, free, str(key))

    # Submission --------------------------------------------------------------------
    async def check(self, worker: str, devices: tuple[str, ...], budget_mib: int | None, wait: bool | None) -> None:
        """Refuses, before anything is stored, a run for a named worker's shared card that
        can never fit (400), has no budget (400), or does not fit now and did not ask to
        wait (503); the numbers go with the refusal."""
        for device in devices:
            physical = self._providers.get(worker, {}).get(device, (None, 0))[0]
            if physical is None or not self._shared(physical):
                continue
            fits = await self._ledger(physical).ask(Fits(budget_mib))
            numbers = {**fits["numbers"], "device": device, "physical_id": physical}
            if fits["sharing"] != MEMORY:
                continue  # the card's total is not known yet: it waits like any run
            where = f"{worker}/{device}"
            if budget_mib is None:
                raise MemoryBudgetRequired(
                    f"{where} is shared by memory: give the run a budget (options.target.memory_gib), or run the "
                    "same graph once on an exclusive card so that its peak is measured", pointer="/options/target",
                    details=numbers)
            if not fits["ever"]:
                raise MemoryBudgetTooLarge(
                    f"the budget of {budget_mib} MiB plus {numbers['context_mib']} MiB of CUDA context can never fit "
                    f"{where}: it has {numbers['total_mib']} MiB, {numbers['reserved_mib']} MiB reserved",
                    pointer="/options/target", details=numbers)
            ahead = len(self._device_waiting.get(physical, ()))
            if ahead and not wait:
                raise MemoryBusy(f"{ahead} run(s) wait for {where} ahead of this one, and runs for a card start in "
                                 "their order; set options.target.wait to true to wait in line",
                                 details={**numbers, "waiting": ahead})
            if not fits["now"] and not wait:
                raise MemoryBusy(
                    f"the budget of {budget_mib} MiB plus {numbers['context_mib']} MiB of CUDA context does not fit "
                    f"{where} now: {numbers['room_mib']} MiB of room ({numbers['free_mib']} MiB free, "
                    f"{numbers['promised_mib']} MiB promised to running runs, {numbers['reserved_mib']} MiB "
                    "reserved); set options.target.wait to true to wait for it", details=numbers)

    # Admission ---------------------------------------------------------------------
    async def admit(self, admit: Admit, needs: frozenset[str] = frozenset()) -> None:
        """``needs``: for target ``any``, the node types a worker must have to take it."""
        if self._use is not None and admit.submitter:
            self._whose[admit.run_id] = admit.submitter
        if QueueKey.parse(admit.queue_key).pooled:
            self._any_waiting.append((admit, needs))
            await self._place_anywhere()
        else:
            await self.admit_named(admit)

    async def admit_named(self, admit: Admit) -> None:
        if self._use is not None and admit.submitter:
            self._whose[admit.run_id] = admit.submitter
        key = QueueKey.parse(admit.queue_key)
        worker, device = key.provider or LOCAL, key.device
        # A worker named by its instances (a batch array's): the first of its tasks that is free.
        instances = None if self._is_online(worker) else self._free_instances(worker)
        if instances is not None:
            for instance in instances:
                if self._in_time(instance, admit) and await self._try_named(admit, instance, device, placed=instance):
                    return
            self._parked.setdefault(worker, []).append(admit)
            return
        if not self._is_online(worker) or self._book.spent(worker) or not self._in_time(worker, admit):
            self._parked.setdefault(worker, []).append(admit)
            return
        await self._try_named(admit, worker, device)

    def _in_time(self, worker: str, admit: Admit) -> bool:
        """Whether the worker's batch job lasts long enough for what the run declares."""
        return in_time(self._book.deadline(worker), admit, time.time())

    def _free_instances(self, worker: str) -> list[str] | None:
        """None for a worker that has no instances online; else those not spent yet."""
        online = sorted(w for w in self._book.taking if w.startswith(f"{worker}{INSTANCE_MARK}"))
        return [w for w in online if not self._book.spent(w)] if online else None

    async def _try_named(self, admit: Admit, worker: str, device: str, placed: str | None = None) -> bool:
        """Holds every device of the ask on ``worker`` and starts the run, or holds none.
        ``placed``: the instance chosen (the run's worker becomes it). An instance that
        cannot take it leaves the run to the next; a plain worker queues it for the device."""
        offered = self._providers.get(worker, {})
        asked = admit.devices or (device,)
        # Every device of the ask, or none: a run on two cards never holds one of them
        # waiting. Runs for one device start in their order: none passes one that waits.
        for name in asked:
            physical, _ = offered.get(name, (f"{worker}/{name}", 1))
            if self._device_waiting.get(physical) or not await self._hold(
                    admit.run_id, worker, physical, name, admit.budget_mib):
                self._free_all(admit.run_id)
                if placed is None:
                    line = self._device_waiting.setdefault(physical, deque())
                    if line and _alike(line[0]) != _alike(admit):
                        self._mixed.add(physical)
                    line.append(admit)
                return False
        self._placed_on(worker)
        self._start(admit.run_id, Start(worker=placed, holds=tuple(self._held[admit.run_id]),
                                        caps=self._caps_of(admit.run_id)))
        return True

    def _placed_on(self, worker: str) -> None:
        self._book.placed_on(worker)  # a one-shot agent's one run: nothing more goes to it

    async def predict(self, key: str) -> dict[str, str] | None:
        """Whether a run for ``key`` would find its device free now (asked of the device's
        ledger, the same book it would hold); None when it would, else why not."""
        parsed = QueueKey.parse(key)
        provider, device = parsed.provider or LOCAL, parsed.device
        if parsed.pooled:
            return None  # the first free worker takes it: nothing to predict about one device
        offered = self._providers.get(provider, {}).get(device)
        if offered is None:
            if provider == LOCAL or self._is_online(provider):
                return None  # not a device of its own (``auto``): the server resolves it when it is queued
            return {"code": "worker_offline", "message": f"waits for worker {provider}, which is not connected"}
        physical = offered[0]
        if provider == LOCAL and not self._shared_with_a_worker(physical):
            return None  # the server's own device, shared with no worker: its queue's slots say it all
        if (await self._ledger(physical).ask(Fits(None)))["now"] or self._shared(physical):
            return None
        return {"code": "device_busy", "message": f"waits for a free slot of {self._named(physical)}"}

    async def hold_local(self, run_id: str, device: str) -> bool:
        """A local queued run on a device the server shares with a same-machine worker
        takes a slot of that device's ledger too; True when it may start."""
        offered = self._providers.get(LOCAL, {}).get(device)
        if offered is None:
            return True
        physical = offered[0]
        # A run a restarted server adopted holds the device until its worker is back (its
        # agent will be, and its run is alive); a worker gone otherwise took its runs along.
        adopted = any(p != LOCAL and on == physical for run in self._held.on(physical) if run in self._adopted
                      for p, on in self._held.get(run))
        if not self._shared_with_a_worker(physical) and not adopted:
            self._unshared[run_id] = physical
            return True
        return await self._hold(run_id, LOCAL, physical, device, None)

    def _share(self, physical: str) -> None:
        """A worker now offers a device of the server's own: the local runs on it count."""
        moved = tuple(run for run, on in self._unshared.items() if on == physical)
        for run_id in moved:
            del self._unshared[run_id]
            self._held.add(run_id, LOCAL, physical)
        if moved:
            self._ledger(physical).tell(Adopt(moved))

    def adopt(self, run_id: str, holds: tuple[tuple[str, str], ...], budget_mib: int | None = None) -> None:
        """A run the last server left executing on a worker holds its slots again, before
        anything is admitted (its providers come back online when its worker does)."""
        self._held.set(run_id, holds)
        self._adopted.add(run_id)
        self._budgets[run_id] = budget_mib
        for _, physical in holds:
            self._ledger(physical).tell(Adopt((run_id,), {run_id: budget_mib}))

    def holds(self, run_id: str) -> bool:
        """Whether the run holds slots of some ledger (placed, or adopted)."""
        return run_id in self._held or run_id in self._unshared

    async def release(self, run_id: str) -> None:
        """The run's slot goes back; the runs waiting for that device, or for any, retry."""
        self._whose.pop(run_id, None)
        if self._unshared.pop(run_id, None) is None and run_id not in self._held:
            # Withdrawn while it waited (a run that holds slots waits in no line).
            self._any_waiting = deque(a for a in self._any_waiting if a[0].run_id != run_id)
            for line in self._device_waiting.values():
                if any(a.run_id == run_id for a in line):
                    line.remove(next(a for a in line if a.run_id == run_id))
            for worker, parked in list(self._parked.items()):  # waiting for a worker that is offline
                if any(a.run_id == run_id for a in parked):
                    self._parked[worker] = [a for a in parked if a.run_id != run_id]
        await self._retry(self._free_all(run_id))

    async def _retry(self, physicals: list[str]) -> None:
        """Something was freed on these devices: the runs waiting for them try again, in
        fair order (those that still do not fit wait again), then the runs for ``any``."""
        for physical in physicals:
            waiting, line = self._device_waiting.get(physical, deque()), deque[Admit]()
            if self._use is not None:
                waiting = self._use.in_fair_order(physical, waiting)
            self._device_waiting[physical] = line
            mixed = physical in self._mixed
            self._mixed.discard(physical)
            would_wait: dict[tuple[Any, ...], bool] = {}  # the runs of a line mostly ask alike
            while waiting:
                admit = waiting.popleft()
                if line:
                    alike = _alike(admit)
                    if alike not in would_wait:
                        would_wait[alike] = self._would_wait_in(admit, physical)
                    if would_wait[alike]:
                        line.append(admit)  # a run ahead of it waits again: it cannot pass
                        if not mixed:
                            line.extend(waiting)  # and neither can those behind, asking alike
                            break
                        continue
                if self._registry.lookup(f"runs/{admit.run_id}") is not None:  # else withdrawn
                    await self.admit_named(admit)
                    would_wait.clear()  # placing it may have spent its worker
            if mixed and len({_alike(admit) for admit in line}) > 1:
                self._mixed.add(physical)
            if not line and self._device_waiting.get(physical) is line:
                del self._device_waiting[physical]  # a lab's thousands of cards keep no empty lines
        await self._place_anywhere()

    def _would_wait_in(self, admit: Admit, physical: str) -> bool:
        """Whether ``admit_named`` could only put the run back in ``physical``'s line, as
        one ahead of it waits there: its worker takes runs now and ``physical`` is the
        first device it asks. Then a freed slot costs one try for a line of 300, not 300."""
        key = QueueKey.parse(admit.queue_key)
        worker = key.provider or LOCAL
        if not self._is_online(worker) or self._book.spent(worker) or not self._in_time(worker, admit):
            return False
        first = (admit.devices or (key.device,))[0]
        return self._providers.get(worker, {}).get(first, (f"{worker}/{first}", 1))[0] == physical

    def _free_all(self, run_id: str) -> list[str]:
        freed = [physical for _, physical in self._held.pop(run_id)]
        self._adopted.discard(run_id)
        if self._use is not None:
            self._use.release(run_id, freed)
        self._budgets.pop(run_id, None)
        self._caps.pop(run_id, None)
        for physical in freed:
            self._ledger(physical).tell(Free(run_id))
        return freed

    def _caps_of(self, run_id: str) -> tuple[tuple[str, int], ...]:
        return tuple(self._caps.get(run_id, {}).items())

    def waiting(self) -> tuple[tuple[Parked, ...], tuple[Line, ...], Anywhere]:
        """The runs admitted here that have not started, grouped by what they wait for,
        with what their words need (copied: part of the placer's view)."""
        parked = tuple(Parked(worker, tuple(admits), *parked_facts(self._book, self._is_online, worker))
                       for worker, admits in self._parked.items() if admits)
        lines = tuple(Line(tuple(line), self._named(physical), self._shared(physical), physical not in self._mixed)
                      for physical, line in self._device_waiting.items() if line)
        return parked, lines, Anywhere(tuple(self._any_waiting))

    def _named(self, physical: str) -> str:
        """A physical device as people name it: a worker's device (``gpu-a cuda:0``), never
        a card's uuid or a machine id; a CPU by who offers it (this server, a worker).
        Kept until an offer changes: the placer's view names every line's device."""
        found = self._names.get(physical)
        if found is None:
            found = self._names[physical] = self._name(physical)
        return found

    def _name(self, physical: str) -> str:
        offers = sorted((("this server" if provider == LOCAL else provider), device)
                        for provider in self._offering.get(physical, ())
                        for device, (held, _) in self._providers[provider].items() if held == physical)
        if physical.startswith("cpu@"):
            who = [provider for provider, _ in offers] or ["a worker no longer connected"]
            return f"the CPU of {who[0]}" if len(who) == 1 else f"the CPU that {' and '.join(who)} share"
        return " and ".join(f"{provider} {device}" for provider, device in offers) or "a card no worker offers now"

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
            key = QueueKey.parse(admit.queue_key)
            spot = await self._free_spot(admit, key.device, needs, key.one_shot)
            if spot is None:
                self._any_waiting.append((admit, needs))
                continue
            worker, device = spot
            self._placed_on(worker)
            self._start(admit.run_id, Start(worker=worker, device=device, holds=tuple(self._held[admit.run_id]),
                                            caps=self._caps_of(admit.run_id)))

    async def _free_spot(self, admit: Admit, asked: str, needs: frozenset[str],
                         one_shot: bool) -> tuple[str, str] | None:
        """``one_shot``: the pool of batch jobs' agents (each takes one run), else ``any``'s
        workers, which never include those."""
        run_id, budget_mib = admit.run_id, admit.budget_mib
        seen = self._book.seen
        able = {worker for worker in self._book.taking if needs <= seen[worker].abilities
                and seen[worker].one_shot == one_shot and not self._book.spent(worker)
                and self._in_time(worker, admit)}
        workers = sorted(able - {LOCAL},
                         key=lambda w: (-self._has_cards(w), self._load(w), w))
        for worker in workers:
            devices = self._providers.get(worker, {})
            if asked == "auto":
                candidates = [d for d in devices if d != "cpu"] or ["cpu"]
            else:
                candidates = [asked] if asked in devices else []
            for device in candidates:
                physical = devices[device][0]
                # A card shared by memory takes a run with a budget only, in its order.
                if self._device_waiting.get(physical) or (budget_mib is None and self._shared(physical)):
                    continue
                if await self._hold(run_id, worker, physical, device, budget_mib):
                    return worker, device
        return None

    def _is_online(self, provider: str) -> bool:
        return provider in self._book.taking or (provider == LOCAL and LOCAL in self._providers)

    def _online_names(self) -> list[str]:
        return [*self._book.taking, *([LOCAL] if LOCAL in self._providers else [])]

    def _has_cards(self, worker: str) -> bool:
        return any(device != "cpu" for device in self._providers.get(worker, {}))

    def _load(self, worker: str) -> int:
        return sum(1 for held in self._held.values() for provider, _ in held if provider == worker)

    # Ledgers -----------------------------------------------------------------------
    async def _hold(self, run_id: str, provider: str, physical: str, device: str, budget_mib: int | None) -> bool:
        if physical in self._full:
            return False  # the ledger said so, and nothing was sent to it since
        hold = await self._ledger(physical).ask(TryHold(run_id, budget_mib))
        if hold is None:
            return False
        if hold.full:
            self._full.add(physical)
        self._held.add(run_id, provider, physical)
        self._budgets[run_id] = budget_mib
        if hold.shared and hold.total_mib is not None:
            self._caps.setdefault(run_id, {})[device] = hold.total_mib
        return True

    def _ledger(self, physical: str) -> ActorRef:
        self._full.discard(physical)  # whatever is sent may free a slot
        ledger, fresh = self._ensure_ledger(physical)
        if fresh:  # a new (or restarted) ledger learns its providers, its policy and its holders
            offered = ((p, device, limit) for p in self._offering.get(physical, ()) if self._is_online(p)
                       for device, (on, limit) in self._providers.get(p, {}).items() if on == physical)
            for provider, device, limit in offered:  # its providers only, not every device of every provider
                ledger.tell(self._offer(provider, device, physical, limit))
            if physical in self._policies:
                ledger.tell(self._policies[physical])
            holders = self._held.on(physical)
            ledger.tell(Adopt(holders, {run: self._budgets.get(run) for run in holders}))
        return ledger

    def _start(self, run_id: str, start: Any) -> None:
        if self._use is not None:
            self._use.hold([physical for _, physical in self._held.get(run_id)], run_id,
                           self._whose.pop(run_id, ""))
        run = self._registry.lookup(f"runs/{run_id}")
        if run is not None:
            run.tell(start)
            return
        placer = self._placer()
        if placer is not None:
            placer.tell(Released(run_id))  # withdrawn meanwhile: the slot goes back


def _alike(admit: Admit) -> tuple[Any, ...]:
    """What ``_would_wait_in`` reads of a run: runs alike in it wait, or not, together."""
    return admit.queue_key, admit.devices[:1], admit.duration_s
