"""Sweeps: the sweep row, its variants, and their results. Called only from the store's
thread.

Harvest: whenever a sweep's run ends, and before one is deleted or pruned, its last
objective value and final metrics are copied onto its variant row, in the same
transaction, so a sweep's table never loses a result.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import apsw

from troupe.actors.store.metric_pages import NEWEST_VALUE
from troupe.actors.store.run_index import note_direction
from troupe.actors.store.runs import InsertRun, insert_run
from troupe.actors.store.table import Table
from troupe.protocol.run_record import RunRecord

# Messages ----------------------------------------------------------------------


@dataclass(frozen=True)
class CreateSweep:
    """A sweep, its variants and all its runs, in one transaction: no partial sweep."""

    sweep: Mapping[str, Any]
    variants: tuple[Mapping[str, Any], ...]
    runs: tuple[RunRecord, ...]


@dataclass(frozen=True)
class SetSweepState:
    sweep_id: str
    state: str


@dataclass(frozen=True)
class GetSweep:
    sweep_id: str


@dataclass(frozen=True)
class ListSweeps:
    pass


def created_runs(op: object) -> tuple[RunRecord, ...]:
    """The runs a store write inserts: a run (``InsertRun``, a study's attempt among
    them) or a sweep's runs, batched in one ``CreateSweep``. Every write that makes runs
    answers here, so that what follows each new run from the commits (the event hub: the
    run histograms and the global stream's ``created``; the client's followed logs) sees
    it whichever path made it. A new such write belongs here too."""
    if isinstance(op, InsertRun):
        return (op.record,)
    if isinstance(op, CreateSweep):
        return op.runs
    return ()


# SQL ---------------------------------------------------------------------------


def create_sweep(conn: apsw.Connection, sweep: Mapping[str, Any], variants: Sequence[Mapping[str, Any]],
                 runs: Sequence[RunRecord]) -> None:
    conn.execute(
        "INSERT INTO sweeps(id, name, state, spec, objective, domains, total, created_at, submitted_by) "
        "VALUES (?,?,?,?,?,?,?,?,?)",
        (sweep["id"], sweep["name"], "running", json.dumps(sweep["spec"]), json.dumps(sweep["objective"]),
         json.dumps(sweep["domains"]), sweep["total"], sweep["created_at"], sweep.get("submitted_by")),
    )
    note_direction(conn, sweep["objective"])
    for row in runs:
        insert_run(conn, row)
    conn.executemany(
        "INSERT INTO sweep_variants(sweep_id, idx, run_id, params, seed) VALUES (?, ?, ?, ?, ?)",
        [(sweep["id"], v["index"], v["run_id"], json.dumps(v["params"]), v["seed"]) for v in variants],
    )


def harvest(conn: apsw.Connection, run_ids: Sequence[str]) -> None:
    """Copies what the runs of sweeps recorded onto their variant rows."""
    for run_id in run_ids:
        found = conn.execute(
            "SELECT v.sweep_id, v.idx, s.objective, r.status FROM sweep_variants v JOIN sweeps s ON s.id = v.sweep_id "
            "JOIN runs r ON r.id = v.run_id WHERE v.run_id = ?", (run_id,)).fetchall()
        if not found:
            continue
        sweep_id, idx, objective, status = found[0]
        metric = json.loads(str(objective))["metric"]
        finals = {str(name): value for name, value in conn.execute(
            "SELECT series, value FROM metrics m WHERE run_id = ? AND seq = (SELECT MAX(seq) FROM metrics "
            "WHERE run_id = m.run_id AND series = m.series)", (run_id,))}
        conn.execute(
            "UPDATE sweep_variants SET status = ?, objective_value = ?, final_metrics = ? "
            "WHERE sweep_id = ? AND idx = ?",
            (status, finals.get(metric), json.dumps(finals), sweep_id, idx),
        )


def get_sweep(conn: apsw.Connection, sweep_id: str) -> dict[str, Any] | None:
    found = conn.execute(
        "SELECT id, name, state, spec, objective, domains, total, created_at, submitted_by FROM sweeps WHERE id = ?",
        (sweep_id,)).fetchall()
    if not found:
        return None
    sid, name, state, spec, objective, domains, total, created_at, submitted_by = found[0]
    variants = []
    for idx, run_id, params, seed, kept_status, value, finals, live_status in conn.execute(
        "SELECT v.idx, v.run_id, v.params, v.seed, v.status, v.objective_value, v.final_metrics, r.status "
        "FROM sweep_variants v LEFT JOIN runs r ON r.id = v.run_id WHERE v.sweep_id = ? ORDER BY v.idx", (sweep_id,)
    ):
        run_exists = live_status is not None
        metric = json.loads(str(objective))["metric"]
        live_value = None
        if run_exists:
            live = conn.execute(NEWEST_VALUE, (run_id, metric)).fetchall()
            live_value = live[0][0] if live else None
        variants.append({
            "index": idx, "run_id": run_id, "params": json.loads(str(params)), "seed": seed,
            "status": live_status if run_exists else "missing", "finished_status": kept_status,
            "objective_value": live_value if run_exists else value, "run_exists": run_exists,
            "final_metrics": json.loads(str(finals)) if finals else None,
        })
    return {"id": sid, "name": name, "state": state, "spec": json.loads(str(spec)),
            "objective": json.loads(str(objective)), "domains": json.loads(str(domains)), "total": total,
            "created_at": created_at, "submitted_by": submitted_by, "variants": variants}


def set_state(conn: apsw.Connection, sweep_id: str, state: str) -> None:
    conn.execute("UPDATE sweeps SET state = ? WHERE id = ?", (state, sweep_id))


def list_sweeps(conn: apsw.Connection) -> list[dict[str, Any]]:
    # A sweep none of whose runs is active is finished, as a read of it would settle.
    return [{"id": i, "name": n, "state": s, "total": t, "created_at": c, "submitted_by": b}
            for i, n, s, t, c, b in conn.execute(
        "SELECT id, name, CASE WHEN state IN ('running', 'cancelling') AND NOT EXISTS ("
        "  SELECT 1 FROM sweep_variants v JOIN runs r ON r.id = v.run_id WHERE v.sweep_id = sweeps.id"
        "  AND r.status IN ('queued', 'running', 'disconnected')) THEN 'finished' ELSE state END, total, created_at, "
        "submitted_by "
        "FROM sweeps ORDER BY created_at DESC, rowid DESC")]


WRITES: Table = {
    CreateSweep: lambda s, op: create_sweep(s.conn, op.sweep, op.variants, op.runs),
    SetSweepState: lambda s, op: set_state(s.conn, op.sweep_id, op.state),
}
READS: Table = {
    GetSweep: lambda s, m: get_sweep(s.conn, m.sweep_id),
    ListSweeps: lambda s, m: list_sweeps(s.conn),
}
