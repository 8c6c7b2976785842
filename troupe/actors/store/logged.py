"""What a run's script logged about itself: its params and tags (MLflow's ``log_param``
and ``set_tag``, through the endpoint a command is given: ``subprocess_runner/
mlflow_endpoint.py``). This table is the one place they are kept, each name's newest
value, written from the run's ``params`` events (``troupe/actors/run_effects.py``) in the same
order as its log; the events stay in the log as the record of when each was logged.
``GET /api/runs/{id}`` gives them as ``logged_params`` and ``logged_tags`` (the list's
``?values=true`` the params); the params are indexed for ``where`` as they are written
(``params.NAME``, ``run_index.py``).

    logged_params  (run_id, kind, key, value)  kind: param | tag

A run's rows go with it (a foreign key). Called only from a store connection's writer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import apsw

from troupe.actors.errors import RunNotFound
from troupe.actors.store.run_index import index_logged
from troupe.actors.store.table import Session, Table

SCHEMA = """
    CREATE TABLE logged_params (
        run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        kind TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        PRIMARY KEY (run_id, kind, key)
    ) WITHOUT ROWID;
"""
PARAM, TAG = "param", "tag"


@dataclass(frozen=True)
class RecordLogged:
    """One ``params`` event's names and values; a tag of None is removed."""

    run_id: str
    params: Mapping[str, str]
    tags: Mapping[str, str | None]


def _record(s: Session, op: RecordLogged) -> None:
    if not s.conn.execute("SELECT 1 FROM runs WHERE id = ?", (op.run_id,)).fetchall():
        raise RunNotFound(f"no run {op.run_id} (it was removed while its script logged)")
    upsert = ("INSERT INTO logged_params(run_id, kind, key, value) VALUES (?, ?, ?, ?) "
              "ON CONFLICT(run_id, kind, key) DO UPDATE SET value = excluded.value")
    s.conn.executemany(upsert, [(op.run_id, PARAM, k, v) for k, v in op.params.items()]
                       + [(op.run_id, TAG, k, v) for k, v in op.tags.items() if v is not None])
    index_logged(s.conn, op.run_id, op.params)
    gone = [(op.run_id, k) for k, v in op.tags.items() if v is None]
    if gone:
        s.conn.executemany("DELETE FROM logged_params WHERE run_id = ? AND kind = 'tag' AND key = ?", gone)


def logged_of(conn: apsw.Connection, run_id: str) -> dict[str, dict[str, str]]:
    """``{"logged_params": {name: value}, "logged_tags": {...}}``, by name."""
    found: dict[str, dict[str, str]] = {"logged_params": {}, "logged_tags": {}}
    for kind, key, value in conn.execute("SELECT kind, key, value FROM logged_params WHERE run_id = ? "
                                         "ORDER BY kind, key", (run_id,)):
        found["logged_params" if kind == PARAM else "logged_tags"][str(key)] = str(value)
    return found


def logged_params_of(conn: apsw.Connection, run_ids: Sequence[str]) -> dict[str, dict[str, str]]:
    """Each run's logged params, name -> value, for the list's ``?values=true`` (a page
    of runs, one look-up by the table's key each)."""
    found: dict[str, dict[str, str]] = {run_id: {} for run_id in run_ids}
    for start in range(0, len(run_ids), 500):
        chunk = run_ids[start:start + 500]
        for run_id, key, value in conn.execute(
                "SELECT run_id, key, value FROM logged_params WHERE kind = 'param' AND run_id IN "
                f"({', '.join('?' for _ in chunk)}) ORDER BY run_id, key", chunk):
            found[str(run_id)][str(key)] = str(value)
    return found


WRITES: Table = {RecordLogged: _record}
READS: Table = {}
