"""Why each run the placer was handed has not started: an immutable board of the runs
waiting there, grouped by what they wait for, copied after every burst of the placer's
messages (its published view) and read by a page without an ask.

Copying is cheap (a tuple of each line, and what each group's words need: a device's
name, whether its card is shared, a worker's state); the words are made when a page
reads them, for the runs on that page only. So a line of 1,000 runs for one card costs
the placer a tuple copy per burst, and a page of queued runs no ask of a busy placer,
which answers an ask only after the handler in hand (often waiting on a ledger).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from troupe.actors.placer.book import WorkerBook
from troupe.actors.placer.messages import Admit
from troupe.protocol.queue_key import QueueKey


def in_time(deadline: float | None, admit: Admit, now: float) -> bool:
    """Whether a batch job ending at ``deadline`` lasts long enough for what the run declares."""
    return deadline is None or admit.duration_s is None or now + admit.duration_s <= deadline


@dataclass(frozen=True)
class Local:
    """The server's own runs waiting for the seed gate, or for a device a same-machine
    worker shares."""

    admits: tuple[Admit, ...]
    gate_held: bool  # a seeded run holds the gate
    executing: bool  # some run executes here (a seeded run waits for them to end)

    def words(self, admit: Admit) -> tuple[str, str]:
        if self.gate_held or (admit.seeded and self.executing):
            return "seed_gate", "waits for the seed gate: a seeded run executes alone in this server"
        return "device_busy", (f"waits for a free slot of {admit.queue_key}: this server shares that device with a "
                               "worker on the same machine, and its runs hold it")


@dataclass(frozen=True)
class Parked:
    """Runs for a named worker that cannot take them now."""

    worker: str
    admits: tuple[Admit, ...]
    spent: bool  # a one-shot agent online that has taken its run
    online: bool
    deadline: float | None  # when its batch job ends

    def words(self, admit: Admit) -> tuple[str, str]:
        worker = self.worker
        if self.spent and self.online:
            return "one_shot_spent", (f"waits for a new one-shot agent named {worker}: the one connected has taken "
                                      "its run")
        now = time.time()
        if self.online and not in_time(self.deadline, admit, now):
            left = (self.deadline or 0.0) - now  # as of the read: the words age with the job
            return "job_ends_too_soon", (f"waits: worker {worker}'s batch job ends in {left:.0f} s, sooner than the "
                                         f"{admit.duration_s:g} s the run declares")
        return "worker_offline", f"waits for worker {worker}, which is not connected"


@dataclass(frozen=True)
class Line:
    """The runs for one physical device, in the order they start."""

    admits: tuple[Admit, ...]
    named: str  # the device as people name it
    shared: bool  # its card is shared by memory
    alike: bool  # every run of it asks alike: one queue key

    def words(self, admit: Admit) -> tuple[str, str]:
        if self.shared and admit.budget_mib is None:
            return "memory_budget_required", (f"has no memory budget and {self.named} is now shared by memory: it "
                                              "waits until the card is exclusive again")
        if self.shared:
            return "memory_busy", (f"waits for {admit.budget_mib} MiB (and the CUDA context) on {self.named}, shared "
                                   "by memory")
        return "device_busy", f"waits for a free slot of {self.named}"


@dataclass(frozen=True)
class Anywhere:
    """Runs for target ``any`` (or a pool of one-shot agents), with whether each graph
    needs node types not every worker has."""

    waiting: tuple[tuple[Admit, frozenset[str]], ...]

    @staticmethod
    def words(admit: Admit, needs: frozenset[str]) -> tuple[str, str]:
        key = QueueKey.parse(admit.queue_key)
        what = "a free card" if key.device == "auto" else f"a free {key.device}"
        kind = "one-shot agent" if key.one_shot else "worker"
        return "no_free_worker", (f"waits for a connected {kind} with {what}"
                                  + (" and the node types of its graph" if needs else ""))


@dataclass(frozen=True)
class Board:
    """Every run the placer holds that has not started, as of one burst of its messages."""

    local: Local
    parked: tuple[Parked, ...]
    lines: tuple[Line, ...]
    anywhere: Anywhere

    def answer(self, run_ids: frozenset[str] | None = None) -> dict[str, Any]:
        """``{"runs": {run_id: {"queue_key", "code", "message"}}, "held": {queue_key: count}}``;
        ``runs`` only of ``run_ids`` when given: a page wants its own, not every run's words."""
        found: dict[str, dict[str, str]] = {}
        for admit, (code, message) in self._words(run_ids):
            found[admit.run_id] = {"queue_key": admit.queue_key, "code": code, "message": message}
        return {"runs": found, "held": self.held()}

    def held(self) -> dict[str, int]:
        """How many runs wait here, by queue key. A line whose runs ask alike is counted
        by its length, not walked."""
        counts: dict[str, int] = {}
        for line in self.lines:
            if line.alike:
                key = line.admits[0].queue_key
                counts[key] = counts.get(key, 0) + len(line.admits)
                continue
            for admit in line.admits:
                counts[admit.queue_key] = counts.get(admit.queue_key, 0) + 1
        loose = [*self.local.admits, *(a for group in self.parked for a in group.admits),
                 *(a for a, _ in self.anywhere.waiting)]
        for admit in loose:
            counts[admit.queue_key] = counts.get(admit.queue_key, 0) + 1
        return counts

    def _words(self, run_ids: frozenset[str] | None) -> Iterator[tuple[Admit, tuple[str, str]]]:
        groups: tuple[Local | Parked | Line, ...] = (self.local, *self.parked, *self.lines)
        for group in groups:
            admits = group.admits if run_ids is None else [a for a in group.admits if a.run_id in run_ids]
            yield from ((a, group.words(a)) for a in admits)
        for admit, needs in self.anywhere.waiting:
            if run_ids is None or admit.run_id in run_ids:
                yield admit, Anywhere.words(admit, needs)


def parked_facts(book: WorkerBook, is_online: Callable[[str], bool], worker: str) -> tuple[bool, bool, float | None]:
    """(spent, online, deadline) of a named worker, as its waiting runs' words read them;
    a batch array's worker by its instances: spent when every one online has taken its
    run, its deadline the latest of those still free."""
    online = [name for name in book.instances(worker) if is_online(name)]
    if not online:
        return book.spent(worker), is_online(worker), book.deadline(worker)
    free = [name for name in online if not book.spent(name)]
    deadlines = [book.deadline(name) for name in free]
    latest = max(d for d in deadlines if d is not None) if free and None not in deadlines else None
    return not free, True, latest
