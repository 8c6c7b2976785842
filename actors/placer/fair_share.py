"""Fair share within one queue key: who gets a freed slot when several people wait.

A queue key's slot goes to the submitter who has used that key least lately, as
SLURM's fairshare does: use is slot-seconds, each second counting half as much a
half-life later. Among one submitter's runs the order is FIFO; with one submitter
waiting it is plain FIFO, and so it is for everyone with ``TROUPE_QUEUE_ORDER=fifo``.

Decay is applied without touching every figure as time passes: a charge made at time
``t`` is stored multiplied by ``2 ** ((t - t0) / half_life)``, so every stored figure is
in the units of one moment and they compare as they are (dividing all by the same factor
would not change their order). When that factor grows large the base moves forward.

``Order`` is the immutable picture of the line a queue publishes for readers: the
position a run will start at if nothing else arrives, supposing each run holds its slot
about as long as this key's recent runs did (``estimate_s``).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

_REBASE = 512.0  # half-lives since the base after which the base moves (2**512 fits a float)
_ESTIMATE_S = 1.0  # a run's expected slot time before any run of the key has ended
_EASE = 0.2  # weight of the newest run in the key's running mean of slot time
_TIE = 1e-6  # use closer than this share of a run's slot time is a tie
_LAST = 2**63  # the enqueue sequence of a run not queued yet: after every run queued

E = TypeVar("E")


class Usage:
    """Decayed slot-seconds of one queue key, by submitter. ``clock``: epoch seconds."""

    def __init__(self, half_life_s: float, clock: Callable[[], float] = time.time) -> None:
        self._half_life = half_life_s
        self._clock = clock
        self._base = clock()
        self._charged: dict[str, float] = {}  # submitter -> slot-seconds, scaled to the base
        self._holding: dict[str, tuple[str, float]] = {}  # run -> (submitter, since)
        self.estimate_s = _ESTIMATE_S

    def _scale(self, at: float) -> float:
        return 2.0 ** ((at - self._base) / self._half_life)

    def hold(self, run_id: str, submitter: str, since: float | None = None) -> None:
        """The run took a slot (``since``: when, for a run a restart found running)."""
        self._holding.setdefault(run_id, (submitter, self._clock() if since is None else since))

    def release(self, run_id: str) -> None:
        held = self._holding.pop(run_id, None)
        if held is not None:
            now = self._clock()
            seconds = max(0.0, now - held[1])
            self.charge(held[0], seconds, now)
            self.estimate_s += _EASE * (max(seconds, 0.001) - self.estimate_s)

    def charge(self, submitter: str, seconds: float, at: float) -> None:
        """Slot-seconds used, as of ``at`` (a restart charges what the store says was used)."""
        if (at - self._base) / self._half_life > _REBASE:
            factor = self._scale(at)
            self._charged = {who: used / factor for who, used in self._charged.items()}
            self._base = at
        self._charged[submitter] = self._charged.get(submitter, 0.0) + seconds * self._scale(at)

    def held_by(self, submitter: str) -> int:
        return sum(1 for who, _ in self._holding.values() if who == submitter)

    def of(self, submitters: Iterator[str] | list[str]) -> dict[str, float]:
        """Each one's use now, in units that compare (not seconds: scaled to the base)."""
        now = self._clock()
        scale = self._scale(now)
        used = {who: self._charged.get(who, 0.0) for who in submitters}
        for who, since in self._holding.values():
            if who in used:
                used[who] += max(0.0, now - since) * scale
        return used

    def step(self) -> float:
        """What one more run of the key adds to its submitter's use, in the units of ``of``."""
        return max(self.estimate_s, 0.001) * self._scale(self._clock())


# A person's waiting runs as published: their ids and enqueue sequences, in order.
Picture = tuple[tuple[str, ...], tuple[int, ...]]


@dataclass
class _Person(Generic[E]):
    line: OrderedDict[str, E] = field(default_factory=OrderedDict)
    seqs: dict[str, int] = field(default_factory=dict)  # in the line's order: copied at C speed
    picture: Picture | None = None  # the line as last published, until it changes


