"""Checks a graph against the catalog before anything is queued.

Each problem raises ``GraphInvalid`` whose pointer locates it in the submitted document
(``/graph/nodes/2/params/seconds``) and whose ``node_id`` names the node at fault.
"""

from __future__ import annotations

import math
import re
from collections import deque
from typing import Any

from troupe.protocol.graph import Graph, Node
from troupe.subprocess_runner.catalog import Catalog, NodeType, Param
from troupe.subprocess_runner.errors import GraphInvalid, PackBrokenNode


def _types_fit(source: str, target: str) -> bool:
    return source == target or "any" in (source, target)


# Integers a JSON reader anywhere holds exactly.
INT_PARAM_MAX = 2**53


# A param value is a setting, not data: a sweep's or a study's runs each keep their own.
MAX_STRING_PARAM = 65_536
MAX_LIST_PARAM = 1_000  # strings of a list param, names of a mapping
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def check_param(param: Param, value: Any, pointer: str, node_id: str) -> Any:
    """Returns the value as the node will receive it, or raises with a reason."""

    def bad(why: str) -> GraphInvalid:
        return GraphInvalid(f"node {node_id}: param {param.name} {why}", pointer=pointer, node_id=node_id)

    kind = param.type
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad(f"must be an integer, got {type(value).__name__}")
        if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
            raise bad(f"must be an integral number, got {value}")
        value = int(value)
        if abs(value) > INT_PARAM_MAX:
            raise bad(f"must be within +-2**53, got a number of {len(str(abs(value)))} digits")
    elif kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad(f"must be a number, got {value!r}")
        try:
            value = float(value)
        except OverflowError:
            raise bad(f"is too large for a float ({len(str(abs(value)))} digits)") from None
        if not math.isfinite(value):
            raise bad(f"must be a finite number, got {value!r}")
    elif kind == "bool":
        if not isinstance(value, bool):
            raise bad(f"must be true or false, got {value!r}")
    elif kind in ("string", "secret"):
        if not isinstance(value, str):
            raise bad(f"must be a string, got {type(value).__name__}")
        if len(value) > MAX_STRING_PARAM:
            raise bad(f"is {len(value)} characters; a param holds at most {MAX_STRING_PARAM} (a large input "
                      "belongs in a file: upload it and give its upload: reference)")
    elif kind == "select":
        if value not in param.options:
            raise bad(f"must be one of {list(param.options)}, got {value!r}")
    elif kind == "list":
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise bad("must be a list of strings")
        if len(value) > MAX_LIST_PARAM or sum(len(item) for item in value) > MAX_STRING_PARAM:
            raise bad(f"holds at most {MAX_LIST_PARAM} strings of {MAX_STRING_PARAM} characters in all")
    elif kind == "mapping":
        if not isinstance(value, dict) or not all(
                isinstance(v, str | int | float | bool) and not (isinstance(v, float) and not math.isfinite(v))
                for v in value.values()):
            raise bad("must map names to numbers, booleans or strings")
        if len(value) > MAX_LIST_PARAM or not all(_NAME.fullmatch(k) for k in value):
            raise bad(f"holds at most {MAX_LIST_PARAM} names of letters, digits and _ (not starting with a digit)")
    if kind in ("int", "float"):
        if param.min is not None and value < param.min:
            raise bad(f"must be >= {param.min}, got {value}")
        if param.max is not None and value > param.max:
            raise bad(f"must be <= {param.max}, got {value}")
    return value


def resolve_params(node_type: NodeType, params: dict[str, Any], pointer: str, node_id: str) -> dict[str, Any]:
    """The node's params checked, with defaults filled in."""
    for name in params:
        if node_type.param(name) is None:
            raise GraphInvalid(
                f"node {node_id}: {node_type.type} has no param {name!r}",
                pointer=f"{pointer}/{name}",
                node_id=node_id,
            )
    resolved: dict[str, Any] = {}
    for param in node_type.params:
        if param.name in params:
            resolved[param.name] = check_param(param, params[param.name], f"{pointer}/{param.name}", node_id)
        elif param.required:
            raise GraphInvalid(
                f"node {node_id}: param {param.name} is required", pointer=pointer, node_id=node_id
            )
        else:
            resolved[param.name] = param.default
    problem = node_type.check(resolved) if node_type.check is not None else None
    if problem is not None:
        where, why = problem
        raise GraphInvalid(f"node {node_id}: {why}", pointer=f"{pointer}/{where}", node_id=node_id)
    return resolved


