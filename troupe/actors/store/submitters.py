"""Who submitted what: the reads fair order and quotas need of the runs table. Called
only from the store's thread."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

import apsw

from troupe.actors.store.table import Table
from troupe.protocol import events as ev

# Messages: reads ---------------------------------------------------------------


@dataclass(frozen=True)
class KeyUsage:
    """What each submitter used of a queue key since ``since`` (epoch seconds): rows of
    (submitter, started, ended or None while it runs, run id), for fair order."""

    queue_key: str
    since: float


@dataclass(frozen=True)
class SessionCap:
    """How many runs the session may have running at once (its class link's limit), or None."""

    session_id: str


@dataclass(frozen=True)
class SessionLoad:
    """What a submitter has now: ``{"running", "waiting", "memory_mib"}`` (the declared or
    derived memory budgets of its running and waiting runs)."""

    submitted_by: str


# SQL ---------------------------------------------------------------------------

_EPOCH = "(julianday({}) - 2440587.5) * 86400.0"


def key_usage(conn: apsw.Connection, query: KeyUsage) -> list[tuple[str, float, float | None, str]]:
    rows = conn.execute(
        f"SELECT submitted_by, {_EPOCH.format('started_at')}, {_EPOCH.format('finished_at')}, id, status FROM runs "
        "WHERE queue_key = ? AND lane = 'queued' AND started_at IS NOT NULL "
        "AND (status IN ('running', 'disconnected') OR finished_at >= ?)",
        (query.queue_key, datetime.fromtimestamp(query.since, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")))
    return [(str(who or ""), float(started), None if status in _HOLDING or ended is None else float(ended),
             str(run_id)) for who, started, ended, run_id, status in rows
            if started is not None and (status in _HOLDING or ended is not None)]


_HOLDING = (ev.RUNNING, ev.DISCONNECTED)  # the states whose run still holds its slot


def session_load(conn: apsw.Connection, query: SessionLoad) -> dict[str, int]:
    load = {"running": 0, "waiting": 0, "memory_mib": 0}
    for status, count, memory in conn.execute(
            "SELECT status, COUNT(*), COALESCE(SUM(memory_budget_mib), 0) FROM runs WHERE submitted_by = ? "
            "AND status IN ('queued', 'running', 'disconnected') GROUP BY status", (query.submitted_by,)):
        # A disconnected run is still running as far as its session is concerned: its
        # worker may come back with it, and its slot stays held meanwhile.
        load["waiting" if status == ev.QUEUED else "running"] += int(str(count))
        load["memory_mib"] += int(str(memory))
    return load


def session_cap(conn: apsw.Connection, query: SessionCap) -> int | None:
    found = conn.execute("SELECT quotas FROM sessions WHERE id = ?", (query.session_id,)).fetchall()
    quotas = json.loads(str(found[0][0])) if found and found[0][0] else {}
    return int(quotas["max_running"]) if quotas.get("max_running") else None


READS: Table = {
    KeyUsage: lambda s, m: key_usage(s.conn, m),
    SessionCap: lambda s, m: session_cap(s.conn, m),
    SessionLoad: lambda s, m: session_load(s.conn, m),
}
WRITES: Table = {}
