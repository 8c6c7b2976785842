"""The index ``where`` reads: what each run was (its scalar params, its node types) and
what it reached (each series' newest, lowest and highest value), kept beside the runs so
that no filter reads a graph's text or a run's metric points.

Written in the same functions and transactions that write what it indexes: a run's
params and types where its row is inserted (``insert_run``, a sweep's batch among them),
its series as its metric points are appended (``append_events``), and it loses a run's
rows where the run is deleted or pruned. A bulk insert through those functions fills it
too. Rows name a run by its ``enqueue_seq`` (an integer: the index of a year of runs is
a fraction of the size a 32-character id would make it, and the list pages by it).

    index_keys   (id, kind, name, runs, direction): each param ("node.param", a script's
                 "node.vars.NAME"), param a script logged itself (kind "logged": MLflow's
                 log_param, ``logged.py``), node type and series any stored run has,
                 with how many runs have it (the keys' suggestions, the unknown key's
                 400), and a series' direction once an objective named it
    run_params   (seq, key, value, boolean)  value: a number, 0/1 for a boolean (``boolean``
                 1 then: the list's values read it back as true or false), or text; a
                 logged param's text that reads as a finite number is that number
    run_types    (seq, key)
    run_metrics  (seq, key, newest, newest_seq, low, high)

Called only from a store connection's writer (the thread's or the loop's).
"""

from __future__ import annotations

import json
import logging
import math
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import apsw

from troupe.subprocess_runner.sweeps import with_params

log = logging.getLogger("troupe.store")
MAX_TEXT = 120  # a longer text param (a script's source, a prompt) is no filter value
# The packs troupe ships declare no secret param; a stored run's string params of any
# other pack are left out when an older database is indexed (its record did not say
# which were secret, and a secret is always a string).
OWN_PACKS = ("core.", "torch.", "eval.", "script.")
_INT64 = 2**63

SCHEMA = """
    CREATE TABLE index_keys (
        id INTEGER PRIMARY KEY,
        kind TEXT NOT NULL,
        name TEXT NOT NULL,
        runs INTEGER NOT NULL DEFAULT 0,
        direction TEXT,
        UNIQUE (kind, name)
    );
    CREATE TABLE run_params (
        seq INTEGER NOT NULL,
        key INTEGER NOT NULL,
        value,
        PRIMARY KEY (seq, key)
    ) WITHOUT ROWID;
    CREATE INDEX run_params_value ON run_params(key, value, seq);
    CREATE TABLE run_types (
        seq INTEGER NOT NULL,
        key INTEGER NOT NULL,
        PRIMARY KEY (seq, key)
    ) WITHOUT ROWID;
    CREATE INDEX run_types_key ON run_types(key, seq);
    CREATE TABLE run_metrics (
        seq INTEGER NOT NULL,
        key INTEGER NOT NULL,
        newest REAL,
        newest_seq INTEGER NOT NULL,
        low REAL,
        high REAL,
        PRIMARY KEY (seq, key)
    ) WITHOUT ROWID;
    CREATE INDEX run_metrics_newest ON run_metrics(key, newest, seq);
    CREATE INDEX run_metrics_low ON run_metrics(key, low, seq);
    CREATE INDEX run_metrics_high ON run_metrics(key, high, seq);
"""
# Schema 28's column (``mark_booleans``); an index filled since (``fill``) has it from the start.
BOOLEAN_COLUMN = "ALTER TABLE run_params ADD COLUMN boolean INTEGER"


class _Known:
    """A connection's ids of the keys a committed transaction made, by (kind, name): a
    key is never removed (a count of 0 only hides it), so a committed id holds for good.
    A key made in the transaction still open (``made``) is not kept until it is read again
    after that transaction ended: a rollback, or a savepoint's within a batch (the writer's
    op that fails alone), may take it back. Looking every key up again cost a run's insert
    about 40 us of the server's CPU."""

    def __init__(self, conn: apsw.Connection) -> None:
        self.ids: dict[tuple[str, str], int] = {}
        self.made: set[tuple[str, str]] = set()
        conn.set_commit_hook(self._committed)
        conn.set_rollback_hook(self.made.clear)

    def _committed(self) -> bool:
        self.made.clear()
        return False  # a commit hook's False: the commit goes on


