"""The editor-session node cache: keys, sizes, eviction, copies, and the engine using it."""

from __future__ import annotations

import threading

import pytest

from tests.helpers import edge, graph, node
from troupe.protocol.graph import Graph
from troupe.subprocess_runner.catalog import NodeType, Pack, Param, Port, build_catalog, load_catalog
from troupe.subprocess_runner.context import ExecutionContext, Sinks
from troupe.subprocess_runner.engine import execute_graph, prepare_executable_graph
from troupe.subprocess_runner.node_cache import NodeCache, estimate_bytes, graph_keys, node_key, private_copy
from troupe.subprocess_runner.packs import core

CATALOG = load_catalog()


def _keys(doc, catalog=CATALOG, **context):
    context = {"device": "cpu", "seed": None, "deterministic": False, **context}
    return graph_keys(prepare_executable_graph(Graph.model_validate(doc), catalog), **context)


def _chain(a=2.0, b=3.0, name="loss"):
    return graph(node("a", "core.Constant", value=a), node("b", "core.Constant", value=b), node("s", "core.Add"),
                 node("m", "core.LogMetric", name=name),
                 edges=(edge("a", "value", "s", "a"), edge("b", "value", "s", "b"), edge("s", "sum", "m", "value")))


# Keys ---------------------------------------------------------------------------
def test_a_key_depends_on_type_params_and_upstream_but_not_on_order():
    base = node_key("core.Add", {"x": 1, "y": 2}, {"a": ("k1", "value"), "b": ("k2", "value")})
    assert base == node_key("core.Add", {"y": 2, "x": 1}, {"b": ("k2", "value"), "a": ("k1", "value")})
    assert base != node_key("core.Multiply", {"x": 1, "y": 2}, {"a": ("k1", "value"), "b": ("k2", "value")})
    assert base != node_key("core.Add", {"x": 1, "y": 3}, {"a": ("k1", "value"), "b": ("k2", "value")})
    assert base != node_key("core.Add", {"x": 1, "y": 2}, {"a": ("k3", "value"), "b": ("k2", "value")})
    assert base != node_key("core.Add", {"x": 1, "y": 2}, {"a": ("k1", "other"), "b": ("k2", "value")})
    assert base != node_key("core.Add", {"x": 1, "y": 2}, {"a": ("k2", "value"), "b": ("k1", "value")})


def test_a_change_upstream_changes_every_key_downstream_and_nothing_else():
    first, edited_root, edited_leaf = _keys(_chain()), _keys(_chain(a=5.0)), _keys(_chain(name="other"))
    assert [first[n] == edited_root[n] for n in "absm"] == [False, True, False, False]
    assert [first[n] == edited_leaf[n] for n in "absm"] == [True, True, True, False]
    assert first == _keys(_chain())


def test_the_device_and_the_seed_are_part_of_the_key():
    plain = _keys(_chain())
    assert _keys(_chain(), device="cuda:0")["a"] != plain["a"]
    seeded = _keys(_chain(), seed=7)
    assert seeded["a"] != plain["a"] and seeded == _keys(_chain(), seed=7)
    assert _keys(_chain(), seed=8)["a"] != seeded["a"]


# Sizes and eviction ------------------------------------------------------------
def test_sizes_of_plain_values_need_no_torch():
    small, big = estimate_bytes({"x": 1.0}), estimate_bytes({"x": "y" * 100_000})
    assert 0 < small < 1000 and big > 100_000
    shared = ["z" * 10_000]
    # One object counted once, however often it is referenced.
    assert estimate_bytes({"a": shared, "b": shared}) < 2 * estimate_bytes({"a": shared})


def _entry(size: int) -> dict[str, str]:
    return {"blob": "x" * size}


def test_least_recently_used_entries_go_first_across_sessions():
    one = estimate_bytes(_entry(1000))
    cache = NodeCache(int(one * 2.5))
    assert cache.put("s1", "a", _entry(1000)) and cache.put("s2", "b", _entry(1000))
    assert cache.get("s1", "a") is not None  # now b is the least recently used
    assert cache.put("s1", "c", _entry(1000))
    assert cache.get("s2", "b") is None and cache.get("s1", "a") is not None and cache.get("s1", "c") is not None
    assert cache.stats()["evictions"] == 1 and cache.stats()["entries"] == 2
    assert cache.session_stats("s1") == {"entries": 2, "bytes": 2 * one}
    assert cache.session_stats("s2") == {"entries": 0, "bytes": 0}


