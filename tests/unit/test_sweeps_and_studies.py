"""Sweep compilation and study ranking, as pure functions."""

from __future__ import annotations

import pytest

from tests.helpers import graph, node
from troupe.protocol.errors import InvalidRequest
from troupe.protocol.sweeps import SubmitSweep
from troupe.subprocess_runner.catalog import NodeType, Pack, Param, build_catalog
from troupe.subprocess_runner.packs import core
from troupe.subprocess_runner.studies import attempt_seed, rank
from troupe.subprocess_runner.sweeps import SweepInvalid, SweepLimits, compile_sweep

CATALOG = build_catalog([core.PACK, Pack("t", (NodeType("t.Login", lambda c, i, p: {}, params=(
    Param("password", "secret", default=""), Param("mode", "select", default="a", options=("a", "b")),
    Param("flag", "bool", default=False))),))])


def body(params, **extra):
    return SubmitSweep.model_validate({
        "base_graph": graph(node("l", "t.Login")), "sweep_spec": {"method": "grid", "params": params, **extra},
        "objective": {"metric": "m", "direction": "minimize"}})


def test_secrets_cannot_be_swept_but_selects_and_bools_can():
    with pytest.raises(SweepInvalid) as caught:
        compile_sweep(body([{"node_id": "l", "param": "password", "values": ["a", "b"]}]), CATALOG, SweepLimits())
    assert caught.value.pointer == "/sweep_spec/params/0/param"
    compiled = compile_sweep(body([{"node_id": "l", "param": "mode", "values": ["a", "b"]},
                                   {"node_id": "l", "param": "flag", "values": [True, False]}]), CATALOG, SweepLimits())
    assert [v.params for v in compiled.variants] == [
        {"l.mode": "a", "l.flag": True}, {"l.mode": "a", "l.flag": False},
        {"l.mode": "b", "l.flag": True}, {"l.mode": "b", "l.flag": False}]
    with pytest.raises(InvalidRequest) as caught:  # the param's own check: graph_invalid
        compile_sweep(body([{"node_id": "l", "param": "mode", "values": ["a", "c"]}]), CATALOG, SweepLimits())
    assert caught.value.pointer == "/sweep_spec/params/0/values/1"


def test_a_range_on_a_select_is_refused():
    with pytest.raises(SweepInvalid, match="int or float"):
        compile_sweep(body([{"node_id": "l", "param": "mode", "range": {"min": 0, "max": 1, "count": 2}}]),
                      CATALOG, SweepLimits())


VARIANTS = [{"name": "a"}, {"name": "b"}]


def attempt(variant, repeat, status, value, n=0):
    return {"variant": variant, "repeat": repeat, "attempt": n, "status": status, "objective_value": value}


@pytest.mark.parametrize("reduce, a_value", [("mean", 2.0), ("median", 2.0), ("min", 1.0), ("max", 3.0)])
def test_rank_reduces_the_repeats(reduce, a_value):
    attempts = [attempt(0, 0, "succeeded", 1.0), attempt(0, 1, "succeeded", 3.0),
                attempt(1, 0, "succeeded", 0.5), attempt(1, 1, "succeeded", 10.0)]
    ranking, unranked = rank(VARIANTS, attempts, 2, {"direction": "minimize", "reduce": reduce})
    assert {r["variant"]: r["objective_value"] for r in ranking}["a"] == a_value and unranked == []
    assert [r["rank"] for r in ranking] == [1, 2]


def test_a_retried_repeat_counts_by_its_last_attempt_and_reasons_are_given():
    attempts = [attempt(0, 0, "interrupted", None, 0), attempt(0, 0, "succeeded", 1.0, 1),
                attempt(1, 0, "over_budget", None, 2)]
    ranking, unranked = rank(VARIANTS, attempts, 1, {"direction": "maximize"})
    assert [(r["variant"], r["objective_value"], r["repeats"], r["rank"], r["std"]) for r in ranking] == [
        ("a", 1.0, 1, 1, 0.0)]
    assert [(u["variant"], u["reason"]) for u in unranked] == [("b", "over_budget")]
    _, unranked = rank(VARIANTS, [attempt(0, 0, "succeeded", None), attempt(1, 0, "failed", None)], 1,
                       {"direction": "maximize"})
    assert [(u["variant"], u["reason"]) for u in unranked] == [("a", "no_objective"), ("b", "repeat_failed")]


