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

import heapq
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping
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
        """What a slot-second at ``at`` weighs against one at the base. Past ``_REBASE``
        half-lives the base moves to ``at`` first (a key idle for weeks would otherwise
        ask for a power of two past what a float holds)."""
        exponent = (at - self._base) / self._half_life
        if exponent > _REBASE:
            shrink = 2.0 ** -exponent  # underflows to 0.0 at worst: so long ago it no longer counts
            self._charged = {who: used * shrink for who, used in self._charged.items()}
            self._base, exponent = at, 0.0
        return 2.0 ** exponent

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
        weighed = seconds * self._scale(at)  # first: it may move the base, and every figure with it
        self._charged[submitter] = self._charged.get(submitter, 0.0) + weighed

    @property
    def base(self) -> float:
        """The moment stored figures are scaled to; it moves (and every figure shrinks)
        only after ``_REBASE`` half-lives."""
        return self._base

    @property
    def charges(self) -> Mapping[str, float]:
        """What each submitter used, runs still holding a slot left out (``of`` adds
        them): a figure only grows while the base stays. Read it, never keep it."""
        return self._charged

    def running(self) -> dict[str, float]:
        """What the runs holding a slot add to their submitters' use now (``of`` less ``charged``)."""
        if not self._holding:
            return {}
        now = self._clock()
        scale = self._scale(now)
        extra: dict[str, float] = {}
        for who, since in self._holding.values():
            extra[who] = extra.get(who, 0.0) + max(0.0, now - since) * scale
        return extra

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

    def at(self) -> tuple[UseAt, float]:
        """Each one's use now, as ``of`` gives it, computed only for those asked about;
        and ``step`` now (one reading of the clock for both)."""
        now = self._clock()
        scale = self._scale(now)
        return UseAt(dict(self._charged), tuple(self._holding.values()), now, scale), \
            max(self.estimate_s, 0.001) * scale

    def step(self) -> float:
        """What one more run of the key adds to its submitter's use, in the units of ``of``."""
        return max(self.estimate_s, 0.001) * self._scale(self._clock())


# A person's waiting runs as published: lists only ever appended to, and the bounds of
# the line in them then: (ids, enqueue sequences, start, end).
Picture = tuple[list[str], list[int], int, int]
_COMPACT = 4096  # a person's lists are copied anew once this many picked runs lead them


class _Person:
    """One submitter's waiting runs. ``line`` is the truth (run -> enqueue sequence, in
    order; a withdrawal anywhere is O(1)); ``ids``/``seqs`` from ``head`` on are the same
    line in lists that are only appended to, so a published picture stays true as runs
    are picked from the front and queued at the back, and publishing costs O(1). A run
    withdrawn from the middle drops the lists (rebuilt, at C speed, when next published)."""

    __slots__ = ("head", "ids", "line", "seqs")

    def __init__(self) -> None:
        self.line: OrderedDict[str, int] = OrderedDict()
        self.ids: list[str] | None = []
        self.seqs: list[int] = []
        self.head = 0

    def picture(self) -> Picture:
        if self.ids is None or (self.head > _COMPACT and 2 * self.head > len(self.ids)):
            self.ids, self.seqs, self.head = list(self.line), list(self.line.values()), 0
        return self.ids, self.seqs, self.head, len(self.ids)


