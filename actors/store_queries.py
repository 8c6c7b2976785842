"""The SQL behind the store's messages. Called only from the store's own thread."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import apsw

from actors.errors import RunNotFound, RunStillActive
from protocol import events as ev

RUN_COLUMNS = (
    "id", "name", "status", "device", "queue_key", "lane", "editor_session", "seed", "deterministic",
    "record_outputs", "graph", "options", "warnings", "enqueue_seq", "created_at", "started_at",
    "finished_at", "error", "error_detail", "sweep_id", "sweep_variant", "study_id", "worker",
    "holds", "worker_counter",
)
_JSON_COLUMNS = ("graph", "options", "warnings", "holds")
UPDATABLE = frozenset(RUN_COLUMNS) - {"id", "enqueue_seq", "created_at"}

_TERMINAL = "('succeeded', 'failed', 'cancelled', 'interrupted')"

# queue_position: 1 + the queued-lane runs still queued ahead on the same key.
_POSITION = """
    CASE WHEN r.status = 'queued' AND r.lane = 'queued' THEN 1 + (
        SELECT COUNT(*) FROM runs a
        WHERE a.queue_key = r.queue_key AND a.status = 'queued' AND a.lane = 'queued'
          AND a.enqueue_seq < r.enqueue_seq)
    END
"""
# final_loss: the last val_loss, else the last train_loss.
# The last val_loss point, else the last train_loss point, as [value, non_finite].
_FINAL_LOSS = """
    COALESCE(
        (SELECT json_array(value, non_finite) FROM metrics m WHERE m.run_id = r.id AND m.series = 'val_loss'
         ORDER BY m.seq DESC LIMIT 1),
        (SELECT json_array(value, non_finite) FROM metrics m WHERE m.run_id = r.id AND m.series = 'train_loss'
         ORDER BY m.seq DESC LIMIT 1))
