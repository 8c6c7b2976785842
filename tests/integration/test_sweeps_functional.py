"""Sweeps through the real HTTP API: compile, queue, rank, cancel, outlive their runs."""

from __future__ import annotations

import pytest

from tests.helpers import edge, graph, hello, node

OBJECTIVE = {"metric": "val_loss", "direction": "minimize"}


def sweep_body(params, method="grid", objective=OBJECTIVE, base=None, **extra):
    spec = {"method": method, "params": params}
    spec.update({k: extra.pop(k) for k in ("samples", "seed") if k in extra})
    return {"base_graph": base or hello(), "name": "lr sweep", "sweep_spec": spec, "objective": objective, **extra}


def post(server, body, expect=201):
    status, reply = server.client.request("POST", "/api/sweeps", body)
    assert status == expect, reply
    return reply


def wait_finished(server, sweep_id):
    """Reads the sweep whenever a run changes (the global stream), until it is finished;
    its runs may be pruned meanwhile, so their own streams are not followed."""
    for kind, _ in server.client.stream("/api/stream", read_timeout=60):
        if kind in ("hello", "run"):
            reply = server.get(f"/api/sweeps/{sweep_id}")
            if reply["state"] == "finished":
                return reply
    raise AssertionError(f"sweep {sweep_id} never finished")


def test_a_grid_queues_every_combination_last_param_fastest_and_ranks_them(shared_server):
    reply = post(shared_server, sweep_body([
        {"node_id": "a", "param": "value", "values": [1, 2]},
        {"node_id": "b", "param": "value", "range": {"min": 1, "max": 100, "count": 3, "scale": "log"}},
    ]))
    assert reply["total_combinations"] == 6
    assert [v["params"] for v in reply["variants"]] == [
        {"a.value": a, "b.value": b} for a in (1.0, 2.0) for b in (1.0, 10.0, 100.0)]
    assert [v["index"] for v in reply["variants"]] == list(range(6))
    assert reply["params"][1]["values"] == [1.0, 10.0, 100.0]
    runs = shared_server.get(f"/api/runs?sweep_id={reply['sweep_id']}&limit=100")["runs"]
    assert len(runs) == 6 and {r["name"] for r in runs} == {"lr sweep"}
    assert sorted(r["sweep_variant"] for r in runs) == list(range(6))
    result = wait_finished(shared_server, reply["sweep_id"])
    assert result["state"] == "finished" and result["counts"] == {"succeeded": 6}
    assert [(v["rank"], v["objective_value"]) for v in result["variants"]] == [
        (1, 2.0), (2, 3.0), (3, 11.0), (4, 12.0), (5, 101.0), (6, 102.0)]
    assert result["best"]["params"] == {"a.value": 1.0, "b.value": 1.0}
    assert result["variants"][0]["final_metrics"] == {"val_loss": 2.0}
    status, text = shared_server.client.request("GET", f"/api/sweeps/{reply['sweep_id']}?format=csv")
    assert status == 200
    lines = text.splitlines()
    assert lines[0] == "index,rank,status,objective_value,a.value,b.value,run_id"
    assert lines[1].startswith("0,1,succeeded,2.0,1.0,1.0,")


def test_maximize_ranks_the_largest_first(shared_server):
    reply = post(shared_server, sweep_body([{"node_id": "a", "param": "value", "values": [5, 1, 9]}],
                                           objective={"metric": "val_loss", "direction": "maximize"}))
    result = wait_finished(shared_server, reply["sweep_id"])
    assert [v["params"]["a.value"] for v in result["variants"]] == [9.0, 5.0, 1.0]


def test_random_draws_are_seeded_and_bounded(shared_server):
    params = [{"node_id": "a", "param": "value", "values": [1, 2, 3, 4]},
              {"node_id": "b", "param": "value", "values": [1, 2, 3]}]
    first = post(shared_server, sweep_body(params, "random", samples=5, seed=42))
    again = post(shared_server, sweep_body(params, "random", samples=5, seed=42))
    other = post(shared_server, sweep_body(params, "random", samples=5, seed=43))
    draw = [v["params"] for v in first["variants"]]
    assert draw == [v["params"] for v in again["variants"]] and draw != [v["params"] for v in other["variants"]]
    assert len({tuple(p.values()) for p in draw}) == 5 and first["total_combinations"] == 5
    for run in (first, again, other):
        wait_finished(shared_server, run["sweep_id"])