_KNOWN: weakref.WeakKeyDictionary[apsw.Connection, _Known] = weakref.WeakKeyDictionary()


def flat_params(graph: Mapping[str, Any], secret: Iterable[str] = (), strings: bool = True) -> dict[str, Any]:
    """A graph's scalar params by ``node.param`` (a mapping param's names as
    ``node.param.NAME``), as ``--set`` names them; never a secret's. ``strings``: False
    leaves text out of the nodes of packs that are not troupe's own."""
    hidden = frozenset(secret)
    flat: dict[str, Any] = {}
    for node in graph.get("nodes") or ():
        node_id, params = node.get("id"), node.get("params") or {}
        if not isinstance(node_id, str) or not isinstance(params, dict):
            continue
        texts = strings or str(node.get("type", "")).startswith(OWN_PACKS)
        for name, value in params.items():
            key = f"{node_id}.{name}"
            if key in hidden:
                continue
            if isinstance(value, dict):
                for inner, item in value.items():
                    if _scalar(item, texts):
                        flat[f"{key}.{inner}"] = _bound(item)
            elif _scalar(value, texts):
                flat[key] = _bound(value)
    return flat


def _scalar(value: Any, texts: bool) -> bool:
    if isinstance(value, str):
        return texts and len(value) <= MAX_TEXT
    return isinstance(value, bool | int | float) and value == value  # NaN is no value


def _bound(value: Any) -> Any:
    """An integer past SQLite's 64 bits is kept as the float it is near."""
    return float(value) if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= _INT64 else value


def node_types(graph: Mapping[str, Any]) -> set[str]:
    return {str(node["type"]) for node in graph.get("nodes") or () if isinstance(node.get("type"), str)}


def index_run(conn: apsw.Connection, seq: int, graph: Mapping[str, Any], secret: Iterable[str] = (),
              strings: bool = True) -> None:
    """A newly stored run's params and node types (call once per run: the keys count it)."""
    params = flat_params(graph, secret, strings)
    types = sorted(node_types(graph))
    param_ids = [key_id(conn, "param", name) for name in params]
    type_ids = [key_id(conn, "type", name) for name in types]
    counted = param_ids + type_ids
    if counted:
        conn.execute(f"UPDATE index_keys SET runs = runs + 1 WHERE id IN ({', '.join('?' for _ in counted)})", counted)
    if params:
        conn.executemany("INSERT OR REPLACE INTO run_params(seq, key, value, boolean) VALUES (?, ?, ?, ?)",
                         [(seq, key, value, 1 if isinstance(value, bool) else None)
                          for key, value in zip(param_ids, params.values(), strict=True)])
    if types:
        conn.executemany("INSERT OR REPLACE INTO run_types(seq, key) VALUES (?, ?)", [(seq, key) for key in type_ids])


def index_logged(conn: apsw.Connection, run_id: str, params: Mapping[str, str]) -> None:
    """Params a run's script logged (always text, as MLflow sends them), each name's
    newest value, where ``params.NAME`` reads them: a text that reads as a finite number is
    that number (``params.lr < 0.1``; ``= '0.01'`` finds it too), a longer text than a
    filter value is left out."""
    found = conn.execute("SELECT enqueue_seq FROM runs WHERE id = ?", (run_id,)).fetchall()
    if not found:
        return
    seq = found[0][0]
    for name, text in params.items():
        key = key_id(conn, "logged", name)
        value = _logged_value(text)
        if value is None:
            conn.execute("DELETE FROM run_params WHERE seq = ? AND key = ?", (seq, key))
            if conn.changes():
                conn.execute("UPDATE index_keys SET runs = runs - 1 WHERE id = ?", (key,))
            continue
        conn.execute("UPDATE run_params SET value = ? WHERE seq = ? AND key = ?", (value, seq, key))
        if conn.changes() == 0:
            conn.execute("INSERT INTO run_params(seq, key, value, boolean) VALUES (?, ?, ?, NULL)", (seq, key, value))
            conn.execute("UPDATE index_keys SET runs = runs + 1 WHERE id = ?", (key,))


def _logged_value(text: str) -> str | int | float | None:
    if len(text) > MAX_TEXT:
        return None
    number = number_of(text)
    return text if number is None else number


