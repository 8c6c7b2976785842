"""What runs did since this control plane started, as Prometheus counters and
histograms: runs finished by status, how long runs ran and waited in line by queue key,
runs started on each worker. The event hub feeds it each commit it fans out (it sees
every run's insert and status change, in order); ``/metrics`` reads its registry.

Counted in memory, as Prometheus expects of a process (a restart starts them again,
which Prometheus reads as a reset), never derived from rows that retention deletes."""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.samples import Sample

from troupe.protocol import events as ev

# Seconds: a quick graph, a minute, a lesson, a night's training, a weekend's.
DURATION_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 12 * 3600.0, 48 * 3600.0)
WAIT_BUCKETS = (0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0)


class RunTally:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._finished = Counter("troupe_runs_finished", "Runs that ended since the server started, by status.",
                                 ["status"], registry=self.registry)
        self._duration = _KeyedHistogram("troupe_run_duration_seconds", "How long runs ran, start to end, by "
                                         "queue key.", DURATION_BUCKETS)
        self._wait = _KeyedHistogram("troupe_queue_wait_seconds", "How long runs waited from submission to start, "
                                     "by queue key.", WAIT_BUCKETS)
        self.registry.register(self._duration)
        self.registry.register(self._wait)
        self._worker_runs = Counter("troupe_worker_runs", "Runs started on each worker since the server started.",
                                    ["worker"], registry=self.registry)
        # run id -> (queue key, created, started, its named worker): what its start and
        # end are measured by.
        self._open: dict[str, tuple[str, str, str | None, str | None]] = {}

    def inserted(self, run_id: str, queue_key: str, created_at: str, worker: str | None) -> None:
        self._open[run_id] = (queue_key, created_at, None, worker)

    def changed(self, run_id: str, fields: Mapping[str, Any]) -> None:
        status = fields.get("status")
        known = self._open.get(run_id)
        # A start: "running", or a run of a few quick nodes whose row went from queued to
        # its end in one write (its start time came with it).
        if status == ev.RUNNING or (status in ev.TERMINAL_STATES and fields.get("started_at")):
            worker = fields.get("worker") or (known[3] if known is not None else None)
            if worker:  # a pool's run names its worker as it starts; a named one had it
                self._worker_runs.labels(str(worker)).inc()
            if known is not None and fields.get("started_at"):
                queue_key, created, _, named = known
                known = self._open[run_id] = (queue_key, created, str(fields["started_at"]), named)
                self._wait.observe(queue_key, _seconds(created, str(fields["started_at"])))
        if status in ev.TERMINAL_STATES:
            self._finished.labels(str(status)).inc()
            self._open.pop(run_id, None)
            if known is not None and known[2] is not None and fields.get("finished_at"):
                self._duration.observe(known[0], _seconds(known[2], str(fields["finished_at"])))

    def deleted(self, run_id: str) -> None:
        self._open.pop(run_id, None)


class _KeyedHistogram:
    """A histogram by queue key, exposed as ``prometheus_client``'s own would be (buckets,
    count, sum, created), but kept as one list of floats a key.

    The library's histogram keeps each bucket as an object with its own lock: about 27
    objects the garbage collector walks for every key, 235,000 for the 4,351 keys of
    bench/scale.py's x4, and a full collection over them paused the server for up to
    180 ms under load. Only the event hub observes; a scrape copies each list first, so
    it reads one observation's state or the next, and the count is the +Inf bucket's."""

    def __init__(self, name: str, documentation: str, bounds: tuple[float, ...]) -> None:
        self._name, self._documentation, self._bounds = name, documentation, bounds
        # queue key -> [a count per bound, the +Inf count, the sum, created (epoch s)]
        self._by_key: dict[str, list[float]] = {}

    def observe(self, queue_key: str, value: float) -> None:
        tally = self._by_key.get(queue_key)
        if tally is None:
            tally = self._by_key[queue_key] = [0.0] * (len(self._bounds) + 2) + [time.time()]
        tally[bisect.bisect_left(self._bounds, value)] += 1.0  # le: a value on a bound counts there
        tally[-2] += value

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self._name, self._documentation, labels=["queue_key"])

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=["queue_key"])
        edges = [*(_le(bound) for bound in self._bounds), "+Inf"]
        for queue_key, tally in list(self._by_key.items()):
            tally = list(tally)
            running, buckets = 0.0, []
            for edge, count in zip(edges, tally[:len(edges)], strict=True):
                running += count
                buckets.append((edge, running))
            family.add_metric([queue_key], buckets, tally[-2])
            family.samples.append(Sample(self._name + "_created", {"queue_key": queue_key}, tally[-1]))
        yield family


def _le(bound: float) -> str:
    return str(float(bound))  # the library writes its bounds so: "0.1", "60.0"


def _seconds(start: str, end: str) -> float:
    def parsed(stamp: str) -> datetime:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))

    return max(0.0, (parsed(end) - parsed(start)).total_seconds())
