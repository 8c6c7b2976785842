"""Studies: the study row, its attempts, and the plugin jobs that created studies.
Called only from the store's thread."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import apsw

from troupe.actors.store.metric_pages import NEWEST_VALUE
from troupe.actors.store.run_index import note_direction
from troupe.actors.store.table import Table

# Messages ----------------------------------------------------------------------


@dataclass(frozen=True)
class CreateStudy:
    study: Mapping[str, Any]


@dataclass(frozen=True)
class CreatePluginJob:
    """Creates the job and its study in one transaction, unless the plugin already has a
    job under this key: then answers that job (the caller compares the digest)."""

    job: Mapping[str, Any]
    study: Mapping[str, Any]


@dataclass(frozen=True)
class UpdateStudy:
    """Fields of the study row: state, halt_reason, budget, active_seconds; with
    ``from_states``, only while the row is in one of them (a cancel and the study's own
    halt can cross: the one committed first wins, the other changes nothing). Its result
    is whether the row changed."""

    study_id: str
    fields: Mapping[str, Any]
    from_states: tuple[str, ...] = ()


@dataclass(frozen=True)
class SetAttemptStatus:
    """A study's own verdict on an attempt (``over_budget``), kept over the run's."""

    study_id: str
    attempt: int
    status: str


@dataclass(frozen=True)
class GetStudy:
    """The study row and its attempts, each with its run's live status."""

    study_id: str


@dataclass(frozen=True)
class ListStudies:
    state: str | None = None
    plugin_id: str | None = None


@dataclass(frozen=True)
class GetPluginJobs:
    plugin_id: str
    job_id: str | None = None


# SQL ---------------------------------------------------------------------------

_JSON = ("spec", "budget")


def create_study(conn: apsw.Connection, study: Mapping[str, Any]) -> None:
    conn.execute(
        "INSERT INTO studies(id, name, state, halt_reason, spec, budget, active_seconds, plugin_id, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?)",
        (study["id"], study["name"], study["state"], None, json.dumps(study["spec"]), json.dumps(study["budget"]),
         study.get("plugin_id"), study["created_at"]),
    )
    note_direction(conn, study["spec"].get("objective"))


def update_study(conn: apsw.Connection, study_id: str, fields: Mapping[str, Any],
                 from_states: tuple[str, ...] = ()) -> bool:
    allowed = {"state", "halt_reason", "budget", "active_seconds"}
    if set(fields) - allowed:
        raise ValueError(f"cannot update study columns {sorted(set(fields) - allowed)}")
    values = [json.dumps(v) if k in _JSON else v for k, v in fields.items()]
    when = f" AND state IN ({', '.join('?' * len(from_states))})" if from_states else ""
    conn.execute(f"UPDATE studies SET {', '.join(f'{k} = ?' for k in fields)} WHERE id = ?{when}",
                 (*values, study_id, *from_states))
    return conn.changes() > 0


def insert_attempt(conn: apsw.Connection, attempt: Mapping[str, Any]) -> None:
    conn.execute(
        "INSERT INTO study_attempts(study_id, variant, repeat, attempt, run_id) VALUES (?, ?, ?, ?, ?)",
        (attempt["study_id"], attempt["variant"], attempt["repeat"], attempt["attempt"], attempt["run_id"]),
    )


def set_attempt_status(conn: apsw.Connection, study_id: str, attempt: int, status: str) -> None:
    conn.execute("UPDATE study_attempts SET status = ? WHERE study_id = ? AND attempt = ?", (status, study_id, attempt))


def harvest(conn: apsw.Connection, run_ids: Sequence[str]) -> None:
    """Copies the final status and objective of studies' runs onto their attempts; a
    status the study decided (``over_budget``) stays."""
    for run_id in run_ids:
        found = conn.execute(
            "SELECT a.study_id, a.attempt, a.status, s.spec, r.status FROM study_attempts a "
            "JOIN studies s ON s.id = a.study_id JOIN runs r ON r.id = a.run_id WHERE a.run_id = ?", (run_id,)
        ).fetchall()
        if not found:
            continue
        study_id, attempt, kept, spec, status = found[0]
        metric = json.loads(str(spec))["objective"]["metric"]
        value = conn.execute(NEWEST_VALUE, (run_id, metric)).fetchall()
        conn.execute(
            "UPDATE study_attempts SET status = ?, objective_value = ? WHERE study_id = ? AND attempt = ?",
            (kept or status, value[0][0] if value else None, study_id, attempt),
        )


