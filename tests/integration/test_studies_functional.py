"""Studies through the real HTTP API: variants x repeats, budgets, halt and resume,
ranking, and continuing across a control-plane SIGKILL."""

from __future__ import annotations

import pytest

from tests.helpers import edge, graph, node

BASE = graph(node("c", "core.Constant", value=1), node("z", "core.Sleep", seconds=0),
             node("m", "core.LogMetric", name="val_loss"),
             edges=(edge("c", "value", "z", "x"), edge("z", "x", "m", "value")), name="base")
OBJECTIVE = {"metric": "val_loss", "direction": "minimize"}


def variants(*values, seconds=0.0):
    return [{"name": f"v{value}", "params": [{"node_id": "c", "param": "value", "value": value},
                                               {"node_id": "z", "param": "seconds", "value": seconds}]}
            for value in values]


def study_body(variant_list, repeats=2, budget=None, **extra):
    return {"name": "study", "base_graph": BASE, "variants": variant_list, "repeats": repeats,
            "objective": {**OBJECTIVE, **extra.pop("objective", {})}, "budget": budget or {}, **extra}


def post(server, body, expect=201):
    status, reply = server.client.request("POST", "/api/studies", body)
    assert status == expect, reply
    return reply


def wait_state(server, study_id, *states):
    """Reads the study whenever a run or study changes (the global stream)."""
    for kind, _ in server.client.stream("/api/stream", read_timeout=60):
        if kind in ("hello", "run"):
            study = server.get(f"/api/studies/{study_id}")
            if study["state"] in states:
                return study
    raise AssertionError("stream ended")


def test_a_study_runs_every_variant_and_repeat_and_ranks_by_the_reduced_objective(shared_server):
    study = post(shared_server, study_body(variants(3, 1, 2), repeats=2, seed=10,
                                           objective={"reduce": "median"}))
    assert study["state"] == "running" and [v["name"] for v in study["variants"]] == ["v3", "v1", "v2"]
    # Seeded attempts in the server's process run one at a time; the answer says so and how to do better.
    assert [n["code"] for n in study["notes"]] == ["seeded_runs_one_at_a_time"]
    assert "local agent" in study["notes"][0]["message"]
    done = wait_state(shared_server, study["id"], "finished")
    assert done["used"]["runs"] == 6 and {a["status"] for a in done["attempts"]} == {"succeeded"}
    assert [(r["variant"], r["rank"], r["objective_value"]) for r in done["ranking"]] == [
        ("v1", 1, 1.0), ("v2", 2, 2.0), ("v3", 3, 3.0)]
    assert done["unranked"] == []
    runs = shared_server.get("/api/runs?study_id=" + study["id"] + "&limit=100")["runs"]
    assert len(runs) == 6
    seeds = sorted(shared_server.get(f"/api/runs/{r['id']}")["seed"] for r in runs)
    assert seeds == [10, 10, 10, 11, 11, 11]  # repeat r of every variant: seed + r
    status, text = shared_server.client.request("GET", f"/api/studies/{study['id']}?format=csv")
    lines = text.splitlines()  # with each variant's params and the spread across its repeats
    assert status == 200 and lines[0] == "variant,rank,objective_value,std,repeats,unranked_reason,c.value,z.seconds"
    assert lines[1] == "v1,1,1.0,0.0,2,,1.0,0.0"
    assert study["id"] in {s["id"] for s in shared_server.get("/api/studies")["studies"]}


def test_max_parallel_runs_is_never_exceeded(make_server):
    server = make_server(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="8")
    study = post(server, study_body(variants(1, 2, 3, 4, seconds=0.3), repeats=1, budget={"max_parallel_runs": 2}))
    assert study["notes"] == []  # unseeded: they do run two at once
    most = 0
    for kind, _ in server.client.stream("/api/stream", read_timeout=60):
        if kind not in ("hello", "run"):
            continue
        current = server.get(f"/api/studies/{study['id']}")
        active = sum(1 for a in current["attempts"] if a["status"] in ("queued", "running"))
        most = max(most, active)
        if current["state"] == "finished":
            break
    assert most == 2


def test_max_runs_halts_and_resume_continues_with_what_is_owed(shared_server):
    study = post(shared_server, study_body(variants(1, 2), repeats=2, budget={"max_runs": 3}))
    halted = wait_state(shared_server, study["id"], "halted")
    assert halted["halt_reason"] == "budget_max_runs" and halted["used"]["runs"] == 3
    assert {(u["reason"], u["repeats_done"]) for u in halted["unranked"]} <= {("not_run", 0), ("incomplete", 1)}
    status, resumed = shared_server.client.request("POST", f"/api/studies/{study['id']}/resume",
                                                   {"budget": {"max_runs": 4}})
    assert status == 200 and resumed["budget"]["max_runs"] == 4 and resumed["state"] == "running"
    done = wait_state(shared_server, study["id"], "finished")
    assert done["used"]["runs"] == 4 and [r["variant"] for r in done["ranking"]] == ["v1", "v2"]


def test_a_run_past_max_run_seconds_is_stopped_as_over_budget(shared_server):
    study = post(shared_server, study_body(variants(1, seconds=30), repeats=1, budget={"max_run_seconds": 0.5}))
    done = wait_state(shared_server, study["id"], "finished")
    (attempt,) = done["attempts"]
    assert attempt["status"] == "over_budget"
    run = shared_server.get(f"/api/runs/{attempt['run_id']}")
    assert run["status"] == "cancelled" and run["error"] == "budget_run_seconds"
    assert [(u["variant"], u["reason"]) for u in done["unranked"]] == [("v1", "over_budget")]


