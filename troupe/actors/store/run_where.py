"""``where`` as SQL: a parsed filter (``troupe/protocol/where.py``) compiled against the run
index (``run_index.py``) into parameterised SQL (no value is ever written into the text),
which ``run_page.py`` plans a page of.

Each condition compiles to a predicate on a run row ``r`` (``EXISTS`` in the index, or a
column of ``runs``) and, where an index holds it, to a source: a ``SELECT seq`` over that
index alone (an index range: a param's equality or range, a metric's range).

Called only from the store's thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import apsw

from troupe.actors.store.run_index import number_of
from troupe.protocol.errors import WhereUnknownKey
from troupe.protocol.where import Cond, Junction, Key, Node, Span, Value


@dataclass(eq=False)  # each part is itself (the planner keeps them in a dict)
class Part:
    """One compiled condition: ``pred`` (SQL true of a run row ``r``) and, when an
    index holds it, ``source`` (SQL whose rows are the ``seq`` of the runs it holds);
    ``ordered``: the source's index gives them in seq order (an equality)."""

    pred: str
    args: list[Any]
    source: str | None = None
    source_args: list[Any] = field(default_factory=list)
    ordered: bool = False


def _like(text: str) -> str:
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _bind(value: Value | Span) -> Any:
    return int(value) if isinstance(value, bool) else value


def _spellings(value: Value | Span) -> list[Any]:
    """A quoted number also matches the number (``adam.lr = '0.01'``, as MLflow writes it)."""
    if isinstance(value, str):
        number = number_of(value)
        return [value] if number is None else [value, number]
    return [_bind(value)]


def _value_test(column: str, op: str, values: tuple[Value | Span, ...], text_ok: bool = True) -> tuple[str, list[Any]]:
    """SQL comparing ``column`` (an index's value: a number or text) with the values. A
    number never matches text nor text a number, as SQLite orders every number before
    every text: a bound on the other side keeps a range to its own kind."""
    if op == "in" or (op in ("=", "!=") and text_ok):
        spelled = [v for value in values for v in _spellings(value)] if text_ok else [_bind(v) for v in values]
        marks = ", ".join("?" for _ in spelled)
        if op == "!=":
            return f"{column} NOT IN ({marks})", spelled
        return (f"{column} = ?", spelled) if len(spelled) == 1 else (f"{column} IN ({marks})", spelled)
    value = _bind(values[0])
    if op == "~":
        return f"{column} LIKE ? ESCAPE '\\'", [_like(str(value))]
    if isinstance(value, str):  # text against text only: numbers sort below ''
        return f"{column} {op} ? AND {column} >= ''", [value]
    if op in (">", ">="):  # a number's range stops where text starts
        return f"{column} {op} ? AND {column} < ''", [value]
    return f"{column} {op} ?", [value]


def _key(conn: apsw.Connection, key: Key) -> tuple[int, str | None]:
    """The index's id of a param or a series (and the series' direction), or the 400 for
    a key no stored run has."""
    kind = key.kind if key.kind in ("param", "logged") else "metric"
    found = conn.execute("SELECT id, direction FROM index_keys WHERE kind = ? AND name = ? AND runs > 0",
                         (kind, key.name)).fetchall()
    if not found:
        what = {"param": f"a param {key.name}", "logged": f"a logged param {key.name} (its script's log_param)",
                "metric": f"a metric series {key.name}"}[kind]
        raise WhereUnknownKey(f"at offset {key.offset}: unknown key {key.text}: no stored run has {what} "
                              "(GET /api/runs/keys lists the keys that exist)", offset=key.offset, key=key.text)
    return int(found[0][0]), (str(found[0][1]) if found[0][1] is not None else None)  # type: ignore[arg-type]  # an INTEGER PRIMARY KEY


def compile_cond(conn: apsw.Connection, cond: Cond) -> Part:
    """A predicate looks a run's rows up by its seq: ``+`` on the other columns keeps
    SQLite from walking a key's value index instead, once a run (100,000 runs of a
    metric range took 25 s that way)."""
    kind = cond.key.kind
    if kind in ("param", "logged"):
        key, _ = _key(conn, cond.key)
        test, args = _value_test("value", cond.op, cond.values)
        held, _ = _value_test("+p.value", cond.op, cond.values)
        source = f"SELECT seq FROM run_params WHERE key = ? AND {test}"
        return Part(f"EXISTS (SELECT 1 FROM run_params p WHERE p.seq = r.enqueue_seq AND +p.key = ? AND {held})",
                    [key, *args], None if cond.op in ("~", "!=") else source, [key, *args],
                    ordered=cond.op == "=" and len(args) == 1)
    if kind in ("metric", "best"):
        key, direction = _key(conn, cond.key)
        column = "newest" if kind == "metric" else "high" if direction == "maximize" else "low"
        test, args = _value_test(column, cond.op, cond.values, text_ok=False)
        held, _ = _value_test(f"+m.{column}", cond.op, cond.values, text_ok=False)
        return Part(f"EXISTS (SELECT 1 FROM run_metrics m WHERE m.seq = r.enqueue_seq AND +m.key = ? AND {held})",
                    [key, *args],
                    None if cond.op == "!=" else f"SELECT seq FROM run_metrics WHERE key = ? AND {test}", [key, *args])
    return _FIXED[kind](conn, cond)