def number_of(text: str) -> int | float | None:
    """The finite number a text reads as (an integer as an int, as the index keeps a
    graph's), or None: how a quoted or logged value meets the numbers of the index."""
    try:
        number = float(text)
    except ValueError:
        return None
    if not math.isfinite(number):
        return None
    return int(number) if number.is_integer() and abs(number) < 2**53 else number


def fill_logged(conn: apsw.Connection) -> None:
    """The migration that indexes the params stored runs' scripts logged before
    ``params.NAME`` was a key."""
    runs: dict[str, dict[str, str]] = {}
    for run_id, key, value in conn.execute("SELECT run_id, key, value FROM logged_params WHERE kind = 'param'"):
        runs.setdefault(str(run_id), {})[str(key)] = str(value)
    for run_id, params in runs.items():
        index_logged(conn, run_id, params)


def key_id(conn: apsw.Connection, kind: str, name: str) -> int:
    """The key's id, made (counting no run) when it is new."""
    known = _KNOWN.get(conn)
    if known is None:
        known = _KNOWN[conn] = _Known(conn)
    found = known.ids.get((kind, name))
    if found is not None:
        return found
    row = conn.execute("SELECT id FROM index_keys WHERE kind = ? AND name = ?", (kind, name)).fetchall()
    if row:
        key = int(row[0][0])  # type: ignore[arg-type]  # an INTEGER PRIMARY KEY
        if (kind, name) not in known.made:  # made before this transaction: committed
            known.ids[kind, name] = key
        return key
    known.made.add((kind, name))
    return int(conn.execute("INSERT INTO index_keys(kind, name, runs) VALUES (?, ?, 0) RETURNING id",
                            (kind, name)).fetchall()[0][0])  # type: ignore[arg-type]  # an INTEGER PRIMARY KEY


# A point newer than the one kept replaces newest; low and high keep the extremes of the
# finite values (a diverged point is NULL: newest becomes NULL, the extremes stay).
_UPDATE_SERIES = """
    UPDATE run_metrics SET
        newest = CASE WHEN ?1 > newest_seq THEN ?2 ELSE newest END,
        newest_seq = MAX(newest_seq, ?1),
        low = CASE WHEN ?3 IS NULL THEN low WHEN low IS NULL OR ?3 < low THEN ?3 ELSE low END,
        high = CASE WHEN ?4 IS NULL THEN high WHEN high IS NULL OR ?4 > high THEN ?4 ELSE high END
    WHERE seq = ?5 AND key = ?6
"""


def index_points(conn: apsw.Connection, run_id: str, points: Sequence[tuple[Any, ...]]) -> None:
    """A run's new metric points, as ``append_events`` stores them (run_id, series, step,
    value, non_finite, ts, seq): each series' newest, lowest and highest value."""
    seen: dict[str, list[Any]] = {}  # series -> [newest seq, newest value, low, high]
    for _, series, _, value, _, _, seq in points:
        kept = seen.get(series)
        if kept is None:
            seen[series] = kept = [seq, value, value, value]
        elif seq > kept[0]:
            kept[0], kept[1] = seq, value
        if value is not None:
            kept[2] = value if kept[2] is None or value < kept[2] else kept[2]
            kept[3] = value if kept[3] is None or value > kept[3] else kept[3]
    found = conn.execute("SELECT enqueue_seq FROM runs WHERE id = ?", (run_id,)).fetchall()
    if not found:
        return
    run_seq = found[0][0]
    for series, (seq, value, low, high) in seen.items():
        key = key_id(conn, "metric", series)
        conn.execute(_UPDATE_SERIES, (seq, value, low, high, run_seq, key))
        if conn.changes() == 0:
            conn.execute("INSERT INTO run_metrics(seq, key, newest, newest_seq, low, high) VALUES (?, ?, ?, ?, ?, ?)",
                         (run_seq, key, value, seq, low, high))
            conn.execute("UPDATE index_keys SET runs = runs + 1 WHERE id = ?", (key,))


def note_direction(conn: apsw.Connection, objective: Mapping[str, Any] | None) -> None:
    """A sweep's or a study's objective says which way its series is better: the
    newest such word wins (``metric.SERIES.best`` reads the highest when it is maximize)."""
    if not objective or not isinstance(objective.get("metric"), str):
        return
    key = key_id(conn, "metric", objective["metric"])
    conn.execute("UPDATE index_keys SET direction = ? WHERE id = ?", (objective.get("direction"), key))