def _study_row(values: tuple[Any, ...]) -> dict[str, Any]:
    sid, name, state, halt_reason, spec, budget, active_seconds, plugin_id, created_at = values
    return {"id": sid, "name": name, "state": state, "halt_reason": halt_reason, "spec": json.loads(str(spec)),
            "budget": json.loads(str(budget)), "active_seconds": active_seconds, "plugin_id": plugin_id,
            "created_at": created_at}


_COLUMNS = "id, name, state, halt_reason, spec, budget, active_seconds, plugin_id, created_at"


def get_study(conn: apsw.Connection, study_id: str) -> dict[str, Any] | None:
    found = conn.execute(f"SELECT {_COLUMNS} FROM studies WHERE id = ?", (study_id,)).fetchall()
    if not found:
        return None
    study = _study_row(found[0])
    metric = study["spec"]["objective"]["metric"]
    attempts = []
    for variant, repeat, attempt, run_id, kept, value, live, started in conn.execute(
        "SELECT a.variant, a.repeat, a.attempt, a.run_id, a.status, a.objective_value, r.status, r.started_at "
        "FROM study_attempts a LEFT JOIN runs r ON r.id = a.run_id WHERE a.study_id = ? ORDER BY a.attempt",
        (study_id,),
    ):
        if live is not None and value is None:
            found_value = conn.execute(NEWEST_VALUE, (run_id, metric)).fetchall()
            value = found_value[0][0] if found_value else None
        attempts.append({"variant": variant, "repeat": repeat, "attempt": attempt, "run_id": run_id,
                         "status": kept or live or "missing", "run_status": live, "started_at": started,
                         "objective_value": value})
    study["attempts"] = attempts
    return study


def list_studies(conn: apsw.Connection, state: str | None, plugin_id: str | None) -> list[dict[str, Any]]:
    where, args = [], []
    if state is not None:
        where.append("state = ?")
        args.append(state)
    if plugin_id is not None:
        where.append("plugin_id = ?")
        args.append(plugin_id)
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    return [_study_row(v) for v in conn.execute(
        f"SELECT {_COLUMNS} FROM studies{clause} ORDER BY created_at DESC, rowid DESC", tuple(args))]


_JOB_COLUMNS = "j.id, j.plugin_id, j.kind, j.idempotency_key, j.spec_digest, j.study_id, j.created_at, s.state"


def _job(values: tuple[Any, ...]) -> dict[str, Any]:
    keys = ("id", "plugin_id", "kind", "idempotency_key", "spec_digest", "study_id", "created_at", "state")
    return dict(zip(keys, values, strict=True))


def create_plugin_job(conn: apsw.Connection, job: Mapping[str, Any], study: Mapping[str, Any]) -> dict[str, Any]:
    """Returns ``{"job": ..., "created": bool}``."""
    found = conn.execute(
        f"SELECT {_JOB_COLUMNS} FROM plugin_jobs j LEFT JOIN studies s ON s.id = j.study_id "
        "WHERE j.plugin_id = ? AND j.idempotency_key = ?", (job["plugin_id"], job["idempotency_key"])).fetchall()
    if found:
        return {"job": _job(found[0]), "created": False}
    create_study(conn, study)
    conn.execute(
        "INSERT INTO plugin_jobs(id, plugin_id, kind, idempotency_key, spec_digest, study_id, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (job["id"], job["plugin_id"], job["kind"], job["idempotency_key"], job["spec_digest"], study["id"],
         job["created_at"]))
    return {"job": {**job, "study_id": study["id"], "state": study["state"]}, "created": True}


def plugin_jobs(conn: apsw.Connection, plugin_id: str, job_id: str | None) -> list[dict[str, Any]]:
    query = f"SELECT {_JOB_COLUMNS} FROM plugin_jobs j LEFT JOIN studies s ON s.id = j.study_id WHERE j.plugin_id = ?"
    args: tuple[Any, ...] = (plugin_id,)
    if job_id is not None:
        query += " AND j.id = ?"
        args = (plugin_id, job_id)
    return [_job(v) for v in conn.execute(query + " ORDER BY j.created_at DESC, j.rowid DESC", args)]


WRITES: Table = {
    CreateStudy: lambda s, op: create_study(s.conn, op.study),
    CreatePluginJob: lambda s, op: create_plugin_job(s.conn, op.job, op.study),
    UpdateStudy: lambda s, op: update_study(s.conn, op.study_id, op.fields, op.from_states),
    SetAttemptStatus: lambda s, op: set_attempt_status(s.conn, op.study_id, op.attempt, op.status),
}
READS: Table = {
    GetStudy: lambda s, m: get_study(s.conn, m.study_id),
    ListStudies: lambda s, m: list_studies(s.conn, m.state, m.plugin_id),
    GetPluginJobs: lambda s, m: plugin_jobs(s.conn, m.plugin_id, m.job_id),
}