def test_an_output_larger_than_the_budget_is_not_cached_and_evicts_nothing():
    cache = NodeCache(estimate_bytes(_entry(1000)) * 3)
    cache.put("s", "a", _entry(1000))
    assert not cache.put("s", "huge", _entry(10_000))
    assert cache.get("s", "huge") is None and cache.get("s", "a") is not None
    assert cache.stats()["evictions"] == 0


def test_close_drops_only_its_session_and_a_disabled_cache_keeps_nothing():
    cache = NodeCache(1 << 20)
    cache.put("s1", "a", _entry(10))
    cache.put("s1", "b", _entry(10))
    cache.put("s2", "a", _entry(10))
    assert cache.close("s1") == 2 and cache.close("s1") == 0 and cache.close("never") == 0
    assert cache.get("s2", "a") is not None and cache.stats()["entries"] == 1
    assert cache.stats()["bytes"] == cache.session_stats("s2")["bytes"]
    off = NodeCache(0)
    assert not off.enabled and not off.put("s", "a", _entry(10)) and off.get("s", "a") is None


def test_a_run_that_outlives_its_sessions_close_stores_nothing_more():
    cache = NodeCache(1 << 20)
    running = cache.session("tab")  # a run of the tab, started before the tab closed
    assert running.put("a", _entry(10))
    cache.close("tab")
    assert not running.put("b", _entry(10)) and cache.session_stats("tab")["entries"] == 0
    again = cache.session("tab")  # the same name opened again: its new runs store
    assert again.put("c", _entry(10)) and not running.put("d", _entry(10))
    assert cache.session_stats("tab")["entries"] == 1


def test_the_cache_keeps_a_copy_that_later_changes_do_not_reach():
    cache = NodeCache(1 << 20)
    state = {"steps": []}
    cache.put("s", "k", {"state": state})
    state["steps"].append(1)  # a consumer changing the run's own object in place
    assert cache.get("s", "k") == {"state": {"steps": []}}