def _chunks(items: Sequence[str], size: int = 500) -> Iterable[tuple[str, ...]]:
    for start in range(0, len(items), size):  # far below SQLite's limit of bound values
        yield tuple(items[start:start + size])


def forget_runs(conn: apsw.Connection, run_ids: Sequence[str]) -> None:
    """Before runs are deleted: their index rows, and their place in the keys' counts."""
    for chunk in _chunks(run_ids):
        seqs = [row[0] for row in conn.execute(
            f"SELECT enqueue_seq FROM runs WHERE id IN ({','.join('?' for _ in chunk)})", chunk)]
        if not seqs:
            continue
        marks = ",".join("?" for _ in seqs)
        for table in ("run_params", "run_types", "run_metrics"):
            counts = conn.execute(f"SELECT key, COUNT(*) FROM {table} WHERE seq IN ({marks}) GROUP BY key",
                                  seqs).fetchall()
            conn.executemany("UPDATE index_keys SET runs = runs - ? WHERE id = ?", [(n, k) for k, n in counts])
            conn.execute(f"DELETE FROM {table} WHERE seq IN ({marks})", seqs)


def params_of(conn: apsw.Connection, run_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Each run's params as the index holds them, by ``node.param`` (a boolean as true or
    false): the list's param columns, with no graph read (a page of 200 runs decoded 200
    graphs to flatten them again, most of the page's time)."""
    found: dict[str, dict[str, Any]] = {run_id: {} for run_id in run_ids}
    for chunk in _chunks(run_ids):
        for run_id, name, value, boolean in conn.execute(
                "SELECT r.id, k.name, p.value, p.boolean FROM runs r JOIN run_params p ON p.seq = r.enqueue_seq "
                f"JOIN index_keys k ON k.id = p.key WHERE r.id IN ({', '.join('?' for _ in chunk)}) "
                "AND k.kind = 'param' ORDER BY k.name",
                chunk):
            found[str(run_id)][str(name)] = bool(value) if boolean else value
    return found


def newest_of(conn: apsw.Connection, run_ids: Sequence[str]) -> dict[str, dict[str, float | str | None]]:
    """Each run's newest value of every series it recorded, by name, from the index; a
    diverged one (the index holds null) is its text ("nan", "inf", "-inf"), read from
    its newest point."""
    found: dict[str, dict[str, float | str | None]] = {run_id: {} for run_id in run_ids}
    diverged: list[tuple[str, str]] = []
    for chunk in _chunks(run_ids):
        for run_id, name, newest in conn.execute(
                "SELECT r.id, k.name, m.newest FROM runs r JOIN run_metrics m ON m.seq = r.enqueue_seq "
                f"JOIN index_keys k ON k.id = m.key WHERE r.id IN ({', '.join('?' for _ in chunk)}) ORDER BY k.name",
                chunk):
            found[str(run_id)][str(name)] = newest  # a REAL or NULL
            if newest is None:
                diverged.append((str(run_id), str(name)))
    for run_id, name in diverged:
        for value, non_finite in conn.execute("SELECT value, non_finite FROM metrics INDEXED BY metrics_series "
                                              "WHERE run_id = ? AND series = ? ORDER BY seq DESC LIMIT 1",
                                              (run_id, name)):
            found[run_id][name] = non_finite if non_finite is not None else value
    return found


