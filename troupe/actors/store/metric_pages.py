"""A run's metric points read a page at a time, for a reply that streams them.

``GetMetrics`` answers every point of a run at once: a run of 4,000,000 points was
about a gigabyte of dicts on the store's thread, past the read's deadline, and the
server kept most of that memory after the reply (issue 62). These reads answer the
series first, then one series' points a page at a time, so a reply holds one page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import apsw

from troupe.actors.store.table import Table

PointRow = tuple[int, int, float | None, str | None, str]  # seq, step, value, non_finite, ts

# The newest value of one run's series, read by the (run_id, series, seq) index whatever
# the planner's statistics say (``runs._FINAL_LOSS`` says why).
NEWEST_VALUE = ("SELECT value FROM metrics INDEXED BY metrics_series WHERE run_id = ? AND series = ? "
                "ORDER BY seq DESC LIMIT 1")


@dataclass(frozen=True)
class MetricSeries:
    """A run's series in the order their first points came (the order ``GetMetrics``
    gives), and the newest seq of its points then: pages stop there, so a live run's
    reply is the run as it was when the reply started, not a chase after its points."""

    run_id: str


@dataclass(frozen=True)
class MetricPage:
    """Points of one series with ``after < seq <= until``, in seq order, at most ``limit``."""

    run_id: str
    series: str
    after: int
    until: int
    limit: int


def metric_series(conn: apsw.Connection, run_id: str) -> tuple[list[str], int]:
    """Walks the distinct names by the index on ``(run_id, series, seq)``, one step a
    name (not a scan of every point), then each name's first seq."""
    names: list[str] = []
    query = "SELECT series FROM metrics INDEXED BY metrics_series WHERE run_id = ? ORDER BY series LIMIT 1"
    args: tuple[Any, ...] = (run_id,)
    while found := conn.execute(query, args).fetchall():
        names.append(str(found[0][0]))
        query = ("SELECT series FROM metrics INDEXED BY metrics_series WHERE run_id = ? AND series > ? "
                 "ORDER BY series LIMIT 1")
        args = (run_id, names[-1])
    first = {name: int(cast(int, conn.execute(
        "SELECT MIN(seq) FROM metrics INDEXED BY metrics_series WHERE run_id = ? AND series = ?",
        (run_id, name)).fetchall()[0][0])) for name in names}
    newest = conn.execute("SELECT MAX(seq) FROM metrics WHERE run_id = ?", (run_id,)).fetchall()[0][0]
    return sorted(names, key=lambda name: first[name]), int(cast(int, newest or 0))


def metric_page(conn: apsw.Connection, query: MetricPage) -> list[PointRow]:
    return cast(list[PointRow], conn.execute(
        "SELECT seq, step, value, non_finite, ts FROM metrics INDEXED BY metrics_series "
        "WHERE run_id = ? AND series = ? AND seq > ? AND seq <= ? ORDER BY seq LIMIT ?",
        (query.run_id, query.series, query.after, query.until, query.limit)).fetchall())


WRITES: Table = {}
READS: Table = {
    MetricSeries: lambda s, m: metric_series(s.conn, m.run_id),
    MetricPage: lambda s, m: metric_page(s.conn, m),
}