@pytest.mark.parametrize("params, extra, pointer", [
    ([{"node_id": "a", "param": "value", "values": [1]}], {"samples": 2}, "/sweep_spec/samples"),
    ([{"node_id": "a", "param": "value", "values": [1, 2]}], {"method": "random", "seed": 1}, "/sweep_spec/samples"),
    ([{"node_id": "a", "param": "value", "values": [1, 2]}], {"method": "random", "samples": 2}, "/sweep_spec/seed"),
    ([{"node_id": "a", "param": "value", "values": [1, 2]}], {"method": "random", "samples": 3, "seed": 1},
     "/sweep_spec/samples"),
    ([{"node_id": "zz", "param": "value", "values": [1]}], {}, "/sweep_spec/params/0/node_id"),
    ([{"node_id": "a", "param": "nope", "values": [1]}], {}, "/sweep_spec/params/0/param"),
    ([{"node_id": "a", "param": "value", "values": [1, "x"]}], {}, "/sweep_spec/params/0/values/1"),
    ([{"node_id": "a", "param": "value", "values": [1, 1]}], {}, "/sweep_spec/params/0/values/1"),
    ([{"node_id": "a", "param": "value"}], {}, "/sweep_spec/params/0"),
    ([{"node_id": "a", "param": "value", "range": {"min": 0, "max": 1, "count": 3, "scale": "log"}}], {},
     "/sweep_spec/params/0/range/min"),
    ([{"node_id": "a", "param": "value", "range": {"min": 2, "max": 1, "count": 3}}], {},
     "/sweep_spec/params/0/range/min"),
    ([{"node_id": "a", "param": "value", "values": list(range(5))}], {}, "/sweep_spec/params/0/values"),
    ([{"node_id": "a", "param": "value", "values": [1, 2, 3]}, {"node_id": "b", "param": "value",
                                                               "values": [1, 2]}], {}, "/sweep_spec/params"),
    ([{"node_id": "a", "param": "value", "values": [1]}] * 2, {}, "/sweep_spec/params/1"),
    ([{"node_id": "a", "param": "value", "values": [1]}], {"options": {"seed": 3}}, "/options/seed"),
    ([{"node_id": "a", "param": "value", "values": [1]}], {"options": {"lane": "interactive", "editor_session": "e"}},
     "/options/lane"),
    ([{"node_id": "a", "param": "value", "values": [1, 2, 3]}], {"options": {"record_outputs": True}},
     "/options/record_outputs"),
    ([{"node_id": "a", "param": "value", "values": [1]}], {"seed_variants": True}, "/sweep_spec/seed"),
    ([{"node_id": "a", "param": "value", "values": [1]}], {"objective": {"metric": "x", "direction": "up"}},
     "/objective/direction"),
])
def test_an_unsatisfiable_sweep_is_refused_with_a_pointer_and_leaves_nothing(make_server, params, extra, pointer):
    server = make_server(TROUPE_MAX_SWEEP_RUNS="4", TROUPE_MAX_SWEEP_DOMAIN="4", TROUPE_RECORDED_OUTPUTS_KEEP="2")
    method = extra.pop("method", "grid")
    reply = post(server, sweep_body(params, method, **extra), expect=400)
    assert reply["error"]["pointer"] == pointer, reply
    assert server.get("/api/sweeps")["sweeps"] == [] and server.get("/api/runs")["runs"] == []


def test_too_many_params_are_refused(make_server):
    server = make_server(TROUPE_MAX_SWEEP_PARAMS="1")
    body = sweep_body([{"node_id": "a", "param": "value", "values": [1]},
                       {"node_id": "b", "param": "value", "values": [1]}])
    assert post(server, body, expect=400)["error"]["pointer"] == "/sweep_spec/params"


def test_int_ranges_round_to_distinct_values_and_seed_variants_wrap(shared_server):
    base = graph(node("z", "core.Sleep", seconds=0), node("c", "core.Constant", value=1),
                 node("m", "core.LogMetric", name="val_loss"),
                 edges=({"source": "c", "source_port": "value", "target": "m", "target_port": "value"},))
    reply = post(shared_server, sweep_body(
        [{"node_id": "z", "param": "seconds", "range": {"min": 0, "max": 0.02, "count": 3, "type": "int"}}],
        base=base, seed_variants=True, seed=2**32 - 1))
    assert reply["params"][0]["values"] == [0] and reply["total_combinations"] == 1
    assert reply["variants"][0]["seed"] == 2**32 - 1
    two = post(shared_server, sweep_body([{"node_id": "c", "param": "value", "values": [1, 2]}], base=base,
                                         seed_variants=True, seed=2**32 - 1))
    assert [v["seed"] for v in two["variants"]] == [2**32 - 1, 0]
    for run in (reply, two):
        done = wait_finished(shared_server, run["sweep_id"])
        assert done["state"] == "finished"


def test_no_variant_recording_the_objective_gives_a_warning_once_finished(shared_server):
    base = graph(node("c", "core.Constant", value=1), node("z", "core.Sleep", seconds=0),
                 node("m", "core.LogMetric", name="val_loss"),
                 edges=(edge("c", "value", "z", "x"), edge("z", "x", "m", "value")))
    reply = post(shared_server, sweep_body([{"node_id": "z", "param": "seconds", "values": [0, 3]}], base=base,
                                           objective={"metric": "accuracy", "direction": "maximize"}))
    quick, slow = (v["run_id"] for v in reply["variants"])
    shared_server.wait_status(quick, "succeeded")
    assert "objective_warning" not in shared_server.get(f"/api/sweeps/{reply['sweep_id']}")  # not finished yet
    result = wait_finished(shared_server, reply["sweep_id"])
    assert result["best"] is None and result["variants"][0]["rank"] is None
    warning = result["objective_warning"]
    assert f"{quick}: val_loss" in warning and f"{slow}: val_loss" in warning  # per run
    shared_server.client.request("DELETE", f"/api/runs/{quick}")  # what the sweep kept outlives its runs
    assert f"{quick}: val_loss" in shared_server.get(f"/api/sweeps/{reply['sweep_id']}")["objective_warning"]