def mark_booleans(conn: apsw.Connection) -> None:
    """The migration that says which indexed params are booleans (``boolean``): where a
    key holds a 0 or a 1, the run's graph says whether it was true or false, a thousand
    runs at a time (about a minute a million runs whose graphs hold a boolean). An index
    that schema 23 made after this code was written has the column, and marked them."""
    if any(column[1] == "boolean" for column in conn.execute("PRAGMA table_info(run_params)")):
        return
    conn.execute(BOOLEAN_COLUMN)
    keys = {str(name): int(key) for key, name in conn.execute(
        "SELECT id, name FROM index_keys WHERE kind = 'param'")
        if conn.execute("SELECT 1 FROM run_params WHERE key = ? AND value IN (0, 1) LIMIT 1", (key,)).fetchall()}
    if not keys:
        return
    marks = ", ".join("?" for _ in keys)
    bases: dict[str, dict[str, Any]] = {}
    after = -1
    while seqs := [int(seq) for (seq,) in conn.execute(
            f"SELECT DISTINCT seq FROM run_params WHERE seq > ? AND key IN ({marks}) AND value IN (0, 1) "
            "ORDER BY seq LIMIT 1000", (after, *keys.values()))]:
        found = []
        for seq, graph, base in conn.execute("SELECT enqueue_seq, graph, graph_base FROM runs WHERE enqueue_seq IN "
                                             f"({', '.join('?' for _ in seqs)})", seqs):
            document = json.loads(str(graph))
            if base is not None:
                if base not in bases:
                    if len(bases) >= 8:
                        bases.pop(next(iter(bases)))
                    text = conn.execute("SELECT graph FROM graph_bases WHERE digest = ?", (base,)).fetchall()
                    bases[str(base)] = json.loads(str(text[0][0])) if text else {"nodes": []}
                document = with_params(bases[str(base)], document)
            found += [(seq, keys[name]) for name, value in flat_params(document).items()
                      if isinstance(value, bool) and name in keys]
        conn.executemany("UPDATE run_params SET boolean = 1 WHERE seq = ? AND key = ?", found)
        after = seqs[-1]


def fill(conn: apsw.Connection) -> None:
    """The migration that made the index: every stored run's params, types and series,
    and the directions of the stored sweeps' and studies' objectives."""
    conn.execute(SCHEMA)
    conn.execute(BOOLEAN_COLUMN)
    stored = int(conn.execute("SELECT COUNT(*) FROM runs").fetchall()[0][0])  # type: ignore[arg-type]  # COUNT: an integer
    if stored > 10_000:
        log.info("indexing the %d stored runs for where (once; about a minute a million)", stored)
    bases: dict[str, dict[str, Any]] = {}
    after = -1
    while rows := conn.execute("SELECT enqueue_seq, graph, graph_base FROM runs WHERE enqueue_seq > ? "
                               "ORDER BY enqueue_seq LIMIT 1000", (after,)).fetchall():  # a thousand graphs at a time
        for seq, graph, base in rows:
            document = json.loads(str(graph))
            if base is not None:
                if base not in bases:  # a sweep's runs come together: a few bases are enough
                    if len(bases) >= 8:
                        bases.pop(next(iter(bases)))
                    text = conn.execute("SELECT graph FROM graph_bases WHERE digest = ?", (base,)).fetchall()
                    bases[str(base)] = json.loads(str(text[0][0])) if text else {"nodes": []}
                document = with_params(bases[str(base)], document)
            index_run(conn, int(seq), document, strings=False)  # type: ignore[arg-type]  # enqueue_seq: an integer
        after = int(rows[-1][0])  # type: ignore[arg-type]  # enqueue_seq: an integer
    conn.execute("INSERT OR IGNORE INTO index_keys(kind, name, runs) SELECT DISTINCT 'metric', series, 0 FROM metrics")
    conn.execute("""
        INSERT INTO run_metrics(seq, key, newest, newest_seq, low, high)
        SELECT r.enqueue_seq, k.id,
               (SELECT x.value FROM metrics x INDEXED BY metrics_series
                WHERE x.run_id = m.run_id AND x.series = m.series
                ORDER BY x.seq DESC LIMIT 1),
               MAX(m.seq), MIN(m.value), MAX(m.value)
        FROM metrics m JOIN runs r ON r.id = m.run_id JOIN index_keys k ON k.kind = 'metric' AND k.name = m.series
        GROUP BY m.run_id, m.series""")
    conn.execute("UPDATE index_keys SET runs = (SELECT COUNT(*) FROM run_metrics WHERE key = index_keys.id) "
                 "WHERE kind = 'metric'")
    for (objective,) in conn.execute("SELECT objective FROM sweeps ORDER BY created_at").fetchall():
        note_direction(conn, json.loads(str(objective)))
    for (spec,) in conn.execute("SELECT spec FROM studies ORDER BY created_at").fetchall():
        note_direction(conn, json.loads(str(spec)).get("objective"))