"""
_SELECT = f"SELECT {', '.join('r.' + c for c in RUN_COLUMNS)}, {_POSITION}, {_FINAL_LOSS} FROM runs r"


def _row(values: tuple[Any, ...]) -> dict[str, Any]:
    row = dict(zip(RUN_COLUMNS, values[: len(RUN_COLUMNS)], strict=True))
    row["queue_position"], final = values[len(RUN_COLUMNS):]
    # A diverged loss is null with what it was: "nan", "inf" or "-inf".
    row["final_loss"], row["final_loss_non_finite"] = json.loads(str(final)) if final is not None else (None, None)
    row["deterministic"] = bool(row["deterministic"])
    row["record_outputs"] = bool(row["record_outputs"])
    for key in _JSON_COLUMNS:
        row[key] = json.loads(row[key]) if row[key] is not None else None
    return row


def _encode(key: str, value: Any) -> Any:
    if key in _JSON_COLUMNS:
        return json.dumps(value)
    if isinstance(value, bool):
        return int(value)
    return value


def insert_run(conn: apsw.Connection, row: Mapping[str, Any]) -> None:
    keys = [k for k in RUN_COLUMNS if k in row]
    conn.execute(
        f"INSERT OR IGNORE INTO runs({', '.join(keys)}) VALUES ({', '.join('?' for _ in keys)})",
        tuple(_encode(k, row[k]) for k in keys),
    )


def update_run(conn: apsw.Connection, run_id: str, fields: Mapping[str, Any]) -> None:
    unknown = set(fields) - UPDATABLE
    if unknown:
        raise ValueError(f"cannot update run columns {sorted(unknown)}")
    if not fields:
        return
    assignments = ", ".join(f"{k} = ?" for k in fields)
    conn.execute(
        f"UPDATE runs SET {assignments} WHERE id = ?", (*(_encode(k, v) for k, v in fields.items()), run_id)
    )


def append_events(conn: apsw.Connection, run_id: str, events: Iterable[Mapping[str, Any]],
                  counter: int | None = None) -> None:
    """``counter``: the highest worker frame counter these events apply, persisted in
    the same transaction, so a replayed frame is recognised after any restart."""
    if counter is not None:
        conn.execute("UPDATE runs SET worker_counter = MAX(worker_counter, ?) WHERE id = ?", (counter, run_id))
    rows, metrics = [], []
    for event in events:
        payload = event["payload"]
        rows.append((run_id, event["seq"], event["type"], event["ts"], event.get("node_id"), json.dumps(payload)))
        if event["type"] == ev.METRIC and (isinstance(payload.get("value"), int | float) or payload.get("non_finite")):
            value = payload.get("value")
            metrics.append((run_id, str(payload.get("name")), int(payload.get("step") or 0),
                            None if value is None else float(value), payload.get("non_finite"), event["ts"],
                            event["seq"]))
    conn.executemany(
        "INSERT OR IGNORE INTO events(run_id, seq, type, ts, node_id, payload) VALUES (?, ?, ?, ?, ?, ?)", rows
    )
    if metrics:
        conn.executemany(
            "INSERT OR IGNORE INTO metrics(run_id, series, step, value, non_finite, ts, seq) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            metrics,
        )


def get_run(conn: apsw.Connection, run_id: str) -> dict[str, Any] | None:
    found = conn.execute(f"{_SELECT} WHERE r.id = ?", (run_id,)).fetchall()
    if not found:
        return None
    row = _row(found[0])
    row["artifacts"] = [
        {"node_id": n, "kind": k, "path": p, "created_at": c}
        for n, k, p, c in conn.execute(
            "SELECT node_id, kind, path, created_at FROM artifacts WHERE run_id = ? ORDER BY rowid", (run_id,)
        )
    ]
    return row


def list_runs(conn: apsw.Connection, query: Any) -> tuple[list[dict[str, Any]], int | None]:
    """Newest first; returns the rows and the enqueue_seq to continue before, if any."""
    where, args = [], []
    for column in ("status", "sweep_id", "study_id"):
        value = getattr(query, column)
        if value is not None:
            where.append(f"r.{column} = ?")
            args.append(value)
    if query.before_seq is not None:
        where.append("r.enqueue_seq < ?")
        args.append(query.before_seq)
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    rows = [
        _row(v)
        for v in conn.execute(f"{_SELECT}{clause} ORDER BY r.enqueue_seq DESC LIMIT ?", (*args, query.limit + 1))
    ]
    if len(rows) > query.limit:
        rows = rows[: query.limit]
        return rows, rows[-1]["enqueue_seq"]
    return rows, None


def get_events(
    conn: apsw.Connection, run_id: str, after: int, tail: int | None, cap_bytes: int
) -> tuple[list[dict[str, Any]], int | None]:
    """A page of events and the ``after`` to ask for next when the byte cap cut it."""
    if tail is not None:
        found = list(
            conn.execute(
                "SELECT seq, type, ts, node_id, payload FROM events WHERE run_id = ? ORDER BY seq DESC LIMIT ?",
                (run_id, tail),
            )
        )
        found.reverse()
    else:
        found = list(
            conn.execute(
                "SELECT seq, type, ts, node_id, payload FROM events WHERE run_id = ? AND seq > ? ORDER BY seq",
                (run_id, after),
            )
        )
    events: list[dict[str, Any]] = []
    used = 0
    for seq, kind, ts, node_id, payload in found:
        size = len(payload) + 96
        # A page always holds at least one event, or a huge one would block the cursor.
        if cap_bytes > 0 and events and used + size > cap_bytes:
            return events, events[-1]["seq"]
        used += size
        events.append({"seq": seq, "type": kind, "ts": ts, "node_id": node_id, "payload": json.loads(payload)})
    return events, None


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


def queued_runs(conn: apsw.Connection, queue_key: str) -> list[tuple[str, int, bool, tuple[str, ...]]]:
    """The queued runs of a key in FIFO order, with the devices each asks for when it
    names several (``target.devices``)."""
    found = []
    for run_id, seq, seed, options in conn.execute(
        "SELECT id, enqueue_seq, seed, options FROM runs WHERE queue_key = ? AND status = 'queued' "
        "AND lane = 'queued' ORDER BY enqueue_seq",
        (queue_key,),
    ):
        devices = ((json.loads(str(options or "{}")) or {}).get("target") or {}).get("devices") or []
        found.append((str(run_id), int(seq), seed is not None, tuple(devices) if len(devices) > 1 else ()))
    return found


def queue_position(conn: apsw.Connection, run_id: str) -> int | None:
    found = conn.execute(f"SELECT {_POSITION} FROM runs r WHERE r.id = ?", (run_id,)).fetchall()
    return int(found[0][0]) if found and found[0][0] is not None else None


def status_counts(conn: apsw.Connection) -> dict[str, int]:
    rows = conn.execute("SELECT status, COUNT(*) FROM runs GROUP BY status")
    return {str(status): int(count) for status, count in rows}


def max_enqueue_seq(conn: apsw.Connection) -> int:
    return int(conn.execute("SELECT COALESCE(MAX(enqueue_seq), 0) FROM runs").fetchall()[0][0])  # type: ignore[arg-type]


def check_deletable(conn: apsw.Connection, run_id: str) -> None:
    found = conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchall()
    if not found:
        raise RunNotFound(f"no run {run_id}")
    if found[0][0] not in ev.TERMINAL_STATES:
        raise RunStillActive(f"run {run_id} is {found[0][0]}; cancel it before deleting it")


def recover(conn: apsw.Connection, reason: str, now: str, keep_queued: bool) -> dict[str, list[Any]]:
    """What the last server left unfinished. Worker runs still executing are adopted
    (returned with the next seq of their log); queued runs are kept when asked (the
    setting, or a stop that left them for this start); everything else becomes
    interrupted, with a terminal event so a watcher of its stream ends."""
    marker = conn.execute("SELECT value FROM server_state WHERE key = 'queued_kept'").fetchall()
    keep_queued = keep_queued or bool(marker)
    conn.execute("DELETE FROM server_state WHERE key = 'queued_kept'")
    found: dict[str, list[Any]] = {"interrupted": [], "adopted": [], "queued": []}
    stale = conn.execute("SELECT id, status, worker FROM runs WHERE status IN ('queued', 'running', 'disconnected') "
                         "ORDER BY enqueue_seq").fetchall()
    for stale_id, status, worker in stale:
        run_id = str(stale_id)
        next_seq = int(conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE run_id = ?",
                                    (run_id,)).fetchall()[0][0])  # type: ignore[arg-type]
        if status != ev.QUEUED and worker is not None:
            found["adopted"].append({**(get_run(conn, run_id) or {}), "adopting": True, "next_seq": next_seq})
            continue
        if status == ev.QUEUED and keep_queued:
            found["queued"].append({**(get_run(conn, run_id) or {}), "next_seq": next_seq})
            continue
        message = "the server stopped before this run finished; submit it again to rerun it"
        conn.execute(
            "UPDATE runs SET status = 'interrupted', finished_at = ?, error = ? WHERE id = ?",
            (now, message, run_id),
        )
        payload = {"status": ev.INTERRUPTED, "error": message, "reason": reason}
        append_events(conn, run_id, [{"seq": next_seq, "type": ev.RUN_FINISHED, "ts": now, "payload": payload}])
        found["interrupted"].append(run_id)
    return found


def keep_queued_for_next_start(conn: apsw.Connection) -> None:
    conn.execute("INSERT OR REPLACE INTO server_state(key, value) VALUES ('queued_kept', '1')")


def prunable(conn: apsw.Connection, keep_last: int) -> list[tuple[str, str]]:
    """The finished runs outside the newest ``keep_last`` (negative: none)."""
    if keep_last < 0:
        return []
    doomed = conn.execute(
        f"SELECT id, status FROM runs WHERE status IN {_TERMINAL} AND enqueue_seq NOT IN "
        "(SELECT enqueue_seq FROM runs ORDER BY enqueue_seq DESC LIMIT ?)",
        (keep_last,),
    ).fetchall()
    return [(str(run_id), str(status)) for run_id, status in doomed]