def _type(conn: apsw.Connection, cond: Cond) -> Part:
    if cond.op == "~":
        keys_sql, keys_args = "SELECT id FROM index_keys WHERE kind = 'type' AND name LIKE ? ESCAPE '\\'", [
            _like(str(cond.values[0]))]
    else:
        keys_sql = f"SELECT id FROM index_keys WHERE kind = 'type' AND name IN ({', '.join('?' for _ in cond.values)})"
        keys_args = list[Any](cond.values)
    keys = [int(k) for (k,) in conn.execute(keys_sql, keys_args)]
    marks = ", ".join("?" for _ in keys) or "NULL"
    holds = f"EXISTS (SELECT 1 FROM run_types t WHERE t.seq = r.enqueue_seq AND t.key IN ({marks}))"
    if cond.op == "!=":  # holds no node of that type
        return Part(f"NOT {holds}", keys)
    return Part(holds, keys, f"SELECT seq FROM run_types WHERE key IN ({marks})", keys,
                ordered=len(keys) == 1)


def _tag(conn: apsw.Connection, cond: Cond) -> Part:
    if cond.op == "~":
        return Part("EXISTS (SELECT 1 FROM run_tags t WHERE t.run_id = r.id AND t.tag LIKE ? ESCAPE '\\')",
                    [_like(str(cond.values[0]))])
    marks = ", ".join("?" for _ in cond.values)
    holds = f"EXISTS (SELECT 1 FROM run_tags t WHERE t.run_id = r.id AND t.tag IN ({marks}))"
    if cond.op == "!=":
        return Part(f"NOT {holds}", list(cond.values))
    return Part(holds, list(cond.values), "SELECT x.enqueue_seq AS seq FROM run_tags t JOIN runs x ON x.id = t.run_id "
                f"WHERE t.tag IN ({marks})", list(cond.values))


def _status(conn: apsw.Connection, cond: Cond) -> Part:
    marks = ", ".join("?" for _ in cond.values)
    if cond.op == "!=":
        return Part(f"r.status NOT IN ({marks})", list(cond.values))
    return Part(f"r.status IN ({marks})", list(cond.values),
                f"SELECT enqueue_seq AS seq FROM runs WHERE status IN ({marks})", list(cond.values),
                ordered=len(cond.values) == 1)


def _name(conn: apsw.Connection, cond: Cond) -> Part:
    test, args = _value_test("r.name", cond.op, cond.values)
    return Part(f"(r.name IS NULL OR {test})" if cond.op == "!=" else test, args)


def _owner(column: str, table: str, label: str) -> Any:
    """``by``, ``sweep``, ``study``: a value is the id or the name (a session's display
    label; ``server`` for the server's own token; a sweep's or a study's name)."""

    def compile_owner(conn: apsw.Connection, cond: Cond) -> Part:
        if cond.op == "~":
            like = _like(str(cond.values[0]))
            return Part(f"(r.{column} LIKE ? ESCAPE '\\' OR r.{column} IN (SELECT id FROM {table} WHERE {label} "
                        "LIKE ? ESCAPE '\\'))", [like, like])
        marks = ", ".join("?" for _ in cond.values)
        owners = f"SELECT id FROM {table} WHERE id IN ({marks}) OR {label} IN ({marks}) UNION VALUES " + \
            ", ".join("(?)" for _ in cond.values)
        args = [*cond.values, *cond.values, *cond.values]
        if cond.op == "!=":
            return Part(f"(r.{column} IS NULL OR r.{column} NOT IN ({owners}))", args)
        return Part(f"r.{column} IN ({owners})", args,
                    f"SELECT enqueue_seq AS seq FROM runs WHERE {column} IS NOT NULL AND {column} IN ({owners})", args)

    return compile_owner


def _created(conn: apsw.Connection, cond: Cond) -> Part:
    span = cond.values[0]
    assert isinstance(span, Span)
    tests = {"=": ("r.created_at >= ? AND r.created_at < ?", [span.start, span.end]),
             "!=": ("(r.created_at < ? OR r.created_at >= ?)", [span.start, span.end]),
             "<": ("r.created_at < ?", [span.start]), "<=": ("r.created_at < ?", [span.end]),
             ">": ("r.created_at >= ?", [span.end]), ">=": ("r.created_at >= ?", [span.start])}
    test, args = tests[cond.op]
    return Part(test, args)


