"""Compiles a sweep spec into whole graphs, one per combination, checking every value
against the node's param schema before anything is queued.

Grid order: the last param varies fastest. A random sweep draws ``samples`` distinct
combinations with its own seed, so the same seed always draws the same ones. Limits
refuse a sweep; they never truncate one.
"""

from __future__ import annotations

import copy
import itertools
import math
import random
from dataclasses import dataclass
from typing import Any

from protocol.errors import InvalidRequest
from protocol.graph import Graph
from protocol.sweeps import SubmitSweep, SweepParam, SweepRange
from subprocess_runner.catalog import Catalog
from subprocess_runner.validation import check_param

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


class SweepInvalid(InvalidRequest):
    """Raised when a sweep cannot be compiled; nothing has been stored or queued."""

    code = "sweep_invalid"


def _expand_range(spec: SweepRange, param_type: str, where: str) -> list[Any]:
    kind = spec.type or param_type
    if kind not in ("int", "float"):
        raise SweepInvalid(f"a range needs an int or float param, this one is {param_type}", pointer=where)
    if spec.min > spec.max:
        raise SweepInvalid("range min is above max", pointer=f"{where}/min")
    if spec.scale == "log" and spec.min <= 0:
        raise SweepInvalid("a log range needs a positive min", pointer=f"{where}/min")
    if spec.count == 1:
        points = [spec.min]
    elif spec.scale == "log":
        low, high = math.log10(spec.min), math.log10(spec.max)
        points = [10 ** (low + i * (high - low) / (spec.count - 1)) for i in range(spec.count)]
    else:
        points = [spec.min + i * (spec.max - spec.min) / (spec.count - 1) for i in range(spec.count)]
    if kind == "int":
        return list(dict.fromkeys(round_half_away(p) for p in points))  # distinct, in order
    return points


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
        seen: list[Any] = []
        for i, value in enumerate(values):
            if any(value == s and type(value) is type(s) for s in seen):
                raise SweepInvalid(f"value {value!r} is listed twice", pointer=f"{at}/{i}")
            seen.append(value)
    else:
        assert entry.range is not None
        values, at = _expand_range(entry.range, param.type, f"{where}/range"), f"{where}/range"
    if len(values) > limits.max_domain:
        raise SweepInvalid(f"{len(values)} values for {entry.node_id}.{entry.param}; the limit is "
                           f"{limits.max_domain} (TROUPE_MAX_SWEEP_DOMAIN)", pointer=at)
    checked = []
    for i, value in enumerate(values):
        pointer = f"{at}/{i}" if entry.values is not None else at
        checked.append(check_param(param, value, pointer, entry.node_id))
    return {"key": f"{entry.node_id}.{entry.param}", "node_id": entry.node_id, "param": entry.param,
            "values": checked}


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
    keys = [(p.node_id, p.param) for p in spec.params]
    for i, key in enumerate(keys):
        if key in keys[:i]:
            raise SweepInvalid(f"{key[0]}.{key[1]} is swept twice", pointer=f"/sweep_spec/params/{i}")
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
        graph = copy.deepcopy(base)
        for domain, value in zip(domains, combo, strict=True):
            target = next(n for n in graph["nodes"] if n["id"] == domain["node_id"])
            target.setdefault("params", {})[domain["param"]] = value
        seed = (spec.seed + index) % SEED_MODULUS if body.seed_variants and spec.seed is not None else None
        params = {d["key"]: value for d, value in zip(domains, combo, strict=True)}
        variants.append(Variant(index, params, graph, seed))
    # Exactly this many runs will ever exist for the sweep.
    return CompiledSweep(domains, len(variants), variants)
