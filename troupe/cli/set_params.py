"""``--set NODE.PARAM=VALUE``: one param of a graph changed from the terminal, without a
hand-edited copy of its JSON. Each value is read by the type the node type declares for
the param (``int``, ``float``, ``bool``, ``select``, ``string``, ``secret``); a node or a
param that does not exist is a usage error (exit 2) that lists the names that do.

The graph is changed before it is sent: the server validates it as any other (bounds,
options), and the run's graph holds the values it ran with."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from troupe.cli.errors import EXIT_USAGE, CliError
from troupe.subprocess_runner.sweeps import key_targets

# What a node type's params are, by type name: the catalog's JSON of each (``name``,
# ``type``, ``options``...), or None for a type the catalog does not have.
ParamsOf = Callable[[str], Sequence[Mapping[str, Any]] | None]

_INTEGER = re.compile(r"-?[0-9]{1,400}")  # Python reads no more than 4,300 digits
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


class BadSet(CliError):
    """A ``--set`` that names nothing in the graph, or a value its param cannot take."""

    code = "bad_set"
    exit_code = EXIT_USAGE


def apply_sets(graph: dict[str, Any], sets: Sequence[str], params_of: ParamsOf) -> dict[str, Any]:
    """Changes ``graph`` in place; returns what was set (``"node.param"`` -> value)."""
    listed = graph.get("nodes")  # what is not a list of objects the schema then refuses, in words
    nodes = {str(n.get("id")): n for n in (listed if isinstance(listed, list) else []) if isinstance(n, dict)}
    done: dict[str, Any] = {}
    for given in sets:
        target, equals, raw = given.partition("=")
        if len(key_targets(target, nodes)) > 1:
            raise BadSet(f"--set {given!r}: {target} could name a param of two nodes (node ids with a dot: "
                         f"{' and '.join(n for n, _ in key_targets(target, nodes))}); it is not guessed, rename one")
        node_id, dot, param = target.rpartition(".")
        key: str | None = None
        if node_id not in nodes and "." in node_id:  # NODE.vars.NAME: one name of a mapping param
            node_id, _, outer = node_id.rpartition(".")
            key, param = param, outer
        if not equals or not dot or not node_id or not param:
            raise BadSet(f"--set {given!r}: write NODE.PARAM=VALUE (for instance adam.lr=0.02)")
        node = nodes.get(node_id)
        if node is None:
            raise BadSet(f"--set {given!r}: the graph has no node {node_id!r}; its nodes are "
                         f"{', '.join(sorted(nodes)) or 'none'}")
        declared = {str(p["name"]): p for p in params_of(str(node.get("type"))) or ()}
        spec = declared.get(param)
        if spec is None or (key is not None and spec.get("type") != "mapping"):
            raise BadSet(f"--set {given!r}: node {node_id} ({node.get('type')}) has no "
                         f"{'mapping ' if key is not None else ''}param {param!r}; it has "
                         f"{', '.join(sorted(declared)) or 'none'}")
        params = node.setdefault("params", {})
        if not isinstance(params, dict):
            raise BadSet(f"--set {given!r}: node {node_id}'s params are not an object in the graph")
        if key is not None:
            current = params.get(param) or {}
            if not isinstance(current, dict):
                raise BadSet(f"--set {given!r}: node {node_id}'s {param} is not an object in the graph")
            value = _scalar(raw)
            _refuse_unknown_name(given, node, f"{param}.{key}", value)
            params[param] = {**current, key: value}
            done[f"{node_id}.{param}.{key}"] = value
            continue
        value = _parsed(given, spec, raw)
        params[param] = value
        done[f"{node_id}.{param}"] = value
    return done


def _refuse_unknown_name(given: str, node: Mapping[str, Any], name: str, value: Any) -> None:
    """A name of a mapping param that the node type does not take (a command's var that
    no placeholder uses: ``train.vars.lrr``) is a usage error, said as the server would
    say it. Asked of troupe's own packs (the script pack's ``vars``), and only when the
    node was right before the name was set: another pack's mapping, and a graph wrong for
    another reason, are the server's to judge."""
    from troupe.subprocess_runner.errors import GraphInvalid
    from troupe.subprocess_runner.packs import core, script_pack
    from troupe.subprocess_runner.sweeps import SweepInvalid, refuse_unknown_name
    from troupe.subprocess_runner.validation import resolve_params

    own = {t.type: t for pack in (core.PACK, script_pack.PACK) for t in pack.node_types}
    node_type = own.get(str(node.get("type")))
    params = node.get("params")
    if node_type is None or not isinstance(params, dict):
        return
    node_id = str(node.get("id"))
    try:
        resolve_params(node_type, params, "", node_id)
        refuse_unknown_name(node_type, params, name, value, "", node_id)
    except GraphInvalid:
        return
    except SweepInvalid as exc:
        raise BadSet(f"--set {given!r}: {exc.message}") from None


def _scalar(raw: str) -> Any:
    """A mapping's value: a number or a flag when it reads as one, else the text (``nan``
    and ``1e999`` too: no JSON number holds them, and a program reads its argv as text)."""
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    if isinstance(value, float) and not math.isfinite(value):
        return raw
    return value if isinstance(value, int | float | bool) else raw


def _parsed(given: str, spec: Mapping[str, Any], raw: str) -> Any:
    kind = spec.get("type")
    if kind == "int":
        if not _INTEGER.fullmatch(raw.strip()):
            raise BadSet(f"--set {given!r}: {spec['name']} is an int")
        return int(raw)
    if kind == "float":
        try:
            value = float(raw)
        except ValueError:
            raise BadSet(f"--set {given!r}: {spec['name']} is a number") from None
        if not math.isfinite(value):
            raise BadSet(f"--set {given!r}: {spec['name']} is a finite number")
        return value
    if kind == "bool":
        word = raw.strip().lower()
        if word not in _TRUE + _FALSE:
            raise BadSet(f"--set {given!r}: {spec['name']} is true or false")
        return word in _TRUE
    if kind == "select":
        options = [str(o) for o in spec.get("options") or ()]
        if raw not in options:
            raise BadSet(f"--set {given!r}: {spec['name']} is one of {', '.join(options)}")
        return raw
    return raw  # string, secret


def apply_sets_by_server(client: Any, graph: dict[str, Any], sets: Sequence[str]) -> dict[str, Any]:
    """``apply_sets`` read by the server's catalog: its packs are what the run will meet."""
    if not sets:
        return {}
    status, catalog = client.request("GET", "/api/nodes")
    if status != 200:
        raise CliError(f"the server did not list its node types ({status}): {catalog}")
    return apply_sets(graph, sets, catalog_params(catalog["nodes"]))


def catalog_params(nodes: Sequence[Mapping[str, Any]]) -> ParamsOf:
    """``ParamsOf`` from a list of node types as the catalog's JSON gives them."""
    by_type = {str(n["type"]): n.get("params") or () for n in nodes}
    return by_type.get
