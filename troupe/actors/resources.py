"""What a run's nodes ask for once flavors are read, cut to what one real machine has.

A node names a flavor (``resources.flavor``) or gives numbers, or both when they agree
by value. An ask that no machine the run can go to could grant is cut down to the
largest real one, with a ``resources_cut_down`` warning, rather than refused: a graph
written for a cluster has to run on a laptop (003). The flavors come from the store
(``read_flavors``), read again for every submission that names one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from troupe.actors.store import StoreClient
from troupe.actors.store.flavors import ListFlavors
from troupe.protocol.api import RunOptions
from troupe.protocol.errors import InvalidRequest
from troupe.protocol.graph import Graph, NodeResources
from troupe.subprocess_runner.catalog import Catalog

_QUANTITIES = ("cpus", "gpus", "ram", "duration_s")
_UNITS = {"cpus": "cpus", "gpus": "cards", "ram": "MB of ram"}


@dataclass(frozen=True)
class Machine:
    """The largest real machine a run can go to, and how to name it in a warning."""

    cpus: int
    cards: int
    named: str  # "this server lends", "worker gpu-a has"


@dataclass
class Resolved:
    graph: Graph  # what the engine runs: each node's resources as granted
    memory_gib: float | None
    warnings: list[dict[str, Any]] = field(default_factory=list)
    # The run's expected length: the sum of what its nodes declare (directly or by their
    # flavor), an upper bound as nodes may overlap; None when none declares any.
    duration_s: float | None = None


def with_type_resources(graph_doc: Graph, catalog: Catalog) -> Graph:
    """The graph with what each node's type asks for (a pack's ``@node(resources=...)``)
    written into the nodes that do not say otherwise: from here on it is what the node
    asked, stored with the run and read as any node's own."""
    nodes, changed = [], False
    for node in graph_doc.nodes:
        node_type = catalog.get(node.type)
        declared = dict(node_type.resources or {}) if node_type is not None else {}
        own = node.resources.model_dump(exclude_none=True) if node.resources is not None else {}
        if any(key not in own for key in declared):
            node = node.model_copy(update={"resources": NodeResources.model_validate({**declared, **own})})
            changed = True
        nodes.append(node)
    return graph_doc.model_copy(update={"nodes": nodes}) if changed else graph_doc


def flavor_names(graph_doc: Graph, options: RunOptions) -> tuple[str, ...]:
    names = {node.resources.flavor for node in graph_doc.nodes if node.resources and node.resources.flavor}
    if options.target is not None and options.target.flavor:
        names.add(options.target.flavor)
    return tuple(sorted(names))


async def read_flavors(store: StoreClient, graph_doc: Graph, options: RunOptions) -> dict[str, dict[str, Any]]:
    """The flavors a submission names, as stored now; no read when it names none."""
    names = flavor_names(graph_doc, options)
    return await store.read(ListFlavors(names)) if names else {}


def resolve(graph_doc: Graph, options: RunOptions, flavors: Mapping[str, Mapping[str, Any]], prefix: str,
            machine: Machine, on_worker: bool) -> Resolved:
    nodes, warnings = [], []
    env: dict[str, str] = {}
    durations: list[float] = []
    for i, node in enumerate(graph_doc.nodes):
        asked = node.resources
        if asked is None:
            nodes.append(node)
            continue
        where = f"{prefix}/nodes/{i}/resources"
        sizes = _flavor(flavors, asked.flavor, f"{where}/flavor")
        granted: dict[str, Any] = {}
        for quantity in _QUANTITIES:
            mine, theirs = getattr(asked, quantity), sizes.get(quantity)
            if mine is not None and theirs is not None and mine != theirs:
                raise InvalidRequest(
                    f"node {node.id} gives {quantity} {mine} and its flavor {asked.flavor} says {theirs}; give one, "
                    "or the same value", pointer=f"{where}/{quantity}", node_id=node.id, code="flavor_conflict")
            granted[quantity] = mine if mine is not None else theirs
        if granted["duration_s"] is not None:
            durations.append(float(granted["duration_s"]))
        for quantity, has in (("cpus", machine.cpus), ("gpus", machine.cards)):
            if granted[quantity] is not None and granted[quantity] > has:
                warnings.append({"message": f"node {node.id} asks for {granted[quantity]} {_UNITS[quantity]}; "
                                            f"{machine.named} {has}: cut down to {has}",
                                 "code": "resources_cut_down", "node_id": node.id})
                granted[quantity] = has
        for name, value in (asked.env or {}).items():
            if env.setdefault(name, value) != value:
                raise InvalidRequest(f"two nodes set {name} to different values; a run has one process",
                                     pointer=f"{where}/env/{name}", node_id=node.id, code="env_conflict")
        nodes.append(node.model_copy(update={"resources": _granted(asked, granted, node.id, where)}))
    if env and not on_worker:
        warnings.append({"message": f"resources.env ({', '.join(sorted(env))}) is set in a worker's run process "
                                    "only; this server's runs share its process, so it is not applied here",
                         "code": "env_not_applied"})
    memory_gib = _budget(options, flavors, on_worker, warnings)
    engine_graph = graph_doc.model_copy(update={"nodes": nodes}) if any(n.resources for n in nodes) else graph_doc
    return Resolved(engine_graph, memory_gib, warnings, sum(durations) if durations else None)


def _granted(asked: NodeResources, granted: dict[str, Any], node_id: str, where: str) -> NodeResources:
    """The node's resources as granted. A flavor stored before today's bounds may hold a
    size they refuse: that is the submission's error, never the placer's crash."""
    try:
        return NodeResources.model_validate(
            {**asked.model_dump(exclude_none=True), **{k: v for k, v in granted.items() if v is not None}})
    except ValidationError as exc:
        first = exc.errors()[0]
        quantity = ".".join(str(p) for p in first["loc"][:1])
        raise InvalidRequest(f"node {node_id}: its flavor {asked.flavor!r} gives {quantity} a size out of bounds "
                             f"({first['msg']}); change the flavor", pointer=f"{where}/flavor", node_id=node_id,
                             code="flavor_invalid") from None


def _budget(options: RunOptions, flavors: Mapping[str, Mapping[str, Any]], on_worker: bool,
            warnings: list[dict[str, Any]]) -> float | None:
    target = options.target
    if target is None:
        return None
    sizes = _flavor(flavors, target.flavor, "/options/target/flavor")
    theirs = sizes.get("memory_gib")
    if target.memory_gib is not None and theirs is not None and target.memory_gib != theirs:
        raise InvalidRequest(f"options.target.memory_gib is {target.memory_gib} and flavor {target.flavor} says "
                             f"{theirs}; give one, or the same value", pointer="/options/target/memory_gib",
                             code="flavor_conflict")
    if target.memory_gib is not None or theirs is None:
        return target.memory_gib
    if not on_worker:
        warnings.append({"message": f"flavor {target.flavor}'s memory budget ({theirs} GiB) applies to runs on a "
                                    "worker's shared card; this server's runs share one process and are not capped",
                         "code": "flavor_budget_ignored"})
        return None
    return float(theirs)


def _flavor(flavors: Mapping[str, Mapping[str, Any]], name: str | None, pointer: str) -> Mapping[str, Any]:
    if name is None:
        return {}
    if name not in flavors:
        raise InvalidRequest(f"no flavor named {name!r}; GET /api/flavors lists them", pointer=pointer,
                             code="unknown_flavor")
    return flavors[name]
