"""Flavors: named sizes. Called only from the store's thread. A flavor still used by a
run, sweep or study that is not over cannot be deleted; the refusal names which."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import apsw

from troupe.actors.errors import FlavorExists, FlavorInUse, FlavorNotFound
from troupe.actors.store.table import Table
from troupe.protocol import events as ev

_COLUMNS = ("name", "cpus", "gpus", "memory_gib", "ram", "duration_s", "description")

# Messages ----------------------------------------------------------------------


@dataclass(frozen=True)
class CreateFlavor:
    flavor: Mapping[str, Any]


@dataclass(frozen=True)
class ReplaceFlavor:
    """Replaces every quantity of an existing flavor (a PUT: what is absent is unset)."""

    flavor: Mapping[str, Any]


@dataclass(frozen=True)
class DeleteFlavor:
    name: str


@dataclass(frozen=True)
class ListFlavors:
    """Answers every flavor by name, or only ``names`` when given."""

    names: tuple[str, ...] | None = None


# SQL ---------------------------------------------------------------------------


def _row(values: tuple[Any, ...]) -> dict[str, Any]:
    return dict(zip(_COLUMNS, values, strict=True))


def list_flavors(conn: apsw.Connection, names: tuple[str, ...] | None) -> dict[str, dict[str, Any]]:
    query = f"SELECT {', '.join(_COLUMNS)} FROM flavors"
    if names is not None:
        query += f" WHERE name IN ({', '.join('?' for _ in names)})"
    return {row["name"]: row for row in map(_row, conn.execute(query + " ORDER BY name", names or ()))}


def create(conn: apsw.Connection, flavor: Mapping[str, Any]) -> dict[str, Any]:
    if list_flavors(conn, (flavor["name"],)):
        raise FlavorExists(f"a flavor named {flavor['name']!r} exists; PUT /api/flavors/{flavor['name']} changes it",
                           pointer="/name")
    _write(conn, flavor)
    return list_flavors(conn, (flavor["name"],))[flavor["name"]]


def replace(conn: apsw.Connection, flavor: Mapping[str, Any]) -> dict[str, Any]:
    if not list_flavors(conn, (flavor["name"],)):
        raise FlavorNotFound(f"no flavor named {flavor['name']!r}")
    _write(conn, flavor)
    return list_flavors(conn, (flavor["name"],))[flavor["name"]]


def _write(conn: apsw.Connection, flavor: Mapping[str, Any]) -> None:
    conn.execute(f"INSERT OR REPLACE INTO flavors({', '.join(_COLUMNS)}, updated_at) VALUES "
                 f"({', '.join('?' for _ in _COLUMNS)}, ?)", (*(flavor.get(c) for c in _COLUMNS), ev.utc_now()))


def delete(conn: apsw.Connection, name: str) -> None:
    if not list_flavors(conn, (name,)):
        raise FlavorNotFound(f"no flavor named {name!r}")
    users = _users(conn, name)
    if users:
        raise FlavorInUse(f"flavor {name!r} is still used by {', '.join(users[:10])}"
                          + (f" and {len(users) - 10} more" if len(users) > 10 else "")
                          + "; delete it once they are over")
    conn.execute("DELETE FROM flavors WHERE name = ?", (name,))


def _users(conn: apsw.Connection, name: str) -> list[str]:
    """The runs (queued or executing), sweeps (running) and studies (running or halted,
    which may resume) whose graph or options name the flavor."""
    like = f'%"{name}"%'
    found = [f"run {run_id}" for run_id, graph, options in conn.execute(
        "SELECT id, graph, options FROM runs WHERE status IN ('queued', 'running', 'disconnected') "
        "AND (graph LIKE ? OR options LIKE ?)", (like, like))
        if _names(json.loads(str(graph)), name) or ((json.loads(str(options)).get("target") or {}).get("flavor")
                                                    == name)]
    for table, states in (("sweeps", "('running')"), ("studies", "('running', 'halted')")):
        found += [f"{table[:-1] if table == 'sweeps' else 'study'} {sid}" for sid, spec in conn.execute(
            f"SELECT id, spec FROM {table} WHERE state IN {states} AND spec LIKE ?", (like,))
            if _mentions(json.loads(str(spec)), name)]
    return found


def _names(graph: Mapping[str, Any], name: str) -> bool:
    return any(((node.get("resources") or {}).get("flavor")) == name for node in graph.get("nodes", []))


def _mentions(value: Any, name: str) -> bool:
    """A spec names the flavor in a node's resources or a target, however deep."""
    if isinstance(value, dict):
        return value.get("flavor") == name or any(_mentions(v, name) for v in value.values())
    if isinstance(value, list):
        return any(_mentions(v, name) for v in value)
    return False


WRITES: Table = {
    CreateFlavor: lambda s, op: create(s.conn, op.flavor),
    ReplaceFlavor: lambda s, op: replace(s.conn, op.flavor),
    DeleteFlavor: lambda s, op: delete(s.conn, op.name),
}
READS: Table = {
    ListFlavors: lambda s, m: list_flavors(s.conn, m.names),
}