class FairLine(Generic[E]):
    """The waiting runs of one queue key, by submitter; ``seq_of`` gives an entry's
    enqueue sequence (the FIFO order). Every operation but a pick is O(1); publishing
    the line (``order``) is O(submitters waiting).

    A fair pick reads a heap of one entry per submitter waiting, keyed (use charged,
    sequence of the first waiting run). Both parts only grow while a submitter waits
    (a run ending charges its use; a run leaving the front gives the next one's
    sequence), so an entry's key is never above the truth: a stale entry is put back
    with its true key when it comes to the top, and a pick costs O(log submitters), plus
    the submitters holding slots or at their limit that it passes on the way."""

    def __init__(self, seq_of: Callable[[E], int], usage: Usage, fair: bool) -> None:
        self._seq_of = seq_of
        self._usage = usage
        self._fair = fair
        self._fifo: OrderedDict[str, tuple[str, E]] = OrderedDict()  # every waiting run, in enqueue order
        self._people: dict[str, _Person] = {}
        self._submitters: frozenset[str] | None = frozenset()  # who waits, until someone comes or goes
        self._pictures: dict[str, Picture] = {}  # each person's line as last published
        self._changed: set[str] = set()  # people whose line changed since
        self._heap: list[tuple[float, int, str]] = []  # (use charged, first sequence, submitter): fair order
        self._in_heap: set[str] = set()  # those with an entry (one each)
        self._heap_base = usage.base  # the usage's base the keys are in

    def __len__(self) -> int:
        return len(self._fifo)

    def add(self, run_id: str, submitter: str, entry: E) -> None:
        self._fifo[run_id] = (submitter, entry)
        person = self._people.get(submitter)
        seq = self._seq_of(entry)
        if person is None:
            person = self._people[submitter] = _Person()
            self._submitters = None
            if self._fair and submitter not in self._in_heap:
                self._in_heap.add(submitter)
                heapq.heappush(self._heap, (self._usage.charges.get(submitter, 0.0), seq, submitter))
        person.line[run_id] = seq
        if person.ids is not None:
            person.ids.append(run_id)
            person.seqs.append(seq)
        self._changed.add(submitter)

    def remove(self, run_id: str) -> E | None:
        found = self._fifo.pop(run_id, None)
        if found is None:
            return None
        submitter, entry = found
        person = self._people[submitter]
        if next(iter(person.line)) == run_id:
            person.line.popitem(last=False)
            person.head += 1
        else:
            del person.line[run_id]
            person.ids = None
        if not person.line:
            del self._people[submitter]
            self._pictures.pop(submitter, None)
            self._changed.discard(submitter)
            self._submitters = None
        else:
            self._changed.add(submitter)
        return entry

    def waiting_of(self, submitter: str) -> int:
        person = self._people.get(submitter)
        return len(person.line) if person is not None else 0

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
            chosen = self._least_used(capped)
        if chosen is None:
            return None
        run_id = next(iter(self._people[chosen].line))
        entry = self.remove(run_id)
        if self._fair and chosen not in self._in_heap:
            person = self._people.get(chosen)
            if person is not None:
                self._in_heap.add(chosen)
                heapq.heappush(self._heap, (self._usage.charges.get(chosen, 0.0), next(iter(person.line.values())),
                                            chosen))
        return run_id, chosen, entry  # type: ignore[return-value]  # it was in the line

    def _least_used(self, capped: Callable[[str], bool] | None) -> str | None:
        """The submitter whose turn it is: least use (runs holding a slot included), FIFO
        on a tie (use within a hair of the least, as ``Order`` counts one); None when
        everyone waiting is ``capped``."""
        usage, people, heap = self._usage, self._people, self._heap
        tie = _TIE * usage.step()  # first: reading the clock may move the base
        running = usage.running()
        if usage.base != self._heap_base:  # every figure shrank: keys are no longer below the truth
            self._heap_base = usage.base
            self._heap[:] = [(usage.charges.get(who, 0.0), next(iter(p.line.values())), who)
                             for who, p in people.items()]
            heapq.heapify(heap)
            self._in_heap = set(people)
        charges = usage.charges
        while heap:  # stale entries rise to the top (their keys are below the truth): put them right
            charged, seq, who = heap[0]
            person = people.get(who)
            if person is None:  # left the line
                heapq.heappop(heap)
                self._in_heap.discard(who)
                continue
            true_charged, true_seq = charges.get(who, 0.0), next(iter(person.line.values()))
            if charged == true_charged and seq == true_seq:
                break
            heapq.heapreplace(heap, (true_charged, true_seq, who))
        if heap and (capped is None or not capped(heap[0][2])):
            # The common case: nobody else is within a hair of the top's use (the top's
            # two children bound every other key from below): its turn, no more to read.
            charged, seq, who = heap[0]
            reach = charged + running.get(who, 0.0) + tie
            size = len(heap)
            if (size < 2 or heap[1][0] > reach) and (size < 3 or heap[2][0] > reach):
                heapq.heappop(heap)
                self._in_heap.discard(who)  # until ``pick`` puts it back with its next run's sequence
                return who
        seen: list[tuple[float, int, str, float]] = []  # (charged, first sequence, submitter, use) popped
        least = math.inf
        while heap and heap[0][0] <= least + tie:
            charged, seq, who = heapq.heappop(heap)
            person = people.get(who)
            if person is None:  # left the line
                self._in_heap.discard(who)
                continue
            true = (charges.get(who, 0.0), next(iter(person.line.values())))
            if (charged, seq) != true:
                heapq.heappush(heap, (*true, who))
                continue
            if capped is not None and capped(who):
                seen.append((charged, seq, who, math.inf))
                continue
            used = charged + running.get(who, 0.0)
            seen.append((charged, seq, who, used))
            least = min(least, used)
        ties = [(seq, who) for _, seq, who, used in seen if used <= least + tie] if least < math.inf else []
        chosen = min(ties)[1] if ties else None
        for charged, seq, who, _ in seen:
            if who != chosen:
                heapq.heappush(heap, (charged, seq, who))
            else:
                self._in_heap.discard(who)  # until ``pick`` puts it back with its next run's sequence
        return chosen

    def order(self, also: str | None = None) -> Order | None:
        """The published picture of the line, or None when the FIFO order (which the store
        answers) is the order: fifo mode, or one submitter waiting. ``also``: a submitter
        about to queue a run, who is in the picture even with nothing waiting."""
        people = self._people
        if not self._fair or (len(people) < 2 and (also is None or also in people or not people)):
            return None
        for who in self._changed:
            self._pictures[who] = people[who].picture()
        self._changed.clear()
        lines = dict(self._pictures)
        if also is not None and also not in lines:
            lines[also] = ([], [], 0, 0)
        return Order(lines, *self._usage.at())