_FIXED = {"type": _type, "tag": _tag, "status": _status, "name": _name, "created": _created,
          "by": _owner("submitted_by", "sessions", "label"), "sweep": _owner("sweep_id", "sweeps", "name"),
          "study": _owner("study_id", "studies", "name")}


def compile_node(conn: apsw.Connection, node: Node) -> Part:
    """Any part of the tree. An ``or`` has a source when all its parts do (their union);
    an ``and`` the source of its first part that has one, checked against the rest."""
    if isinstance(node, Cond):
        return compile_cond(conn, node)
    parts = [compile_node(conn, part) for part in node.parts]
    joiner = " OR " if node.op == "or" else " AND "
    pred = "(" + joiner.join(f"({p.pred})" for p in parts) + ")"
    args = [a for p in parts for a in p.args]
    if node.op == "or":
        if all(p.source for p in parts):
            return Part(pred, args, " UNION ALL ".join(f"SELECT seq FROM ({p.source})" for p in parts),
                        [a for p in parts for a in p.source_args])
        return Part(pred, args)
    driver = next((p for p in parts if p.source), None)
    if driver is None:
        return Part(pred, args)
    rest = [p for p in parts if p is not driver]
    checks = " AND ".join(f"({p.pred})" for p in rest)
    return Part(pred, args, f"SELECT r.enqueue_seq AS seq FROM ({driver.source}) d CROSS JOIN runs r ON "
                            f"r.enqueue_seq = d.seq WHERE {checks}",
                [*driver.source_args, *(a for p in rest for a in p.args)])


def conjuncts(conn: apsw.Connection, node: Node) -> list[Part]:
    """The filter's top-level ``and`` as separate parts, so the plan can pick its driver."""
    if isinstance(node, Junction) and node.op == "and":
        return [compile_node(conn, part) for part in node.parts]
    return [compile_node(conn, node)]


DISTINCT_TEXTS = 200  # a param's distinct text values read for a search; past them, its values are matched run by run


def search_params(conn: apsw.Connection, text: str) -> tuple[str, list[Any]] | None:
    """``q`` among param values, as a predicate on ``r``: a text value that contains the
    text (ignoring case), a number equal to it. The values that match are found first,
    among each param's distinct values (a few, read by the value index: not once a run),
    so each run is then one or two look-ups; None when no value can match. A param with
    more distinct texts than ``DISTINCT_TEXTS`` (a per-run path) is matched run by run."""
    needle = text.casefold()
    number = number_of(text)
    pairs: list[Any] = []
    wide: list[int] = []
    for (key,) in conn.execute("SELECT id FROM index_keys WHERE kind IN ('param', 'logged') AND runs > 0").fetchall():
        values, more = _texts(conn, int(key))  # type: ignore[arg-type]  # an INTEGER PRIMARY KEY
        if more:
            wide.append(int(key))  # type: ignore[arg-type]  # an INTEGER PRIMARY KEY
        pairs += [(key, value) for value in values if needle in value.casefold()]
        if number is not None and conn.execute("SELECT 1 FROM run_params WHERE key = ? AND value = ? LIMIT 1",
                                               (key, number)).fetchall():
            pairs.append((key, number))
    tests, args = [], []
    if pairs:
        keys = sorted({key for key, _ in pairs})
        tests.append(f"(p.key IN ({', '.join('?' for _ in keys)}) AND (p.key, p.value) IN "
                     f"(VALUES {', '.join('(?, ?)' for _ in pairs)}))")
        args += [*keys, *(x for pair in pairs for x in pair)]
    if wide:
        tests.append(f"(p.key IN ({', '.join('?' for _ in wide)}) AND p.value LIKE ? ESCAPE '\\')")
        args += [*wide, _like(text)]
    if not tests:
        return None
    return f"EXISTS (SELECT 1 FROM run_params p WHERE p.seq = r.enqueue_seq AND ({' OR '.join(tests)}))", args


def _texts(conn: apsw.Connection, key: int) -> tuple[list[str], bool]:
    """A param's distinct text values (at most ``DISTINCT_TEXTS``), one index seek each,
    and whether it has more."""
    found: list[str] = []
    row = conn.execute("SELECT value FROM run_params WHERE key = ? AND value >= '' ORDER BY value LIMIT 1",
                       (key,)).fetchall()
    while row and isinstance(row[0][0], str):
        if len(found) == DISTINCT_TEXTS:
            return found, True
        found.append(row[0][0])
        row = conn.execute("SELECT value FROM run_params WHERE key = ? AND value > ? ORDER BY value LIMIT 1",
                           (key, found[-1])).fetchall()
    return found, False