def test_max_active_seconds_stops_children_and_halts(shared_server):
    study = post(shared_server, study_body(variants(1, seconds=30), repeats=1, budget={"max_active_seconds": 0.5}))
    halted = wait_state(shared_server, study["id"], "halted")
    assert halted["halt_reason"] == "budget_active_seconds" and halted["used"]["active_seconds"] >= 0.5
    run_id = halted["attempts"][0]["run_id"]
    shared_server.wait_status(run_id, "cancelled")


def test_cancel_stops_the_children_and_resume_of_a_cancelled_study_is_refused(shared_server):
    study = post(shared_server, study_body(variants(1, seconds=30), repeats=1))
    # Its attempt may start before the stream is open: the hello is a moment to look too.
    for kind, _ in shared_server.client.stream("/api/stream", read_timeout=30):
        if kind in ("hello", "run") and shared_server.get(f"/api/studies/{study['id']}")["attempts"]:
            break
    status, cancelled = shared_server.client.request("POST", f"/api/studies/{study['id']}/cancel")
    assert status == 200 and cancelled["state"] == "cancelled"
    shared_server.wait_status(cancelled["attempts"][0]["run_id"], "cancelled")
    status, reply = shared_server.client.request("POST", f"/api/studies/{study['id']}/resume", {})
    assert status == 409 and reply["error"]["code"] == "study_not_resumable"


def test_a_failing_repeat_leaves_its_variant_unranked(shared_server):
    failing = {"name": "bad", "params": [{"node_id": "z", "param": "seconds", "value": 0}]}
    base = graph(node("c", "core.Constant", value=1), node("z", "core.Sleep", seconds=0),
                 node("f", "core.Fail"), edges=(edge("c", "value", "z", "x"), edge("z", "x", "f", "x")))
    study = post(shared_server, {**study_body([failing], repeats=1), "base_graph": base})
    done = wait_state(shared_server, study["id"], "finished")
    assert [(u["variant"], u["reason"]) for u in done["unranked"]] == [("bad", "repeat_failed")]


@pytest.mark.parametrize("body, pointer", [
    ({"variants": [{"name": "a", "params": [{"node_id": "nope", "param": "value", "value": 1}]}]},
     "/variants/0/params/0/node_id"),
    ({"variants": [{"name": "a", "params": [{"node_id": "c", "param": "value", "value": "x"}]}]},
     "/variants/0/params/0/value"),
    ({"variants": [{"name": "a", "params": []}, {"name": "a", "params": []}]}, "/variants/1/name"),
    ({"variants": None}, "/variants"),
    ({"options": {"seed": 1}}, "/options/seed"),
    ({"budget": {"max_parallel_runs": 0}}, "/budget/max_parallel_runs"),
    ({"repeats": 0}, "/repeats"),
])
def test_an_invalid_study_is_refused_and_leaves_nothing(make_server, body, pointer):
    server = make_server()
    reply = post(server, {**study_body(variants(1)), **body}, expect=400)
    assert reply["error"]["pointer"] == pointer
    assert server.get("/api/studies")["studies"] == [] and server.get("/api/runs")["runs"] == []


def test_a_study_generated_by_a_sweep_spec(shared_server):
    body = study_body(None, repeats=1)
    body.pop("variants")
    body["sweep_spec"] = {"method": "grid", "params": [{"node_id": "c", "param": "value", "values": [5, 4]}]}
    study = post(shared_server, body)
    done = wait_state(shared_server, study["id"], "finished")
    assert [r["variant"] for r in done["ranking"]] == ["c.value=4.0", "c.value=5.0"]


def test_a_study_finishes_within_budget_across_a_sigkill(make_server, tmp_path):
    home = tmp_path / "study"
    server = make_server(home=home, TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="1")
    # One attempt in flight at a time, so the kill interrupts exactly one: 4 + 1 retry <= 6.
    study = post(server, study_body(variants(1, 2, seconds=1.0), repeats=2,
                                    budget={"max_runs": 6, "max_parallel_runs": 1}))
    for kind, data in server.client.stream("/api/stream", read_timeout=30):
        if kind == "run" and data.get("status") == "running":
            break
    server.kill()  # the running attempt's run becomes interrupted at the next start
    again = make_server(home=home)
    done = wait_state(again, study["id"], "finished")
    statuses = [a["status"] for a in done["attempts"]]
    assert statuses.count("interrupted") == 1 and statuses.count("succeeded") == 4
    assert done["used"]["runs"] <= 6 and len(done["attempts"]) == done["used"]["runs"]
    assert [r["variant"] for r in done["ranking"]] == ["v1", "v2"]


@pytest.mark.parametrize("reduce", ["mean", "median"])
def test_objective_values_near_the_largest_float_are_reduced_and_ranked(shared_server, reduce):
    # Their sum is past a float: the mean, the median and the spread are still found.
    study = post(shared_server, study_body(variants(1.7e308, 1), repeats=2, seed=3, objective={"reduce": reduce}))
    done = wait_state(shared_server, study["id"], "finished", "halted", "failed")
    assert done["state"] == "finished", done
    assert [(r["variant"], r["rank"], r["objective_value"], r["std"]) for r in done["ranking"]] == [
        ("v1", 1, 1.0, 0.0), ("v1.7e+308", 2, 1.7e308, 0.0)]
