"""A page of a ``where`` filter, newest first, without walking a year of runs: which of
the filter's compiled parts (``run_where.Part``) leads, and how.

1. Each part that an index holds is read, up to ``FEW`` runs (fewer once one part is
   found smaller). When one holds no more, the runs in every such part whole are the
   candidates: sorted here, newest first, and checked against the other parts a batch
   at a time until the page is full. A param few runs have, a metric range near the
   best: a few milliseconds at a million runs.
2. Else, a part whose index hands its runs over newest first (an equality of a param,
   a node type or a status) is walked from the newest until the page is full.
3. Else every part holds for many runs, so a page is likely near: the newest
   ``WINDOW`` runs are checked one by one. Past them (the parts rarely hold together),
   the parts are read whole, up to ``MANY`` runs each, and those in all the ones read
   whole are checked; only a part past ``MANY`` leaves the older runs to be walked.

Joining a candidate to its run row is a look-up in an index of a million entries (a few
microseconds, a disk page when it is cold): it is done only for what a page needs.

Called only from the store's thread.
"""

from __future__ import annotations

import json
from typing import Any

import apsw

from troupe.actors.store.run_where import Part

FEW = 10_000  # a part that holds at most this many runs is read whole
WINDOW = 20_000  # the newest runs walked one by one when every part holds many
MANY = 300_000  # ... and past them, a part read whole when it holds at most this many


def page(conn: apsw.Connection, parts: list[Part], others: list[str], other_args: list[Any], before: int | None,
         limit: int) -> list[int]:
    """The enqueue_seqs of the newest ``limit`` runs (before ``before``) that every part
    and every other condition (``others``, SQL on a run row ``r``) holds for."""
    whole = _read_whole(conn, [p for p in parts if p.source is not None], before, FEW)
    if whole:
        return _checked(conn, whole, [p for p in parts if p not in whole], others, other_args, limit)
    ordered = next((p for p in parts if p.ordered), None)
    if ordered is not None:
        return _walked(conn, ordered, [p for p in parts if p is not ordered], others, other_args, before, limit)
    top = before if before is not None else _newest(conn) + 1
    found = _scanned(conn, parts, others, other_args, top, top - WINDOW, limit)
    if len(found) >= limit or top - WINDOW <= 0:
        return found
    whole = _read_whole(conn, [p for p in parts if p.source is not None], top - WINDOW, MANY, shrink=False)
    if whole:
        rest = [p for p in parts if p not in whole]
        return found + _checked(conn, whole, rest, others, other_args, limit - len(found))
    return found + _scanned(conn, parts, others, other_args, top - WINDOW, None, limit - len(found))


def _read_whole(conn: apsw.Connection, sourced: list[Part], before: int | None, cap: int,
                shrink: bool = True) -> dict[Part, list[int]]:
    """The parts read whole (each holding at most ``cap`` runs before ``before``), with
    their runs. ``shrink``: once a part is read whole, the others are read only as far
    as it holds (the smallest leads; a larger one is checked run by run)."""
    found: dict[Part, list[int]] = {}
    bound, bound_args = ("WHERE seq < ?", [before]) if before is not None else ("", [])
    for part in sourced:
        held = int(conn.execute(f"SELECT COUNT(*) FROM (SELECT 1 FROM ({part.source}) {bound} LIMIT ?)",  # type: ignore[arg-type]  # COUNT: an integer
                                (*part.source_args, *bound_args, cap + 1)).fetchall()[0][0])
        if held <= cap:  # counted in SQL first: reading a part into Python costs ten times more
            found[part] = [int(seq) for (seq,) in conn.execute(f"SELECT seq FROM ({part.source}) {bound}",
                                                               (*part.source_args, *bound_args))]
            if shrink:
                cap = held
    return found


def _checked(conn: apsw.Connection, whole: dict[Part, list[int]], rest: list[Part], others: list[str],
             other_args: list[Any], limit: int) -> list[int]:
    """The runs in every part read whole, newest first, that the rest holds for: checked
    a batch at a time (a batch twice the page, then larger) until the page is full."""
    sets = iter(sorted(whole.values(), key=len))
    candidates = set(next(sets))
    for seqs in sets:
        candidates.intersection_update(seqs)
    ordered = sorted(candidates, reverse=True)
    checks = [*(f"({p.pred})" for p in rest), *others]
    if not checks:
        return ordered[:limit]
    sql = (f"SELECT r.enqueue_seq FROM runs r WHERE r.enqueue_seq IN (SELECT value FROM json_each(?)) AND "
           f"{' AND '.join(checks)} ORDER BY r.enqueue_seq DESC")
    args = [a for p in rest for a in p.args] + other_args
    found: list[int] = []
    start, size = 0, 2 * limit
    while start < len(ordered) and len(found) < limit:
        batch = ordered[start:start + size]
        found += [int(seq) for (seq,) in conn.execute(sql, (json.dumps(batch), *args))]
        start, size = start + size, min(size * 2, 4096)
    return found[:limit]


def _walked(conn: apsw.Connection, lead: Part, rest: list[Part], others: list[str], other_args: list[Any],
            before: int | None, limit: int) -> list[int]:
    """An equality's index walked newest first (no sort), each run checked against the rest."""
    checks = " AND ".join([*(["d.seq < ?"] if before is not None else []), *(f"({p.pred})" for p in rest),
                           *others]) or "1"
    sql = (f"SELECT r.enqueue_seq FROM ({lead.source}) d CROSS JOIN runs r ON r.enqueue_seq = d.seq "
           f"WHERE {checks} ORDER BY d.seq DESC LIMIT ?")
    args = [*lead.source_args, *([before] if before is not None else []), *(a for p in rest for a in p.args),
            *other_args, limit]
    return [int(seq) for (seq,) in conn.execute(sql, args)]


def _scanned(conn: apsw.Connection, parts: list[Part], others: list[str], other_args: list[Any], top: int,
             bottom: int | None, limit: int) -> list[int]:
    """The runs with ``bottom <= seq < top``, newest first, each checked."""
    checks = " AND ".join(["r.enqueue_seq < ?", *(["r.enqueue_seq >= ?"] if bottom is not None else []),
                           *(f"({p.pred})" for p in parts), *others])
    args = [top, *([bottom] if bottom is not None else []), *(a for p in parts for a in p.args), *other_args, limit]
    return [int(seq) for (seq,) in conn.execute(
        f"SELECT r.enqueue_seq FROM runs r WHERE {checks} ORDER BY r.enqueue_seq DESC LIMIT ?", args)]


def _newest(conn: apsw.Connection) -> int:
    return int(conn.execute("SELECT COALESCE(MAX(enqueue_seq), 0) FROM runs").fetchall()[0][0])  # type: ignore[arg-type]  # MAX of an INTEGER column