def test_repeat_seeds_wrap_into_range():
    assert attempt_seed(None, 3) is None
    assert [attempt_seed(2**32 - 1, r) for r in range(3)] == [2**32 - 1, 0, 1]


def test_a_variant_with_some_repeats_done_is_incomplete_and_spread_is_reported():
    attempts = [attempt(0, 0, "succeeded", 1.0), attempt(0, 1, "succeeded", 3.0), attempt(1, 0, "succeeded", 2.0)]
    ranking, unranked = rank(VARIANTS, attempts, 2, {"direction": "minimize"})
    assert [(r["variant"], r["values"], r["std"]) for r in ranking] == [("a", [1.0, 3.0], 2 ** 0.5)]
    assert [(u["variant"], u["reason"], u["repeats_done"], u["values"]) for u in unranked] == [
        ("b", "incomplete", 1, [2.0])]
    _, unranked = rank(VARIANTS, attempts[:2], 2, {"direction": "minimize"})
    assert [(u["variant"], u["reason"], u["repeats_done"]) for u in unranked] == [("b", "not_run", 0)]


def _float_sweep(base, axis):
    return SubmitSweep.model_validate({"base_graph": base, "sweep_spec": {"method": "grid", "params": [axis]},
                                       "objective": {"metric": "m", "direction": "minimize"}})


def test_values_are_distinct_as_the_param_takes_them_and_a_range_that_repeats_is_refused():
    base = graph(node("a", "core.Constant", value=1))
    with pytest.raises(SweepInvalid, match="listed twice") as caught:
        compile_sweep(_float_sweep(base, {"node_id": "a", "param": "value", "values": [1, 1.0]}), CATALOG,
                      SweepLimits())
    assert caught.value.pointer == "/sweep_spec/params/0/values/1"
    with pytest.raises(SweepInvalid, match=r"gives 2\.0 twice") as caught:
        compile_sweep(_float_sweep(base, {"node_id": "a", "param": "value", "range": {"min": 2, "max": 2, "count": 3}}),
                      CATALOG, SweepLimits())
    assert caught.value.pointer == "/sweep_spec/params/0/range/count"
    # Every point fits a float, though i * width does not.
    wide = compile_sweep(_float_sweep(base, {"node_id": "a", "param": "value",
                                             "range": {"min": 0, "max": 1e308, "count": 3}}), CATALOG, SweepLimits())
    assert [v.params["a.value"] for v in wide.variants] == [0.0, 5e307, 1e308]
    linear = compile_sweep(_float_sweep(base, {"node_id": "a", "param": "value",
                                               "range": {"min": 0.1, "max": 0.7, "count": 7}}), CATALOG, SweepLimits())
    assert [v.params["a.value"] for v in linear.variants] == [0.1 + i * 0.6 / 6 for i in range(7)]


def test_a_key_that_could_name_a_param_of_two_nodes_is_refused_not_guessed():
    # "a.value.value": node a.value's value, or a name in a mapping "value" of node a.
    base = graph(node("a", "core.Constant", value=1), node("a.value", "core.Constant", value=2))
    with pytest.raises(SweepInvalid, match="rename one of the nodes") as caught:
        compile_sweep(_float_sweep(base, {"node_id": "a.value", "param": "value", "values": [3, 4]}), CATALOG,
                      SweepLimits())
    assert caught.value.pointer == "/sweep_spec/params/0/node_id"
    compiled = compile_sweep(_float_sweep(base, {"node_id": "a", "param": "value", "values": [3, 4]}), CATALOG,
                             SweepLimits())
    assert [next(n for n in v.graph["nodes"] if n["id"] == "a")["params"] for v in compiled.variants] == [
        {"value": 3.0}, {"value": 4.0}]