def test_cancel_stops_active_children_and_settles_to_finished(make_server):
    server = make_server(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="1")
    base = graph(node("z", "core.Sleep", seconds=30))
    reply = post(server, sweep_body([{"node_id": "z", "param": "seconds", "values": [30, 31, 32]}], base=base))
    server.wait_status(reply["variants"][0]["run_id"], "running")
    status, cancel = server.client.request("POST", f"/api/sweeps/{reply['sweep_id']}/cancel")
    assert status == 200 and cancel["cancelled"] == 3 and cancel["already_finished"] == 0
    assert cancel["state"] == "cancelling"  # children were active when asked
    _, repeat = server.client.request("POST", f"/api/sweeps/{reply['sweep_id']}/cancel")
    assert repeat["cancelled"] == 0  # children still stopping are not counted twice
    for variant in reply["variants"]:
        server.wait_status(variant["run_id"], "cancelled")
    result = server.get(f"/api/sweeps/{reply['sweep_id']}")
    assert result["state"] == "finished" and result["counts"] == {"cancelled": 3}
    _, again = server.client.request("POST", f"/api/sweeps/{reply['sweep_id']}/cancel")
    assert again["cancelled"] == 0 and again["already_finished"] == 3 and again["state"] == "finished"
    assert len(server.get(f"/api/runs?sweep_id={reply['sweep_id']}")["runs"]) == 3  # never more


def test_results_outlive_deleted_and_pruned_runs(make_server):
    server = make_server(TROUPE_RUN_RETENTION_KEEP_LAST="2")
    reply = post(server, sweep_body([{"node_id": "a", "param": "value", "values": [1, 2, 3, 4]}]))
    result = wait_finished(server, reply["sweep_id"])
    deleted = result["variants"][-1]["run_id"]
    server.client.request("DELETE", f"/api/runs/{deleted}")
    result = server.get(f"/api/sweeps/{reply['sweep_id']}")
    missing = [v for v in result["variants"] if not v["run_exists"]]
    assert missing and all(v["status"] == "missing" for v in missing)
    assert [v["objective_value"] for v in result["variants"]] == [4.0, 5.0, 6.0, 7.0]
    assert [v["rank"] for v in result["variants"]] == [1, 2, 3, 4]


def test_unknown_sweeps_are_404(shared_server):
    for path in ("/api/sweeps/" + "0" * 32, "/api/sweeps/nothex"):
        status, reply = shared_server.client.request("GET", path)
        assert status == 404 and reply["error"]["code"] == "sweep_not_found"


def test_a_run_that_failed_after_recording_the_objective_is_still_ranked(shared_server):
    base = graph(node("c", "core.Constant", value=1), node("m", "core.LogMetric", name="val_loss"),
                 node("f", "core.Fail", message="late"),
                 edges=({"source": "c", "source_port": "value", "target": "m", "target_port": "value"},
                        {"source": "m", "source_port": "value", "target": "f", "target_port": "x"}))
    reply = post(shared_server, sweep_body([{"node_id": "c", "param": "value", "values": [2, 1]}], base=base))
    result = wait_finished(shared_server, reply["sweep_id"])
    assert result["counts"] == {"failed": 2}
    assert [(v["rank"], v["objective_value"]) for v in result["variants"]] == [(1, 1.0), (2, 2.0)]


def test_int_ranges_round_half_up_and_negative_halves_away_from_zero(shared_server):
    base = graph(node("t", "core.Ticker", count=1, interval=0, name="val_loss"))
    reply = post(shared_server, sweep_body(
        [{"node_id": "t", "param": "count", "range": {"min": 0.5, "max": 2.5, "count": 3, "type": "int"}}],
        base=base))
    assert reply["params"][0]["values"] == [1, 2, 3]  # Python's round() would give [0, 2]
    assert wait_finished(shared_server, reply["sweep_id"])["state"] == "finished"


def test_cancels_at_once_count_each_child_once(make_server):
    from concurrent.futures import ThreadPoolExecutor

    server = make_server(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="2")
    base = graph(node("z", "core.Sleep", seconds=30))
    reply = post(server, sweep_body([{"node_id": "z", "param": "seconds", "values": list(range(30, 38))}],
                                    base=base))
    path = f"/api/sweeps/{reply['sweep_id']}/cancel"
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda _: server.client.request("POST", path), range(3)))
    assert all(status == 200 for status, _ in answers)
    assert sum(answer["cancelled"] for _, answer in answers) == 8, answers