class UseAt:
    """What each submitter had used of a key at one moment, computed when first asked
    (a published line is read far less often than it changes). Never changed once made
    (a plain class: a frozen dataclass costs a microsecond more to make, at every pick)."""

    __slots__ = ("_cache", "_charged", "_holding", "_now", "_scale")

    def __init__(self, charged: Mapping[str, float], holding: tuple[tuple[str, float], ...], now: float,
                 scale: float) -> None:
        self._charged = charged
        self._holding = holding  # (submitter, since) of each run holding a slot
        self._now = now
        self._scale = scale
        self._cache: dict[str, float] = {}

    def __getitem__(self, who: str) -> float:
        found = self._cache.get(who)
        if found is None:
            found = self._cache[who] = self._charged.get(who, 0.0) + sum(
                max(0.0, self._now - since) * self._scale for holder, since in self._holding if holder == who)
        return found


class Order:
    """The line of a queue key under fair order, as of one burst of its messages.
    ``used``: each submitter's use then, ``step``: what one more run adds to it (the key's
    recent slot time, in the same units). Never changed once made."""

    __slots__ = ("lines", "step", "used")

    def __init__(self, lines: Mapping[str, Picture], used: UseAt, step: float) -> None:
        self.lines = lines
        self.used = used
        self.step = step

    def ids(self, who: str) -> list[str]:
        """``who``'s waiting runs, in their order."""
        ids, _, start, end = self.lines[who]
        return ids[start:end]

    def position(self, run_id: str) -> int | None:
        """1 + the waiting runs that start before this one if nothing else arrives: each
        submitter's runs in turn of their use."""
        for who, (ids, seqs, start, end) in self.lines.items():
            try:
                at = ids.index(run_id, start, end)
            except ValueError:
                continue
            index = at - start
            return 1 + index + sum(self._before(other, seqs[at], self.used[who] + index * self.step)
                                   for other in self.lines if other != who)
        return None

    def position_new(self, who: str) -> int:
        """Where a run ``who`` queued now would start: after its own waiting runs."""
        _, _, start, end = self.lines[who]
        index = end - start
        key = self.used[who] + index * self.step
        return 1 + index + sum(self._before(other, _LAST, key) for other in self.lines if other != who)

    def _before(self, other: str, seq: int, key: float) -> int:
        """How many of ``other``'s runs start before a run of this use ``key`` and sequence."""
        _, seqs, start, end = self.lines[other]
        used = self.used[other]
        reach = (key - used) / self.step  # other's k-th run starts first when k < reach
        exact = round(reach)
        if abs(reach - exact) < _TIE:  # a tie goes to the run enqueued first
            count = exact + (1 if 0 <= exact < end - start and seqs[start + exact] < seq else 0)
        else:
            count = math.ceil(reach)
        return max(0, min(end - start, count))


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

