"""A run's log: its events, metric points and recorded node outputs.

Events arrive already numbered by their RunActor; appending a seq twice is a no-op, so
a retried or replayed write is harmless.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import apsw

from troupe.actors.errors import RunNotFound
from troupe.actors.store.run_index import index_points
from troupe.actors.store.table import Table
from troupe.protocol import events as ev

# Messages: writes --------------------------------------------------------------


@dataclass(frozen=True)
class AppendEvents:
    """Events already numbered by their RunActor; ``metric`` events also become
    metric rows."""

    run_id: str
    events: tuple[Mapping[str, Any], ...]
    # A worker run: the highest frame counter these events apply (replay dedup).
    counter: int | None = None


@dataclass(frozen=True)
class RecordOutputs:
    """One node's outputs, as summaries. Only the newest ``keep_runs`` runs keep theirs:
    older runs' recorded outputs are evicted."""

    run_id: str
    node_id: str
    outputs: Mapping[str, Any]
    keep_runs: int = 20


# Messages: reads ---------------------------------------------------------------


@dataclass(frozen=True)
class GetEvents:
    run_id: str
    after: int = 0
    tail: int | None = None
    cap_bytes: int = 0


@dataclass(frozen=True)
class EventsOfType:
    """Every event of one type of a run, in order (its provenance records)."""

    run_id: str
    type: str


@dataclass(frozen=True)
class GetMetrics:
    run_id: str


@dataclass(frozen=True)
class GetOutputs:
    """Recorded outputs by node id; one node's when ``node_id`` is given."""

    run_id: str
    node_id: str | None = None


# SQL ---------------------------------------------------------------------------

def append_events(conn: apsw.Connection, run_id: str, events: Iterable[Mapping[str, Any]],
                  counter: int | None = None) -> None:
    """``counter``: the highest worker frame counter these events apply, persisted in
    the same transaction, so a replayed frame is recognised after any restart."""
    if counter is not None:
        conn.execute("UPDATE runs SET worker_counter = MAX(worker_counter, ?) WHERE id = ?", (counter, run_id))
    rows, metrics = [], []
    for event in events:
        payload = event["payload"]
        rows.append((run_id, event["seq"], event["type"], event["ts"], event.get("node_id"), ev.payload_json(event)))
        if event["type"] == ev.METRIC and (isinstance(payload.get("value"), int | float) or payload.get("non_finite")):
            value = payload.get("value")
            metrics.append((run_id, str(payload.get("name")), int(payload.get("step") or 0),
                            None if value is None else float(value), payload.get("non_finite"), event["ts"],
                            event["seq"]))
    try:
        conn.executemany(
            "INSERT OR IGNORE INTO events(run_id, seq, type, ts, node_id, payload) VALUES (?, ?, ?, ?, ?, ?)", rows
        )
    except apsw.ConstraintError:
        # A run starts before its row commits; a row refused (a full disk) leaves its
        # first events with no run to belong to. An answer, not a fault to log.
        if not conn.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchall():
            raise RunNotFound(f"run {run_id} was never stored: its events are not kept") from None
        raise
    if metrics:
        conn.executemany(
            "INSERT OR IGNORE INTO metrics(run_id, series, step, value, non_finite, ts, seq) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            metrics,
        )
        index_points(conn, run_id, metrics)  # each series' newest and best, in the same transaction


def get_events(
    conn: apsw.Connection, run_id: str, after: int, tail: int | None, cap_bytes: int
) -> tuple[list[dict[str, Any]], int | None]:
    """A page of events and the ``after`` to ask for next when the byte cap cut it:
    those after ``after``, or with ``tail`` the last ``tail`` of those. Rows are read
    only as far as the page goes."""
    rows, next_after = event_rows(conn, run_id, after, tail, cap_bytes)
    return [ev.stored_event(*row) for row in rows], next_after


