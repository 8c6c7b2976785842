"""Compiles a sweep spec into whole graphs, one per combination, checking every value
against the node's param schema before anything is queued.

Grid order: the last param varies fastest. A random sweep draws ``samples`` distinct
combinations with its own seed, so the same seed always draws the same ones. Limits
refuse a sweep; they never truncate one.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Container, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from troupe.protocol.errors import InvalidRequest
from troupe.protocol.graph import Graph
from troupe.protocol.sweeps import SubmitSweep, SweepParam, SweepRange
from troupe.subprocess_runner.catalog import Catalog, Param
from troupe.subprocess_runner.errors import GraphInvalid
from troupe.subprocess_runner.validation import check_param, resolve_params

SWEEPABLE = frozenset({"int", "float", "bool", "string", "select"})
SEED_MODULUS = 2**32


@dataclass(frozen=True)
class SweepLimits:
    max_runs: int = 32
    max_params: int = 4
    max_domain: int = 32
    recorded_outputs_keep: int = 20


@dataclass(frozen=True)
class Variant:
    index: int
    params: dict[str, Any]  # "<node_id>.<param>" -> value
    graph: dict[str, Any]
    seed: int | None


@dataclass(frozen=True)
class CompiledSweep:
    domains: list[dict[str, Any]]  # [{"key", "node_id", "param", "values"}]
    total_combinations: int
    variants: list[Variant]
    base: dict[str, Any]  # the base graph document every variant's graph shares


class SweepInvalid(InvalidRequest):
    """Raised when a sweep cannot be compiled; nothing has been stored or queued."""

    code = "sweep_invalid"


def _expand_range(spec: SweepRange, param_type: str, where: str, max_domain: int) -> list[Any]:
    """The range's values, refused before they are built when they would be more than
    ``max_domain``: a float range has ``count`` of them; an int range keeps its distinct
    rounded points, counted as they come, so no more than ``max_domain + 1`` are held."""
    kind = spec.type or param_type
    if kind not in ("int", "float"):
        raise SweepInvalid(f"a range needs an int or float param, this one is {param_type}", pointer=where)
    if spec.min > spec.max:
        raise SweepInvalid("range min is above max", pointer=f"{where}/min")
    if spec.scale == "log" and spec.min <= 0:
        raise SweepInvalid("a log range needs a positive min", pointer=f"{where}/min")
    if math.isinf(spec.max - spec.min):  # each point is min + a share of the width
        raise SweepInvalid("the range from min to max is wider than a float holds", pointer=f"{where}/max")
    too_many = f"values; the limit is {max_domain} (TROUPE_MAX_SWEEP_DOMAIN)"
    if kind == "float":
        if spec.count > max_domain:
            raise SweepInvalid(f"the range asks for {spec.count} {too_many}", pointer=f"{where}/count")
        return list(_points(spec))
    span = round_half_away(spec.max) - round_half_away(spec.min) + 1
    if spec.scale == "linear" and min(spec.count, span) > max_domain:
        # Linear points closer than 1 apart reach every integer between the rounded ends,
        # and points 1 or more apart round to distinct integers: counted, not built.
        raise SweepInvalid(f"the range rounds to more than {max_domain} distinct {too_many}", pointer=f"{where}/count")
    distinct: dict[int, None] = {}
    for point in _points(spec):
        distinct[round_half_away(point)] = None
        if len(distinct) > max_domain:
            raise SweepInvalid(f"the range rounds to more than {max_domain} distinct {too_many}",
                               pointer=f"{where}/count")
    return list(distinct)  # distinct, in order


def _points(spec: SweepRange) -> Iterator[float]:
    if spec.count == 1:
        yield spec.min
        return
    if spec.scale == "log":
        low, high = math.log10(spec.min), math.log10(spec.max)
        for i in range(spec.count):
            try:
                yield 10 ** (low + i * (high - low) / (spec.count - 1))
            except OverflowError:  # the top end, rounded past the largest float
                yield spec.max
        return
    width = spec.max - spec.min
    for i in range(spec.count):
        part = i * width
        # i * width may pass the largest float where the point itself does not (0 .. 1e308)
        yield spec.min + (part / (spec.count - 1) if not math.isinf(part) else width * (i / (spec.count - 1)))


def round_half_away(value: float) -> int:
    """Integer ranges round half up (002), and a negative half away from zero alike:
    0.5 -> 1, 2.5 -> 3, -0.5 -> -1 (Python's ``round`` would give 0, 2 and 0)."""
    magnitude = math.floor(abs(value) + 0.5)
    return int(magnitude if value >= 0 else -magnitude)


def _domain(entry: SweepParam, where: str, base: Graph, catalog: Catalog, limits: SweepLimits) -> dict[str, Any]:
    matches = [n for n in base.nodes if n.id == entry.node_id]
    if not matches:
        raise SweepInvalid(f"the base graph has no node {entry.node_id!r}", pointer=f"{where}/node_id")
    if len(matches) > 1:
        raise SweepInvalid(f"node id {entry.node_id!r} appears twice", pointer=f"{where}/node_id")
    node_type = catalog.get(matches[0].type)
    param = node_type.param(entry.param) if node_type is not None else None
    if param is None and node_type is not None:  # a name of a mapping param: vars.lr
        int_range = entry.range is not None and entry.range.type == "int"
        param = mapped_param(node_type, entry.param, entry.values, int_range)
    if param is None:
        raise SweepInvalid(f"node {entry.node_id} ({matches[0].type}) has no param {entry.param!r}",
                           pointer=f"{where}/param", node_id=entry.node_id)
    if param.type not in SWEEPABLE:
        raise SweepInvalid(f"param {entry.param} is a {param.type}; {', '.join(sorted(SWEEPABLE))} can be swept",
                           pointer=f"{where}/param", node_id=entry.node_id)
    if (entry.values is None) == (entry.range is None):
        raise SweepInvalid("give either values or a range", pointer=where)
    if entry.values is not None:
        values, at = list(entry.values), f"{where}/values"
    else:
        assert entry.range is not None
        values, at = _expand_range(entry.range, param.type, f"{where}/range", limits.max_domain), f"{where}/range"
    if len(values) > limits.max_domain:
        raise SweepInvalid(f"{len(values)} values for {entry.node_id}.{entry.param}; the limit is "
                           f"{limits.max_domain} (TROUPE_MAX_SWEEP_DOMAIN)", pointer=at)
    checked, seen = [], set()
    for i, value in enumerate(values):
        pointer = f"{at}/{i}" if entry.values is not None else f"{at}/count"
        value = check_param(param, value, pointer, entry.node_id)
        if (identity := _identity(value)) in seen:  # compared as the param takes them: 1 and 1.0 for a float
            raise SweepInvalid(f"value {value!r} is listed twice" if entry.values is not None else
                               f"the range gives {value!r} twice; fewer points, or a wider range", pointer=pointer)
        seen.add(identity)
        checked.append(value)
    if node_type is not None and node_type.param(entry.param) is None:
        refuse_unknown_name(node_type, matches[0].params, entry.param, checked[0], f"{where}/param", entry.node_id)
    key = f"{entry.node_id}.{entry.param}"
    if len(key_targets(key, {n.id for n in base.nodes})) > 1:
        raise SweepInvalid(f"{key} could name a param of node {entry.node_id} or of another node whose id has a "
                           "dot; rename one of the nodes", pointer=f"{where}/node_id", node_id=entry.node_id)
    return {"key": key, "node_id": entry.node_id, "param": entry.param, "values": checked}


def key_targets(key: str, ids: Container[str]) -> list[tuple[str, str]]:
    """The (node id, param) pairs a text key ``NODE.PARAM`` can name among the node
    ``ids``: a node's own param, or one name of a mapping param (``NODE.vars.NAME``), as
    ``with_params`` reads it. Two pairs: node ids with dots make the key ambiguous."""
    node_id, _, param = key.rpartition(".")
    found = [(node_id, param)] if node_id in ids else []
    outer, dot, mapping = node_id.rpartition(".")
    if dot and outer in ids:
        found.append((outer, f"{mapping}.{param}"))
    return found


def mapped_param(node_type: Any, name: str, values: list[Any] | None, int_range: bool = False) -> Param | None:
    """``vars.lr`` of a node whose ``vars`` is a mapping: set by number, as an int when
    every listed value is one (a command's ``--epochs {epochs}`` takes ``6``, not ``6.0``)."""
    head, dot, key = name.partition(".")
    outer = node_type.param(head) if dot else None
    if outer is None or outer.type != "mapping" or not key.isidentifier():
        return None
    integral = values is not None and all(isinstance(v, int) and not isinstance(v, bool) for v in values)
    return Param(name, "int" if integral or int_range else "float")


def refuse_unknown_name(node_type: Any, params: Mapping[str, Any], name: str, value: Any, pointer: str,
                        node_id: str) -> None:
    """A name of a mapping param set by a sweep or a study (``vars.lrr``) is one the node
    type takes: its own check is asked with the name set, so a command's var that no
    placeholder uses is refused here, at the spec's param, and not swept as identical runs."""
    head, _, key = name.partition(".")
    mapping = params.get(head)
    changed = {**params, head: {**(mapping if isinstance(mapping, dict) else {}), key: value}}
    try:
        resolve_params(node_type, changed, "", node_id)
    except GraphInvalid as exc:
        why = exc.message.removeprefix(f"node {node_id}: ")
        raise SweepInvalid(f"{name} of node {node_id} cannot be set: {why}", pointer=pointer, node_id=node_id) from None


def _identity(value: Any) -> tuple[str, Any]:
    """What makes two listed values the same one: equal and of one JSON type (``1`` and
    ``1.0`` differ, as ``true`` and ``1`` do), hashable so a list is checked in one pass."""
    if isinstance(value, dict | list):
        return type(value).__name__, json.dumps(value, sort_keys=True)
    return type(value).__name__, value


def _combinations(body: SubmitSweep, domains: list[dict[str, Any]], limits: SweepLimits) -> list[tuple[Any, ...]]:
    spec = body.sweep_spec
    sizes = [len(d["values"]) for d in domains]
    total = math.prod(sizes)
    if spec.method == "grid":
        if spec.samples is not None:
            raise SweepInvalid("a grid sweep takes no samples", pointer="/sweep_spec/samples")
        if total > limits.max_runs:
            raise SweepInvalid(f"the grid has {total} combinations; the limit is {limits.max_runs} "
                               "(TROUPE_MAX_SWEEP_RUNS)", pointer="/sweep_spec/params")
        return list(itertools.product(*(d["values"] for d in domains)))
    if spec.samples is None:
        raise SweepInvalid("a random sweep needs samples", pointer="/sweep_spec/samples")
    if spec.seed is None:
        raise SweepInvalid("a random sweep needs a seed (0 to 4294967295)", pointer="/sweep_spec/seed")
    if spec.samples > total:
        raise SweepInvalid(f"{spec.samples} samples asked of {total} combinations", pointer="/sweep_spec/samples")
    if spec.samples > limits.max_runs:
        raise SweepInvalid(f"{spec.samples} samples; the limit is {limits.max_runs} (TROUPE_MAX_SWEEP_RUNS)",
                           pointer="/sweep_spec/samples")
    picks = random.Random(spec.seed).sample(range(total), spec.samples)
    combos = []
    for pick in picks:
        combo = []
        for size, domain in zip(reversed(sizes), reversed(domains), strict=True):
            pick, digit = divmod(pick, size)
            combo.append(domain["values"][digit])
        combos.append(tuple(reversed(combo)))
    return combos


def with_params(base: dict[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """The base graph document with ``params`` (``"node.param"`` -> value) set. Only the
    nodes that change are new dicts; the others are the base's own, shared by every
    variant (graph documents are never changed in place), so many variants of a large
    graph cost one copy of it."""
    ids = {n["id"] for n in base["nodes"]}
    by_node: dict[str, dict[str, Any]] = {}
    nested: dict[str, dict[str, dict[str, Any]]] = {}  # node -> mapping param -> name -> value
    for key, value in params.items():
        node_id, _, param = key.rpartition(".")
        if node_id not in ids and "." in node_id:  # NODE.vars.NAME: one name of a mapping param
            node_id, _, mapping = node_id.rpartition(".")
            nested.setdefault(node_id, {}).setdefault(mapping, {})[param] = value
            continue
        by_node.setdefault(node_id, {})[param] = value
    nodes = [_changed(n, by_node.get(n["id"], {}), nested.get(n["id"], {}))
             if n["id"] in by_node or n["id"] in nested else n for n in base["nodes"]]
    return {**base, "nodes": nodes}


def _changed(node: dict[str, Any], params: dict[str, Any], mappings: dict[str, dict[str, Any]]) -> dict[str, Any]:
    own = node.get("params") or {}
    merged = {**own, **params}
    for name, values in mappings.items():
        merged[name] = {**(own.get(name) or {}), **values}
    return {**node, "params": merged}


def compile_sweep(body: SubmitSweep, catalog: Catalog, limits: SweepLimits) -> CompiledSweep:
    spec, options = body.sweep_spec, body.options
    if options.seed is not None:
        raise SweepInvalid("a sweep manages seeds; use sweep_spec.seed with seed_variants", pointer="/options/seed")
    if options.lane != "queued":
        raise SweepInvalid("a sweep always queues; lane interactive is refused", pointer="/options/lane")
    if body.seed_variants and spec.seed is None:
        raise SweepInvalid("seed_variants needs sweep_spec.seed", pointer="/sweep_spec/seed")
    if len(spec.params) > limits.max_params:
        raise SweepInvalid(f"{len(spec.params)} params; the limit is {limits.max_params} (TROUPE_MAX_SWEEP_PARAMS)",
                           pointer="/sweep_spec/params")
    keys = [f"{p.node_id}.{p.param}" for p in spec.params]
    for i, key in enumerate(keys):
        if key in keys[:i]:
            raise SweepInvalid(f"{key} is swept twice", pointer=f"/sweep_spec/params/{i}")
    domains = [_domain(p, f"/sweep_spec/params/{i}", body.base_graph, catalog, limits)
               for i, p in enumerate(spec.params)]
    combos = _combinations(body, domains, limits)
    if options.record_outputs and len(combos) > limits.recorded_outputs_keep:
        raise SweepInvalid(f"record_outputs with {len(combos)} variants would evict the first ones' outputs "
                           f"(TROUPE_RECORDED_OUTPUTS_KEEP is {limits.recorded_outputs_keep})",
                           pointer="/options/record_outputs")
    base = body.base_graph.model_dump(mode="json", exclude_none=True)
    variants = []
    for index, combo in enumerate(combos):
        seed = (spec.seed + index) % SEED_MODULUS if body.seed_variants and spec.seed is not None else None
        params = {d["key"]: value for d, value in zip(domains, combo, strict=True)}
        variants.append(Variant(index, params, with_params(base, params), seed))
    # Exactly this many runs will ever exist for the sweep.
    return CompiledSweep(domains, len(variants), variants, base)