class FairLine(Generic[E]):
    """The waiting runs of one queue key, by submitter; ``seq_of`` gives an entry's
    enqueue sequence (the FIFO order). Every operation but a pick is O(1); a pick is
    O(submitters waiting)."""

    def __init__(self, seq_of: Callable[[E], int], usage: Usage, fair: bool) -> None:
        self._seq_of = seq_of
        self._usage = usage
        self._fair = fair
        self._fifo: OrderedDict[str, tuple[str, E]] = OrderedDict()  # every waiting run, in enqueue order
        self._people: dict[str, _Person[E]] = {}
        self._submitters: frozenset[str] | None = frozenset()  # who waits, until someone comes or goes

    def __len__(self) -> int:
        return len(self._fifo)

    def add(self, run_id: str, submitter: str, entry: E) -> None:
        self._fifo[run_id] = (submitter, entry)
        person = self._people.get(submitter)
        if person is None:
            person = self._people[submitter] = _Person()
            self._submitters = None
        person.line[run_id] = entry
        person.seqs[run_id] = self._seq_of(entry)
        person.picture = None

    def remove(self, run_id: str) -> E | None:
        found = self._fifo.pop(run_id, None)
        if found is None:
            return None
        submitter, entry = found
        person = self._people[submitter]
        del person.line[run_id]
        del person.seqs[run_id]
        person.picture = None
        if not person.line:
            del self._people[submitter]
            self._submitters = None
        return entry

    def submitters(self) -> frozenset[str]:
        if self._submitters is None:
            self._submitters = frozenset(self._people)
        return self._submitters

    def pick(self, capped: Callable[[str], bool] | None = None) -> tuple[str, str, E] | None:
        """The run that gets the next free slot, taken out of the line; None when every
        waiting submitter is at its limit of runs at once (``capped``; None: nobody has one)."""
        if not self._fifo:
            return None
        if not self._fair or len(self._people) == 1:
            if capped is None:
                chosen: str | None = next(iter(self._fifo.values()))[0]
            else:
                chosen = next((who for who, _ in self._fifo.values() if not capped(who)), None)
        else:
            open_ = list(self._people) if capped is None else [who for who in self._people if not capped(who)]
            if not open_:
                return None
            used = self._usage.of(open_)
            least = min(used.values()) + _TIE * self._usage.step()
            # Use within a hair of the least is a tie, as ``Order`` counts one: FIFO decides.
            chosen = min((who for who in open_ if used[who] <= least), key=self._head_seq)
        if chosen is None:
            return None
        run_id, entry = next(iter(self._people[chosen].line.items()))
        self.remove(run_id)
        return run_id, chosen, entry

    def _head_seq(self, submitter: str) -> int:
        return next(iter(self._people[submitter].seqs.values()))

    def order(self, also: str | None = None) -> Order | None:
        """The published picture of the line, or None when the FIFO order (which the store
        answers) is the order: fifo mode, or one submitter waiting. ``also``: a submitter
        about to queue a run, who is in the picture even with nothing waiting."""
        if not self._fair or len(set(self._people) | ({also} if also is not None else set())) < 2:
            return None
        lines: dict[str, Picture] = {}
        for who, person in self._people.items():
            if person.picture is None:
                person.picture = (tuple(person.seqs), tuple(person.seqs.values()))
            lines[who] = person.picture
        if also is not None:
            lines.setdefault(also, ((), ()))
        return Order(lines, self._usage.of(list(lines)), self._usage.step())


@dataclass(frozen=True)
class Order:
    """The line of a queue key under fair order, as of one burst of its messages.
    ``used``: each submitter's use then, ``step``: what one more run adds to it (the key's
    recent slot time, in the same units)."""

    lines: Mapping[str, Picture]
    used: Mapping[str, float]
    step: float

    def position(self, run_id: str) -> int | None:
        """1 + the waiting runs that start before this one if nothing else arrives: each
        submitter's runs in turn of their use."""
        for who, (ids, seqs) in self.lines.items():
            try:
                index = ids.index(run_id)
            except ValueError:
                continue
            return 1 + index + sum(self._before(other, seqs[index], self.used[who] + index * self.step)
                                   for other in self.lines if other != who)
        return None

    def position_new(self, who: str) -> int:
        """Where a run ``who`` queued now would start: after its own waiting runs."""
        index = len(self.lines[who][0])
        key = self.used[who] + index * self.step
        return 1 + index + sum(self._before(other, _LAST, key) for other in self.lines if other != who)

    def _before(self, other: str, seq: int, key: float) -> int:
        """How many of ``other``'s runs start before a run of this use ``key`` and sequence."""
        seqs, used = self.lines[other][1], self.used[other]
        reach = (key - used) / self.step  # other's k-th run starts first when k < reach
        exact = round(reach)
        if abs(reach - exact) < _TIE:  # a tie goes to the run enqueued first
            count = exact + (1 if 0 <= exact < len(seqs) and seqs[exact] < seq else 0)
        else:
            count = math.ceil(reach)
        return max(0, min(len(seqs), count))


class DeviceUse(Generic[E]):
    """Use of each physical device (a worker's card, a machine's cpu) by submitter: the
    line of runs waiting at one device (a card shared by memory: for room) is taken in
    fair order when a run frees it. ``who``: an entry's submitter."""

    def __init__(self, half_life_s: float, who: Callable[[E], str]) -> None:
        self._half_life_s = half_life_s
        self._who = who
        self._by_device: dict[str, Usage] = {}

    def hold(self, physicals: list[str], run_id: str, submitter: str) -> None:
        for physical in physicals:
            usage = self._by_device.get(physical)
            if usage is None:
                usage = self._by_device[physical] = Usage(self._half_life_s)
            usage.hold(run_id, submitter)

    def release(self, run_id: str, physicals: list[str]) -> None:
        for physical in physicals:
            usage = self._by_device.get(physical)
            if usage is not None:
                usage.release(run_id)

    def in_fair_order(self, physical: str, waiting: deque[E]) -> deque[E]:
        """The line as it will be tried: each submitter's runs in their order, submitters
        in turn of their use of the device (as ``Order`` counts a queue's line); as it was
        when one submitter waits."""
        people = {self._who(entry) for entry in waiting}
        if len(people) < 2:
            return waiting
        usage = self._by_device.get(physical)
        used = usage.of(list(people)) if usage is not None else dict.fromkeys(people, 0.0)
        step = usage.step() if usage is not None else _ESTIMATE_S
        turns: dict[str, int] = {}
        keyed = []
        for index, entry in enumerate(waiting):
            who = self._who(entry)
            turn = turns.get(who, 0)
            turns[who] = turn + 1
            keyed.append((used[who] + turn * step, index, entry))
        keyed.sort(key=lambda item: (item[0], item[1]))
        return deque(entry for _, _, entry in keyed)