def check_packs_loaded(graph: Graph, catalog: Catalog, prefix: str = "/graph") -> None:
    """Refuses a node of a pack that failed to load here (``pack_broken``, with its
    error) before anything else is asked of the graph: a run for a worker is refused so
    too, rather than for the worker lacking a node type that no one has."""
    for i, node in enumerate(graph.nodes):
        if catalog.get(node.type) is None:
            _refuse_broken(node, f"{prefix}/nodes/{i}", catalog)


def _refuse_broken(node: Node, where: str, catalog: Catalog) -> None:
    pack = node.type.split(".", 1)[0]
    if pack in catalog.broken_packs:
        raise PackBrokenNode(f"node {node.id}: {node.type} is a node of pack {pack}, which failed to load: "
                             f"{catalog.broken_packs[pack]}", pointer=f"{where}/type", node_id=node.id)


def validate_graph(graph: Graph, catalog: Catalog, prefix: str = "/graph") -> dict[str, dict[str, Any]]:
    """Raises ``GraphInvalid`` for the first problem found; returns each node's resolved
    params by node id."""
    index: dict[str, int] = {}
    types: dict[str, NodeType] = {}
    params: dict[str, dict[str, Any]] = {}
    for i, node in enumerate(graph.nodes):
        where = f"{prefix}/nodes/{i}"
        if node.id in index:
            raise GraphInvalid(f"node id {node.id!r} is used twice", pointer=f"{where}/id", node_id=node.id)
        index[node.id] = i
        node_type = catalog.get(node.type)
        if node_type is None:
            _refuse_broken(node, where, catalog)
            raise GraphInvalid(
                f"node {node.id}: unknown node type {node.type!r}", pointer=f"{where}/type", node_id=node.id
            )
        types[node.id] = node_type
        params[node.id] = resolve_params(node_type, node.params, f"{where}/params", node.id)

    fed: dict[tuple[str, str], int] = {}
    for j, edge in enumerate(graph.edges):
        where = f"{prefix}/edges/{j}"
        for end in ("source", "target"):
            if getattr(edge, end) not in index:
                raise GraphInvalid(f"edge {j}: unknown {end} node {getattr(edge, end)!r}", pointer=f"{where}/{end}")
        out_port = types[edge.source].output(edge.source_port)
        if out_port is None:
            raise GraphInvalid(
                f"node {edge.source}: {types[edge.source].type} has no output {edge.source_port!r}",
                pointer=f"{where}/source_port",
                node_id=edge.source,
            )
        in_port = types[edge.target].input(edge.target_port)
        if in_port is None:
            raise GraphInvalid(
                f"node {edge.target}: {types[edge.target].type} has no input {edge.target_port!r}",
                pointer=f"{where}/target_port",
                node_id=edge.target,
            )
        if not _types_fit(out_port.type, in_port.type):
            raise GraphInvalid(
                f"node {edge.target}: input {in_port.name} takes {in_port.type}, "
                f"but {edge.source}.{out_port.name} gives {out_port.type}",
                pointer=f"{where}/target_port",
                node_id=edge.target,
            )
        key = (edge.target, edge.target_port)
        if key in fed:
            raise GraphInvalid(
                f"node {edge.target}: input {edge.target_port} is fed by edges {fed[key]} and {j}",
                pointer=f"{where}/target_port",
                node_id=edge.target,
            )
        fed[key] = j

    for node in graph.nodes:
        for port in types[node.id].inputs:
            if port.required and (node.id, port.name) not in fed:
                raise GraphInvalid(
                    f"node {node.id}: required input {port.name} is not connected",
                    pointer=f"{prefix}/nodes/{index[node.id]}",
                    node_id=node.id,
                )

    _check_acyclic(graph, prefix)
    return params


def _check_acyclic(graph: Graph, prefix: str) -> None:
    indegree = {node.id: 0 for node in graph.nodes}
    children: dict[str, list[str]] = {node.id: [] for node in graph.nodes}
    for edge in graph.edges:
        indegree[edge.target] += 1
        children[edge.source].append(edge.target)
    ready = deque(n for n, d in indegree.items() if d == 0)
    seen = 0
    while ready:
        current = ready.popleft()
        seen += 1
        for child in children[current]:
            indegree[child] -= 1
            if indegree[child] == 0:
                ready.append(child)
    if seen == len(indegree):
        return
    for j, edge in enumerate(graph.edges):
        if indegree[edge.target] > 0 and indegree[edge.source] > 0:
            raise GraphInvalid(
                f"the graph has a cycle through {edge.source} -> {edge.target}",
                pointer=f"{prefix}/edges/{j}",
                node_id=edge.target,
            )
    raise GraphInvalid("the graph has a cycle", pointer=f"{prefix}/edges")
