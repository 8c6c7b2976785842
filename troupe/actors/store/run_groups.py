"""Runs folded by a key (``GET /api/runs?group_by=``) and the keys a filter can name
(``GET /api/runs/keys``), both read from the run index (``run_index.py``).

A group is one value of the key with how many runs have it and, for a series, the count,
mean, min, max and sample standard deviation of those runs' newest values. A run with no
value for the key is in the group whose value is null; a key a run holds several of (a
node type, a tag) puts it in each. ``run_list`` answers the messages (its filters apply).

Called only from the store's thread.
"""

from __future__ import annotations

import math
from typing import Any

import apsw

from troupe.protocol.errors import WhereInvalid, WhereUnknownKey
from troupe.protocol.where import FIXED, Key, key_text

GROUPABLE = ("a param (NODE.PARAM, NODE.vars.NAME)", "a logged param (params.NAME)", "type", "status", "tag", "name",
             "by", "sweep", "study", "created (by day)")

# The value each fixed key groups by, and a join it needs.
_FIXED_GROUPS: dict[str, tuple[str, str]] = {
    "status": ("r.status", ""), "name": ("r.name", ""), "by": ("r.submitted_by", ""), "sweep": ("r.sweep_id", ""),
    "study": ("r.study_id", ""), "created": ("substr(r.created_at, 1, 10)", ""),
    "tag": ("g.tag", "LEFT JOIN run_tags g ON g.run_id = r.id"),
    "type": ("gk.name", "LEFT JOIN run_types g ON g.seq = r.enqueue_seq LEFT JOIN index_keys gk ON gk.id = g.key"),
}


def _metric_key(conn: apsw.Connection, series: str) -> int:
    found = conn.execute("SELECT id FROM index_keys WHERE kind = 'metric' AND name = ? AND runs > 0",
                         (series,)).fetchall()
    if not found:
        raise WhereUnknownKey(f"unknown metric {series}: no stored run has such a series (GET /api/runs/keys lists "
                              "them)", offset=0, key=series, pointer="?metric")
    return int(found[0][0])  # type: ignore[arg-type]  # an INTEGER PRIMARY KEY


def _grouping(conn: apsw.Connection, key: Key) -> tuple[str, str, list[Any]]:
    """The SQL value a run groups by, the join that reads it, and the join's values."""
    if key.kind in _FIXED_GROUPS:
        value, join = _FIXED_GROUPS[key.kind]
        return value, join, []
    if key.kind not in ("param", "logged"):
        raise WhereInvalid(f"group_by takes {', '.join(GROUPABLE)}; a metric is what a group sums up (pass it as "
                           "metric=SERIES)", offset=key.offset, expected=GROUPABLE, pointer="?group_by")
    found = conn.execute("SELECT id FROM index_keys WHERE kind = ? AND name = ? AND runs > 0",
                         (key.kind, key.name)).fetchall()
    if not found:
        what = "a param" if key.kind == "param" else "a logged param"
        raise WhereUnknownKey(f"unknown key {key.text}: no stored run has {what} {key.name} (GET /api/runs/keys "
                              "lists the keys that exist)", offset=key.offset, key=key.text, pointer="?group_by")
    return "g.value", "LEFT JOIN run_params g ON g.seq = r.enqueue_seq AND g.key = ?", [int(found[0][0])]  # type: ignore[arg-type]  # an INTEGER PRIMARY KEY


def group_rows(conn: apsw.Connection, key: Key, series: str | None, where: list[str], args: list[Any],
               limit: int, offset: int) -> tuple[list[dict[str, Any]], int | None]:
    """A page of groups, by value (numbers, then text, null last); the offset to go on
    from when there are more."""
    value, join, join_args = _grouping(conn, key)
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    stats, metric_join, metric_args = "", "", []
    if series is not None:
        stats = ", COUNT(m.newest), AVG(m.newest), MIN(m.newest), MAX(m.newest), SUM(m.newest * m.newest)"
        metric_join = "LEFT JOIN run_metrics m ON m.seq = r.enqueue_seq AND m.key = ?"
        metric_args = [_metric_key(conn, series)]
    found = conn.execute(
        f"SELECT {value} AS v, COUNT(*){stats} FROM runs r {join} {metric_join}{clause} "
        "GROUP BY v ORDER BY v IS NULL, v LIMIT ? OFFSET ?",
        (*join_args, *metric_args, *args, limit + 1, offset)).fetchall()
    more = len(found) > limit
    rows = [_group_row(row, series) for row in found[:limit]]
    if key.kind in ("by", "sweep", "study"):
        _with_labels(conn, key.kind, rows)
    return rows, (offset + limit if more else None)


def _group_row(row: tuple[Any, ...], series: str | None) -> dict[str, Any]:
    group: dict[str, Any] = {"value": row[0], "runs": int(row[1])}
    if series is not None:
        count, mean, low, high, squares = row[2:]
        std = None
        if count >= 2:  # the sample deviation (n - 1), as pandas' std() gives it
            std = math.sqrt(max(0.0, (squares - count * mean * mean) / (count - 1)))
        group["metric"] = {"series": series, "runs": int(count), "mean": mean, "min": low, "max": high, "std": std}
    return group


def _with_labels(conn: apsw.Connection, kind: str, rows: list[dict[str, Any]]) -> None:
    """A submitter's display name (the server's token: "server token"), a sweep's or a
    study's name, beside its id."""
    ids = [row["value"] for row in rows if row["value"] is not None]
    table, column = {"by": ("sessions", "label"), "sweep": ("sweeps", "name"), "study": ("studies", "name")}[kind]
    names = {str(i): n for i, n in conn.execute(
        f"SELECT id, {column} FROM {table} WHERE id IN ({', '.join('?' for _ in ids)})", ids)} if ids else {}
    if kind == "by":
        names["server"] = "server token"
    for row in rows:
        if names.get(row["value"]):
            row["label"] = names[row["value"]]


def run_keys(conn: apsw.Connection) -> dict[str, Any]:
    """Every key a filter can name with how many stored runs have it: the fixed keys
    (every run), each param and var, each param a script logged, each series (newest and
    best, with its direction), and the node types ``type`` can be compared with. The fixed keys' count is the sum of
    the submitters' counts (schema 29), not a count of every stored run."""
    total = int(conn.execute("SELECT COALESCE(SUM(runs), 0) FROM submitter_runs").fetchall()[0][0])  # type: ignore[arg-type]  # SUM of integers
    keys: list[dict[str, Any]] = [{"key": name, "kind": "fixed", "runs": total} for name in FIXED]
    types: list[dict[str, Any]] = []
    for kind, name, runs, direction in conn.execute(
            "SELECT kind, name, runs, direction FROM index_keys WHERE runs > 0 ORDER BY kind, name"):
        if kind == "type":
            types.append({"name": name, "runs": runs})
        elif kind == "param":
            keys.append({"key": key_text("param", str(name)), "kind": "var" if ".vars." in str(name) else "param",
                         "runs": runs})
        elif kind == "logged":
            keys.append({"key": key_text("logged", str(name)), "kind": "logged", "runs": runs})
        else:
            said = direction or "minimize"
            keys.append({"key": key_text("metric", str(name)), "kind": "metric", "runs": runs, "direction": said})
            keys.append({"key": key_text("best", str(name)), "kind": "best", "runs": runs, "direction": said})
    return {"keys": keys, "types": types}
