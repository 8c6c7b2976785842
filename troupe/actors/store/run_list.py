"""Finding runs: the list, newest first, filtered by status, sweep, study and tag and
searched; the same list grouped (one row per sweep and per study, standalone runs
between them); and what a person adds to a run (its name, tags and a note).

Called only from the store's thread.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import apsw

from troupe.actors.errors import RunNotFound
from troupe.actors.store.logged import logged_params_of
from troupe.actors.store.run_groups import group_rows, run_keys
from troupe.actors.store.run_index import newest_of, params_of
from troupe.actors.store.run_page import page
from troupe.actors.store.run_where import compile_node, conjuncts, search_params
from troupe.actors.store.runs import SELECT_LISTED, listed_row, tags_of
from troupe.actors.store.table import Table
from troupe.protocol.where import Key, Node

# Messages ----------------------------------------------------------------------


@dataclass(frozen=True)
class ListRuns:
    status: str | None = None
    sweep_id: str | None = None
    study_id: str | None = None
    limit: int = 50
    before_seq: int | None = None
    # Matches a run's name, id, note, tags, node types and param values (the run index's).
    search: str | None = None
    tag: str | None = None
    # Ordered by the newest value of this series (``-name``: highest first), runs without
    # one last; one page only, each row with its ``sort_value``.
    sort: str | None = None
    submitted_by: str | None = None  # one submitter's runs (``?mine=true``)
    where: Node | None = None  # a parsed ``where`` filter (troupe/protocol/where.py), read through the run index


@dataclass(frozen=True)
class ListGroups:
    """The list with the runs of each sweep and study folded into one row, newest
    first by the group's newest run; the filters apply to the runs inside. Answers
    ``(items, next_before_seq)``; an item is ``{"kind": "run", "run": row}`` or a group
    ``{"kind": "sweep"|"study", "id", "name", "runs", "counts", "best", "newest_seq"}``."""

    status: str | None = None
    limit: int = 50
    before_seq: int | None = None
    search: str | None = None
    tag: str | None = None
    submitted_by: str | None = None
    where: Node | None = None


@dataclass(frozen=True)
class GroupRuns:
    """The runs the filters find folded by ``group_by`` (run_groups.py): a page of
    ``{"value", "runs", "label"?, "metric"?}`` by value, and the offset to go on from."""

    group_by: Key
    metric: str | None = None  # a series: each group's count, mean, min, max and std of its newest values
    status: str | None = None
    sweep_id: str | None = None
    study_id: str | None = None
    search: str | None = None
    tag: str | None = None
    submitted_by: str | None = None
    where: Node | None = None
    limit: int = 50
    offset: int = 0


@dataclass(frozen=True)
class RunKeys:
    """The keys a ``where`` can name, with how many stored runs have each (run_groups.run_keys)."""


@dataclass(frozen=True)
class RunValues:
    """What the list's own columns read of each run (``?values=true``), ``{run_id:
    {"params": {node.param: value}, "metrics": {series: newest value}, "logged_params":
    {name: text}}}``, from the run index and the logged params' table: its params as the
    index holds them (never a secret's), a diverged newest value as its text ("nan",
    "inf", "-inf"), what its script logged as it logged it."""

    run_ids: tuple[str, ...]


@dataclass(frozen=True)
class EditRun:
    """Sets what is given of a run's name, tags (the whole set) and note; answers False
    for no such run."""

    run_id: str
    name: str | None = None
    tags: tuple[str, ...] | None = None
    note: str | None = None
    clear_name: bool = False
    clear_note: bool = False


# SQL ---------------------------------------------------------------------------


def _filters(conn: apsw.Connection, query: ListRuns | ListGroups | GroupRuns) -> tuple[list[str], list[Any]]:
    where: list[str] = []
    args: list[Any] = []
    if query.status is not None:  # one status, or several joined by commas
        statuses = query.status.split(",")
        where.append(f"r.status IN ({', '.join('?' for _ in statuses)})")
        args.extend(statuses)
    for column in ("sweep_id", "study_id", "submitted_by"):
        value = getattr(query, column, None)
        if value is not None:
            where.append(f"r.{column} = ?")
            args.append(value)
    if query.tag is not None:
        where.append("EXISTS (SELECT 1 FROM run_tags t WHERE t.run_id = r.id AND t.tag = ?)")
        args.append(query.tag)
    if query.search:
        like = "%" + query.search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        # What the run's record says (its name, id, note and tags) and, from the run index,
        # its node types and param values; never its graph's text: runs of a sweep share a
        # base of many MB, and a search that walked it for each run held every other read
        # of the store for seconds.
        matches = [f"{column} LIKE ? ESCAPE '\\'" for column in ("r.name", "r.id", "r.note")]
        matches.append("EXISTS (SELECT 1 FROM run_tags t WHERE t.run_id = r.id AND t.tag LIKE ? ESCAPE '\\')")
        args.extend([like] * 4)
        in_params = search_params(conn, query.search)
        if in_params is not None:
            matches.append(in_params[0])
            args.extend(in_params[1])
        # The types it names are read once (a few dozen keys), not once a run.
        types = [k for (k,) in conn.execute("SELECT id FROM index_keys WHERE kind = 'type' AND runs > 0 AND "
                                            "name LIKE ? ESCAPE '\\'", (like,))]
        if types:
            matches.append(f"EXISTS (SELECT 1 FROM run_types y WHERE y.seq = r.enqueue_seq AND y.key IN "
                           f"({', '.join('?' for _ in types)}))")
            args.extend(types)
        where.append(f"({' OR '.join(matches)})")
    return where, args


def _with_tags(conn: apsw.Connection, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    tags = tags_of(conn, [row["id"] for row in rows])
    for row in rows:
        row["tags"] = tags[row["id"]]
    return rows


def _rows(conn: apsw.Connection, tail: str, args: Any) -> list[dict[str, Any]]:
    """The runs ``tail`` (a WHERE, an ORDER) picks, as rows of the list: never a graph nor
    the facts of an execution, which no row shows (``RunValues`` reads the params the
    list's columns show from the run index)."""
    return [listed_row(v) for v in conn.execute(SELECT_LISTED + tail, args)]


def list_runs(conn: apsw.Connection, query: ListRuns) -> tuple[list[dict[str, Any]], int | None]:
    """Newest first; returns the rows and the enqueue_seq to continue before, if any."""
    where, args = _filters(conn, query)
    if query.where is not None and query.sort is None:
        return _where_runs(conn, query, where, args)
    if query.where is not None:
        _add_where(conn, query.where, where, args)
    if query.sort is not None:  # its cursor is how many rows came before
        return _sorted_runs(conn, query, where, args)
    if query.before_seq is not None:
        where.append("r.enqueue_seq < ?")
        args.append(query.before_seq)
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    rows = _rows(conn, f"{clause} ORDER BY r.enqueue_seq DESC LIMIT ?", (*args, query.limit + 1))
    more = len(rows) > query.limit
    rows = _with_tags(conn, rows[: query.limit])
    return rows, (rows[-1]["enqueue_seq"] if more else None)


def _add_where(conn: apsw.Connection, node: Node, where: list[str], args: list[Any]) -> None:
    part = compile_node(conn, node)
    where.append(part.pred)
    args.extend(part.args)


def _where_runs(conn: apsw.Connection, query: ListRuns, where: list[str],
                args: list[Any]) -> tuple[list[dict[str, Any]], int | None]:
    """A ``where`` page: its runs found through the run index (run_where.page), then
    read as the list reads them."""
    assert query.where is not None
    seqs = page(conn, conjuncts(conn, query.where), where, args, query.before_seq, query.limit + 1)
    more = len(seqs) > query.limit
    seqs = seqs[: query.limit]
    if not seqs:
        return [], None
    rows = _with_tags(conn, _rows(conn, f" WHERE r.enqueue_seq IN ({', '.join('?' for _ in seqs)}) "
                                        "ORDER BY r.enqueue_seq DESC", seqs))
    return rows, (seqs[-1] if more else None)


_NEWEST = ("(SELECT m.value FROM metrics m INDEXED BY metrics_series WHERE m.run_id = r.id AND m.series = ? "
           "ORDER BY m.seq DESC LIMIT 1)")


def _sorted_runs(conn: apsw.Connection, query: ListRuns, where: list[str],
                 args: list[Any]) -> tuple[list[dict[str, Any]], int | None]:
    assert query.sort is not None
    series, order = query.sort.removeprefix("-"), "DESC" if query.sort.startswith("-") else "ASC"
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    skip = query.before_seq or 0
    found = conn.execute(f"SELECT r.id, {_NEWEST} AS v FROM runs r{clause} ORDER BY v IS NULL, v {order}, "
                         "r.enqueue_seq DESC LIMIT ? OFFSET ?", (series, *args, query.limit + 1, skip)).fetchall()
    more = len(found) > query.limit
    found = found[: query.limit]
    values = {str(run_id): value for run_id, value in found}
    ids = list(values)
    rows = {row["id"]: row for row in _with_tags(conn, _rows(
        conn, f" WHERE r.id IN ({', '.join('?' for _ in ids)})", ids))} if ids else {}
    page = [{**rows[run_id], "sort_value": values[run_id]} for run_id in ids if run_id in rows]
    return page, (skip + query.limit if more else None)


_GROUP = "COALESCE('sweep:' || r.sweep_id, 'study:' || r.study_id, 'run:' || r.id)"


def list_groups(conn: apsw.Connection, query: ListGroups) -> tuple[list[dict[str, Any]], int | None]:
    where, args = _filters(conn, query)
    if query.where is not None:
        _add_where(conn, query.where, where, args)
    found = _newest_groups(conn, where, args, query.before_seq, query.limit + 1)
    more = len(found) > query.limit
    found = found[: query.limit]
    singles = [str(g)[4:] for g, _ in found if str(g).startswith("run:")]
    rows = {row["id"]: row for row in _with_tags(conn, _rows(
        conn, f" WHERE r.id IN ({', '.join('?' for _ in singles)})", singles))} if singles else {}
    items = []
    for group, top in found:
        kind, _, key = str(group).partition(":")
        if kind == "run":
            if key in rows:
                items.append({"kind": "run", "run": rows[key]})
        else:
            items.append(_group(conn, kind, key, int(str(top)), where, args))
    return items, (int(str(found[-1][1])) if more else None)


def _newest_groups(conn: apsw.Connection, where: list[str], args: list[Any], before: int | None,
                   want: int) -> list[tuple[str, int]]:
    """The first ``want`` groups by their newest matching run, newest first, as (group,
    that run's seq): the matching runs are walked newest first until as many groups
    were seen, so a page reads the runs it shows and those between them. (A GROUP BY
    read every stored run for any page, the Runs page's own read: 870 ms a page of 50
    at 30,000 runs on a busy 2-core VM, 85 ms walked; bench/history.py.) After a
    cursor, a sweep or a study with a run at or above it was on an earlier page."""
    bounded = [*where, "r.enqueue_seq < ?"] if before is not None else where
    clause = f" WHERE {' AND '.join(bounded)}" if bounded else ""
    seen: set[str] = set()
    found: list[tuple[str, int]] = []
    for group, seq in conn.execute(f"SELECT {_GROUP}, r.enqueue_seq FROM runs r{clause} ORDER BY r.enqueue_seq DESC",
                                   (*args, *([before] if before is not None else []))):
        name = str(group)
        if name in seen:
            continue
        seen.add(name)
        kind, _, key = name.partition(":")
        if before is not None and kind != "run" and conn.execute(
                f"SELECT 1 FROM runs r WHERE r.{kind}_id = ? AND r.enqueue_seq >= ?"
                f"{''.join(' AND ' + w for w in where)} LIMIT 1", (key, before, *args)).fetchall():
            continue
        found.append((name, int(str(seq))))
        if len(found) == want:
            break
    return found


def group_runs(conn: apsw.Connection, query: GroupRuns) -> tuple[list[dict[str, Any]], int | None]:
    where, args = _filters(conn, query)
    if query.where is not None:
        _add_where(conn, query.where, where, args)
    return group_rows(conn, query.group_by, query.metric, where, args, query.limit, query.offset)


def _group(conn: apsw.Connection, kind: str, key: str, top: int, where: list[str], args: list[Any]
           ) -> dict[str, Any]:
    """A sweep's or a study's row: its name, how many of its runs match, by status, and
    the best objective among them so far."""
    column = "sweep_id" if kind == "sweep" else "study_id"
    clause = " AND ".join([f"r.{column} = ?", *where])
    counts = {str(status): int(count) for status, count in conn.execute(
        f"SELECT r.status, COUNT(*) FROM runs r WHERE {clause} GROUP BY r.status", (key, *args))}
    if kind == "sweep":
        head = conn.execute("SELECT name, objective FROM sweeps WHERE id = ?", (key,)).fetchall()
        name, objective = (head[0][0], json.loads(str(head[0][1]))) if head else (None, None)
    else:
        head = conn.execute("SELECT name, spec FROM studies WHERE id = ?", (key,)).fetchall()
        name, objective = (head[0][0], json.loads(str(head[0][1])).get("objective")) if head else (None, None)
    return {"kind": kind, "id": key, "name": name, "runs": sum(counts.values()), "counts": counts,
            "best": _best(conn, column, key, objective), "newest_seq": top}


def _best(conn: apsw.Connection, column: str, key: str, objective: dict[str, Any] | None) -> dict[str, Any] | None:
    """The best last value of the objective among the group's succeeded runs, read from
    the run index (each series' newest value: null once it diverged, as a point's)."""
    if not objective:
        return None
    pick = "MIN" if objective.get("direction") == "minimize" else "MAX"
    found = conn.execute(
        f"SELECT {pick}(m.newest), r.id FROM runs r JOIN run_metrics m ON m.seq = r.enqueue_seq AND m.key = "
        f"(SELECT id FROM index_keys WHERE kind = 'metric' AND name = ?) WHERE r.{column} = ? "
        "AND r.status = 'succeeded' AND m.newest IS NOT NULL", (objective.get("metric"), key)).fetchall()
    if not found or found[0][0] is None:
        return None
    return {"metric": objective.get("metric"), "value": float(str(found[0][0])), "run_id": str(found[0][1])}


def edit_run(conn: apsw.Connection, op: EditRun) -> bool:
    if not conn.execute("SELECT 1 FROM runs WHERE id = ?", (op.run_id,)).fetchall():
        raise RunNotFound(f"no run {op.run_id}")
    if op.name is not None or op.clear_name:
        conn.execute("UPDATE runs SET name = ? WHERE id = ?", (op.name, op.run_id))
    if op.note is not None or op.clear_note:
        conn.execute("UPDATE runs SET note = ? WHERE id = ?", (op.note, op.run_id))
    if op.tags is not None:
        conn.execute("DELETE FROM run_tags WHERE run_id = ?", (op.run_id,))
        conn.executemany("INSERT OR IGNORE INTO run_tags(run_id, tag) VALUES (?, ?)",
                         [(op.run_id, tag) for tag in op.tags])
    return True


@dataclass(frozen=True)
class MatchIds:
    """The ids of runs, sweeps and studies that start with ``prefix`` (lower-case hex), at
    most ``limit`` of each kind: how a terminal's short id is read."""

    prefix: str
    limit: int = 10


def run_values(conn: apsw.Connection, query: RunValues) -> dict[str, dict[str, Any]]:
    params, newest = params_of(conn, query.run_ids), newest_of(conn, query.run_ids)
    logged = logged_params_of(conn, query.run_ids)
    return {run_id: {"params": params[run_id], "metrics": newest[run_id], "logged_params": logged[run_id]}
            for run_id in query.run_ids}


def match_ids(conn: apsw.Connection, query: MatchIds) -> dict[str, list[str]]:
    # The ids are hex, so a range on the primary key finds a prefix without a scan.
    high = query.prefix + "g"
    return {kind: [str(found) for (found,) in conn.execute(
        f"SELECT id FROM {table} WHERE id >= ? AND id < ? ORDER BY id LIMIT ?", (query.prefix, high, query.limit))]
        for kind, table in (("runs", "runs"), ("sweeps", "sweeps"), ("studies", "studies"))}


WRITES: Table = {EditRun: lambda s, op: edit_run(s.conn, op)}
READS: Table = {
    ListRuns: lambda s, m: list_runs(s.conn, m),
    ListGroups: lambda s, m: list_groups(s.conn, m),
    MatchIds: lambda s, m: match_ids(s.conn, m),
    RunValues: lambda s, m: run_values(s.conn, m),
    GroupRuns: lambda s, m: group_runs(s.conn, m),
    RunKeys: lambda s, m: run_keys(s.conn),
}