# seq, type, ts, node_id and the payload's JSON, as stored: what a stream frames as it is.
EventRow = tuple[int, str, str, str | None, str]


def event_rows(
    conn: apsw.Connection, run_id: str, after: int, tail: int | None, cap_bytes: int
) -> tuple[list[EventRow], int | None]:
    """``get_events``'s page as the rows are stored, payloads not parsed: a stream only
    sends them on."""
    found: Any
    if tail is not None:
        found = conn.execute(
            "SELECT * FROM (SELECT seq, type, ts, node_id, payload FROM events WHERE run_id = ? AND seq > ? "
            "ORDER BY seq DESC LIMIT ?) ORDER BY seq", (run_id, after, tail))
    else:
        found = conn.execute(
            "SELECT seq, type, ts, node_id, payload FROM events WHERE run_id = ? AND seq > ? ORDER BY seq",
            (run_id, after))
    rows: list[EventRow] = []
    used = 0
    for row in found:
        size = len(row[4]) + 96
        # A page always holds at least one event, or a huge one would block the cursor.
        if cap_bytes > 0 and rows and used + size > cap_bytes:
            return rows, rows[-1][0]
        used += size
        rows.append(row)
    return rows, None


def events_of_type(conn: apsw.Connection, run_id: str, kind: str) -> list[dict[str, Any]]:
    return [ev.stored_event(seq, kind, ts, node_id, payload) for seq, ts, node_id, payload in conn.execute(
        "SELECT seq, ts, node_id, payload FROM events WHERE run_id = ? AND type = ? ORDER BY seq", (run_id, kind))]


def get_metrics(conn: apsw.Connection, run_id: str) -> dict[str, list[dict[str, Any]]]:
    series: dict[str, list[dict[str, Any]]] = {}
    for name, step, value, non_finite, ts in conn.execute(
        "SELECT series, step, value, non_finite, ts FROM metrics WHERE run_id = ? ORDER BY seq", (run_id,)
    ):
        point = {"step": step, "value": value, "ts": ts}
        if non_finite is not None:
            point["non_finite"] = non_finite
        series.setdefault(str(name), []).append(point)
    return series


def record_outputs(
    conn: apsw.Connection, run_id: str, node_id: str, outputs: Mapping[str, Any], keep_runs: int
) -> None:
    conn.execute(
        "INSERT OR REPLACE INTO recorded_outputs(run_id, node_id, outputs) VALUES (?, ?, ?)",
        (run_id, node_id, json.dumps(outputs)),
    )
    conn.execute(
        "DELETE FROM recorded_outputs WHERE run_id NOT IN (SELECT DISTINCT o.run_id FROM recorded_outputs o "
        "JOIN runs r ON r.id = o.run_id ORDER BY r.enqueue_seq DESC LIMIT ?)",
        (max(0, keep_runs),),
    )


def get_outputs(conn: apsw.Connection, run_id: str, node_id: str | None) -> dict[str, Any]:
    query = "SELECT node_id, outputs FROM recorded_outputs WHERE run_id = ?"
    args: tuple[Any, ...] = (run_id,)
    if node_id is not None:
        query += " AND node_id = ?"
        args = (run_id, node_id)
    return {str(n): json.loads(str(o)) for n, o in conn.execute(query, args)}


WRITES: Table = {
    AppendEvents: lambda s, op: append_events(s.conn, op.run_id, op.events, op.counter),
    RecordOutputs: lambda s, op: record_outputs(s.conn, op.run_id, op.node_id, op.outputs, op.keep_runs),
}
READS: Table = {
    GetEvents: lambda s, m: get_events(s.conn, m.run_id, m.after, m.tail, m.cap_bytes),
    EventsOfType: lambda s, m: events_of_type(s.conn, m.run_id, m.type),
    GetMetrics: lambda s, m: get_metrics(s.conn, m.run_id),
    GetOutputs: lambda s, m: get_outputs(s.conn, m.run_id, m.node_id),
}