def test_concurrent_puts_keep_the_totals_right():
    cache = NodeCache(estimate_bytes(_entry(100)) * 50)

    def fill(session):
        for i in range(200):
            cache.put(session, str(i), _entry(100))
            cache.get(session, str(i // 2))

    threads = [threading.Thread(target=fill, args=(f"s{t}",)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = cache.stats()
    assert stats["entries"] <= 50 and stats["bytes"] <= cache.budget_bytes
    assert stats["bytes"] == sum(cache.session_stats(f"s{t}")["bytes"] for t in range(4))


# The engine with a cache ----------------------------------------------------------
def _run(doc, cache, catalog=CATALOG, seed=None):
    events = []
    lock = threading.Lock()

    def emit(kind, node_id, payload):
        with lock:
            events.append((kind, node_id, payload))

    ctx = ExecutionContext("r" * 32, None, "cpu", seed, Sinks(emit))
    outcome = execute_graph(prepare_executable_graph(Graph.model_validate(doc), catalog), ctx,
                            cache=cache.session("s") if cache else None)
    return outcome, events


def _finished(events):
    return {n: p for k, n, p in events if k == "node_finished"}


def test_a_second_run_reuses_what_did_not_change():
    cache = NodeCache(1 << 20)
    outcome, events = _run(_chain(), cache)
    assert outcome.status == "succeeded" and not any(p.get("cached") for p in _finished(events).values())
    outcome, events = _run(_chain(name="renamed"), cache)
    finished = _finished(events)
    assert outcome.status == "succeeded" and outcome.outputs["s"] == {"sum": 5.0}
    assert {n for n, p in finished.items() if p.get("cached")} == {"a", "b", "s"}
    assert finished["s"]["outputs"] == {"sum": 5.0} and "cached" not in finished["m"]
    started = {n: p for k, n, p in events if k == "node_started"}
    assert started["a"] == {"type": "core.Constant", "cached": True}
    # The re-run node logged its metric; the cached ones were not executed.
    assert [(n, p["name"]) for k, n, p in events if k == "metric"] == [("m", "renamed")]


def test_a_failed_node_is_never_cached():
    calls = []

    def flaky(ctx, inputs, params):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("first time fails")
        return {"x": 1.0}

    catalog = build_catalog([core.PACK, Pack("t", (NodeType("t.Flaky", flaky, outputs=(Port("x"),)),))])
    cache = NodeCache(1 << 20)
    assert _run(graph(node("f", "t.Flaky")), cache, catalog)[0].status == "failed"
    outcome, events = _run(graph(node("f", "t.Flaky")), cache, catalog)
    assert outcome.status == "succeeded" and "cached" not in _finished(events)["f"] and len(calls) == 2
    assert _finished(_run(graph(node("f", "t.Flaky")), cache, catalog)[1])["f"]["cached"] is True


class _Model:
    """Stands in for a model: a consumer changes it in place."""

    def __init__(self) -> None:
        self.trained_epochs = 0


def _training_catalog():
    def make(ctx, inputs, params):
        return {"model": _Model()}

    def train(ctx, inputs, params):
        model = inputs["model"]
        model.trained_epochs += params["epochs"]  # in place, as torch.TrainingLoop does
        return {"model": model, "seen": model.trained_epochs}

    def read(ctx, inputs, params):
        return {"epochs": inputs["model"].trained_epochs}

    types = (
        NodeType("t.Make", make, outputs=(Port("model"),)),
        NodeType("t.Train", train, inputs=(Port("model"),), outputs=(Port("model"), Port("seen")),
                 params=(Param("epochs", "int"),)),
        NodeType("t.Read", read, inputs=(Port("model"),), outputs=(Port("epochs"),),
                 params=(Param("tag", "string", default=""),)),
    )
    return build_catalog([core.PACK, Pack("t", types)])


def _training(epochs=3, tag=""):
    return graph(node("make", "t.Make"), node("train", "t.Train", epochs=epochs), node("read", "t.Read", tag=tag),
                 edges=(edge("make", "model", "train", "model"), edge("train", "model", "read", "model")))


def test_a_model_trained_in_place_downstream_stays_untrained_in_the_cache():
    catalog, cache = _training_catalog(), NodeCache(1 << 20)
    _run(_training(epochs=3), cache, catalog)
    # Only the last node changed: the trained model is reused as it was trained.
    outcome, events = _run(_training(epochs=3, tag="again"), cache, catalog)
    assert outcome.outputs["read"] == {"epochs": 3}
    assert {n for n, p in _finished(events).items() if p.get("cached")} == {"make", "train"}
    # The training changed: it starts from the untrained model, not the trained one.
    outcome, events = _run(_training(epochs=5), cache, catalog)
    assert outcome.outputs["train"]["seen"] == 5 and outcome.outputs["read"] == {"epochs": 5}
    assert {n for n, p in _finished(events).items() if p.get("cached")} == {"make"}
    # ... and doing so changed neither the cached untrained model nor the trained one.
    outcome, _ = _run(_training(epochs=2), cache, catalog)
    assert outcome.outputs["train"]["seen"] == 2
    outcome, _ = _run(_training(epochs=3, tag="third"), cache, catalog)
    assert outcome.outputs["read"] == {"epochs": 3}


def test_without_a_cache_nothing_is_cached():
    _, events = _run(_chain(), None)
    _, events = _run(_chain(), None)
    assert not any("cached" in p for p in _finished(events).values())


# torch values ---------------------------------------------------------------------
def test_torch_sizes_and_copies():
    torch = pytest.importorskip("torch")
    tensor = torch.zeros(100, 10)
    assert estimate_bytes(tensor) == 4000
    model = torch.nn.Sequential(torch.nn.Linear(10, 5), torch.nn.BatchNorm1d(5))
    params = sum(p.numel() for p in model.parameters()) * 4
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert estimate_bytes(model) == params + buffers

    class Data:  # a dataset: tensors among its attributes
        def __init__(self):
            self.x, self.y = tensor, torch.zeros(100, dtype=torch.long)

    data = Data()
    assert 4000 + 800 <= estimate_bytes({"data": data}) < 4000 + 800 + 2000
    copied = private_copy({"model": model, "same": model, "data": data})
    assert copied["model"] is not model and copied["model"] is copied["same"]
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), copied["model"].parameters(), strict=True))
    # Bulk data is shared, not duplicated; the model's weights are its own.
    assert copied["data"] is not data and copied["data"].x is tensor
    with torch.no_grad():
        copied["model"][0].weight.add_(1.0)
    assert not torch.equal(copied["model"][0].weight, model[0].weight)


def test_the_budget_setting_defaults_to_512_mib_and_0_disables(tmp_path):
    from troupe.protocol.settings import Settings

    def read(**env):
        return Settings.from_env(env, default_home=tmp_path)

    assert read().editor_cache_mb == 512 and read(TROUPE_EDITOR_CACHE_MB="0").editor_cache_mb == 0
    assert read(TROUPE_EDITOR_CACHE_MB="64").editor_cache_mb == 64
    bad = read(TROUPE_EDITOR_CACHE_MB="-1")
    assert bad.editor_cache_mb == 512 and any("TROUPE_EDITOR_CACHE_MB" in w for w in bad.warnings)
