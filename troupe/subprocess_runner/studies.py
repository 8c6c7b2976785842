"""Compiles a study's variants into whole graphs, validated like a sweep's, and ranks
variants from their attempts."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any

from troupe.protocol.errors import InvalidRequest
from troupe.protocol.studies import SubmitStudy
from troupe.protocol.sweeps import Objective, SubmitSweep
from troupe.subprocess_runner.catalog import Catalog
from troupe.subprocess_runner.sweeps import (
    SweepInvalid,
    SweepLimits,
    compile_sweep,
    mapped_param,
    refuse_unknown_name,
    with_params,
)
from troupe.subprocess_runner.validation import check_param

SEED_MODULUS = 2**32
MAX_ATTEMPTS = 10_000  # variants x repeats: the runs a study may ever make


def _mean(values: list[float]) -> float:
    """The mean, also of values whose sum is past the largest float (a diverging loss)."""
    try:
        return statistics.fmean(values)
    except OverflowError:
        return math.fsum(v / len(values) for v in values)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return ordered[middle - 1] / 2 + ordered[middle] / 2  # (a + b) / 2 to the bit, and never past a float


def _spread(values: list[float]) -> float:
    """The sample standard deviation; values near the largest float are scaled first."""
    try:
        return statistics.stdev(values)
    except OverflowError:
        scale = max(abs(v) for v in values)
        return statistics.stdev([v / scale for v in values]) * scale


_REDUCE: dict[str, Callable[[list[float]], float]] = {"mean": _mean, "median": _median, "min": min, "max": max}


class StudyInvalid(InvalidRequest):
    """Raised when a study cannot be compiled (its variants, its sweep_spec, its repeats);
    nothing has been stored or queued. A study's is its own code: a client that submitted
    a study was told ``sweep_invalid``, about a sweep it never sent."""

    code = "study_invalid"


def compile_variants(body: SubmitStudy, catalog: Catalog, limits: SweepLimits) -> list[dict[str, Any]]:
    """``[{"name", "params": {"node.param": value}, "graph"}]``; raises ``StudyInvalid``
    (what the sweep's checks it shares refuse too, with their words and pointer)."""
    try:
        return _compile(body, catalog, limits)
    except SweepInvalid as exc:
        raise StudyInvalid(exc.message, pointer=exc.pointer, node_id=exc.node_id, details=exc.details) from None


def _compile(body: SubmitStudy, catalog: Catalog, limits: SweepLimits) -> list[dict[str, Any]]:
    if body.options.seed is not None:
        raise StudyInvalid("a study manages seeds; use its seed field", pointer="/options/seed")
    if body.options.lane != "queued":
        raise StudyInvalid("a study always queues; lane interactive is refused", pointer="/options/lane")
    if (body.variants is None) == (body.sweep_spec is None):
        raise StudyInvalid("give either variants or a sweep_spec", pointer="/variants")
    if body.sweep_spec is not None:
        objective = Objective(metric=body.objective.metric, direction=body.objective.direction)
        sweep = SubmitSweep(base_graph=body.base_graph, sweep_spec=body.sweep_spec, objective=objective)
        compiled = compile_sweep(sweep, catalog, limits)
        if len(compiled.variants) * body.repeats > MAX_ATTEMPTS:
            raise StudyInvalid(f"{len(compiled.variants)} variants x {body.repeats} repeats is over {MAX_ATTEMPTS} "
                               "runs", pointer="/repeats")
        return [{"name": ", ".join(f"{k}={v}" for k, v in v.params.items()), "params": v.params, "graph": v.graph}
                for v in compiled.variants]
    assert body.variants is not None
    base = body.base_graph.model_dump(mode="json", exclude_none=True)
    nodes = {n.id: n for n in body.base_graph.nodes}
    # One study may be large in variants and repeats, but never in attempts.
    if len(body.variants) * body.repeats > MAX_ATTEMPTS:
        raise StudyInvalid(f"{len(body.variants)} variants x {body.repeats} repeats is over {MAX_ATTEMPTS} runs",
                           pointer="/repeats")
    out, names = [], set()
    for i, variant in enumerate(body.variants):
        where = f"/variants/{i}"
        if variant.name in names:
            raise StudyInvalid(f"variant name {variant.name!r} is used twice", pointer=f"{where}/name")
        names.add(variant.name)
        params = {}
        for j, entry in enumerate(variant.params):
            at = f"{where}/params/{j}"
            node = nodes.get(entry.node_id)
            node_type = catalog.get(node.type) if node is not None else None
            if node is None or node_type is None:
                raise StudyInvalid(f"the base graph has no node {entry.node_id!r}", pointer=f"{at}/node_id")
            param = node_type.param(entry.param)
            mapped = param is None and (param := mapped_param(node_type, entry.param, [entry.value])) is not None
            if param is None or param.type == "secret":
                raise StudyInvalid(f"node {entry.node_id} has no settable param {entry.param!r}",
                                   pointer=f"{at}/param", node_id=entry.node_id)
            value = check_param(param, entry.value, f"{at}/value", entry.node_id)
            if mapped:  # a name of a mapping param (vars.lr): one the node type takes
                refuse_unknown_name(node_type, node.params, entry.param, value, f"{at}/param", entry.node_id)
            params[f"{entry.node_id}.{entry.param}"] = value
        out.append({"name": variant.name, "params": params, "graph": with_params(base, params)})
    return out


def attempt_seed(seed: int | None, repeat: int) -> int | None:
    """Repeat r of every variant gets the same seed, so variants are compared fairly."""
    return None if seed is None else (seed + repeat) % SEED_MODULUS


def rank(variants: list[dict[str, Any]], attempts: list[dict[str, Any]], repeats: int,
         objective: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(ranking, unranked)``: a variant is ranked only when every repeat's final attempt
    succeeded and recorded the objective. Every entry carries the variant's params, the
    values of its repeats that succeeded, and their spread (``std``, the sample standard
    deviation; 0 for a single value); an unranked one says why, and how many repeats
    are done: ``incomplete`` when some succeeded and the rest never ran."""
    reduce = _REDUCE[objective.get("reduce", "mean")]
    scored, unranked = [], []
    for index, variant in enumerate(variants):
        final: dict[int, dict[str, Any]] = {}
        for attempt in attempts:
            if attempt["variant"] == index:
                final[attempt["repeat"]] = attempt  # later attempts replace retried ones
        statuses = [final[r]["status"] if r in final else None for r in range(repeats)]
        values = [final[r]["objective_value"] for r in range(repeats)
                  if statuses[r] == "succeeded" and final[r]["objective_value"] is not None]
        entry = {"variant": variant["name"], "params": variant.get("params", {}), "values": values,
                 "std": _spread(values) if len(values) > 1 else 0.0 if values else None}
        if "over_budget" in statuses:
            reason = "over_budget"
        elif any(s in ("failed", "cancelled") for s in statuses):
            reason = "repeat_failed"
        elif any(s in ("queued", "running", "disconnected") for s in statuses):
            reason = "running"
        elif any(s != "succeeded" for s in statuses):
            reason = "incomplete" if any(s == "succeeded" for s in statuses) else "not_run"
        elif len(values) < repeats:
            reason = "no_objective"
        else:
            scored.append({**entry, "objective_value": reduce(values), "repeats": repeats})
            continue
        unranked.append({**entry, "reason": reason, "repeats_done": statuses.count("succeeded")})
    scored.sort(key=lambda s: s["objective_value"] if objective["direction"] == "minimize" else -s["objective_value"])
    for i, entry in enumerate(scored, start=1):
        entry["rank"] = i
    return scored, unranked
