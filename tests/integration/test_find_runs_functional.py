"""Finding runs (issue 29): a run's name, tags and note (``PATCH /api/runs/{id}``), the
list filtered by tag and searched through them, and the list grouped by sweep and study
(``?grouped=true``), paged on the server."""

from __future__ import annotations

from tests.helpers import edge, graph, hello, node
from tests.integration.test_studies_functional import study_body, variants, wait_state
from tests.integration.test_sweeps_functional import sweep_body


def test_a_run_is_renamed_tagged_and_noted_and_found_by_them(make_server):
    server = make_server()
    first, second = (server.submit(hello())["run_id"] for _ in range(2))
    server.events_until_finished(second)
    status, edited = server.client.request("PATCH", f"/api/runs/{first}", {
        "name": "baseline", "tags": ["lr:0.01", "keep", "keep"], "note": "the one to beat"})
    assert status == 200 and (edited["name"], edited["tags"], edited["note"]) == (
        "baseline", ["keep", "lr:0.01"], "the one to beat")
    assert [r["id"] for r in server.get("/api/runs?tag=keep")["runs"]] == [first]
    assert [r["id"] for r in server.get("/api/runs?q=to%20beat")["runs"]] == [first]  # the note
    assert [r["id"] for r in server.get("/api/runs?q=lr:0.0")["runs"]] == [first]  # a tag
    # A field left out stays; tags replace the set; null clears.
    status, edited = server.client.request("PATCH", f"/api/runs/{first}", {"tags": ["best"], "note": None})
    assert (edited["name"], edited["tags"], edited["note"]) == ("baseline", ["best"], None)
    assert server.get("/api/runs?tag=keep")["runs"] == []
    for body, pointer in (({}, ""), ({"tags": ["no spaces"]}, "/tags/0"), ({"tags": ["x"] * 21}, "/tags"),
                          ({"name": ""}, "/name"), ({"colour": "red"}, "/colour")):
        status, reply = server.client.request("PATCH", f"/api/runs/{first}", body)
        assert status == 400 and reply["error"]["pointer"] == pointer, (body, status, reply)
    assert server.client.request("PATCH", f"/api/runs/{'0' * 32}", {"name": "x"})[0] == 404
    assert server.anonymous.request("PATCH", f"/api/runs/{first}", {"name": "x"})[0] == 401
    status, reply = server.client.request("GET", "/api/runs?tag=bad%20tag")
    assert (status, reply["error"]["pointer"]) == (400, "?tag")
    status, reply = server.client.request("GET", f"/api/runs?q={'x' * 201}")  # past the documented bound
    assert (status, reply["error"]["pointer"]) == (400, "?q")
    status, reply = server.client.request("GET", "/api/runs/x/stream?after=1&after=2")
    assert (status, reply["error"]["pointer"]) == (400, "?after")
    # What people added survives a restart.
    server.stop()
    server = make_server(server.home)
    row = server.get(f"/api/runs/{first}")
    assert (row["name"], row["tags"]) == ("baseline", ["best"])


def test_the_list_folds_each_sweep_and_study_into_one_row_paged_on_the_server(make_server):
    server = make_server(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="4")
    alone = server.submit(hello())["run_id"]
    status, sweep = server.client.request("POST", "/api/sweeps", sweep_body(
        [{"node_id": "a", "param": "value", "values": [3, 1, 2]}]))
    assert status == 201
    status, study = server.client.request("POST", "/api/studies", study_body(variants(1, 2), repeats=1))
    assert status == 201
    wait_state(server, study["id"], "finished")
    last = server.submit(hello())["run_id"]
    server.poll_until(lambda: all(r["status"] == "succeeded" for r in server.get("/api/runs?limit=100")["runs"]))

    items = server.get("/api/runs?grouped=true")["runs"]
    assert [i.get("kind", "run") for i in items] == ["run", "study", "sweep", "run"]  # newest first
    assert (items[0]["id"], items[3]["id"]) == (last, alone)
    folded = items[2]
    assert (folded["id"], folded["runs"], folded["counts"]) == (sweep["sweep_id"], 3, {"succeeded": 3})
    assert folded["best"]["value"] == 4.0 and folded["name"] == "lr sweep"  # a=1 plus b=3: the least
    assert (items[1]["id"], items[1]["runs"]) == (study["id"], 2)
    # Paged on the server: two pages of two, nothing twice.
    page = server.get("/api/runs?grouped=true&limit=2")
    rest = server.get(f"/api/runs?grouped=true&limit=2&cursor={page['next_cursor']}")
    assert [i["id"] for i in page["runs"] + rest["runs"]] == [i["id"] for i in items] and rest["next_cursor"] is None
    # The filters apply to the runs inside; a group's own runs come from the plain list.
    assert [i.get("kind", "run") for i in server.get("/api/runs?grouped=true&q=lr%20sweep")["runs"]] == ["sweep"]
    assert len(server.get(f"/api/runs?sweep_id={sweep['sweep_id']}&grouped=true")["runs"]) == 3
    # ?values=true: each of a sweep's runs with its own variant's params over the base they
    # share, whichever way the list is read (newest first, by a metric, grouped).
    for query in ("", "&sort=-val_loss", "&grouped=true"):
        rows = server.get(f"/api/runs?sweep_id={sweep['sweep_id']}&values=true{query}")["runs"]
        assert sorted(r["params"]["a.value"] for r in rows) == [1, 2, 3], query
        assert all(r["params"]["b.value"] == 3 for r in rows), query
    assert "graph" not in server.get("/api/runs")["runs"][0]
    status, reply = server.client.request("GET", "/api/runs?grouped=yes")
    assert (status, reply["error"]["pointer"]) == (400, "?grouped")


def test_values_carry_each_runs_params_and_newest_metric_values_for_picked_columns(make_server):
    server = make_server()
    ran = []
    for value in (2, 5):
        run = graph(node("c", "core.Constant", value=value), node("m", "core.LogMetric", name="val_loss"),
                    node("n", "core.LogMetric", name="accuracy"),
                    edges=(edge("c", "value", "m", "value"), edge("c", "value", "n", "value")))
        ran.append(server.submit(run)["run_id"])
    server.events_until_finished(ran[-1])
    server.wait_status(ran[0], "succeeded")
    rows = {r["id"]: r for r in server.get("/api/runs?values=true")["runs"]}
    for run_id, value in zip(ran, (2, 5), strict=True):
        assert rows[run_id]["params"]["c.value"] == value
        assert rows[run_id]["params"]["m.name"] == "val_loss"
        assert rows[run_id]["metrics"] == {"accuracy": value, "val_loss": value}
    # Grouped, the run rows carry them too; without the flag the rows stay lean.
    grouped = server.get("/api/runs?grouped=true&values=true")["runs"]
    assert all("metrics" in r and r["params"]["c.value"] in (2, 5) for r in grouped if "kind" not in r)
    assert "metrics" not in server.get("/api/runs")["runs"][0]
    status, reply = server.client.request("GET", "/api/runs?values=yes")
    assert (status, reply["error"]["pointer"]) == (400, "?values")


def test_a_bad_sort_is_refused_on_a_grouped_list_too(shared_server):
    for query in ("sort=%25%25bad%25%25", "grouped=true&sort=%25%25bad%25%25"):
        status, reply = shared_server.client.request("GET", f"/api/runs?{query}")
        assert (status, reply["error"]["pointer"]) == (400, "?sort"), reply


SECRET_PACK = '''"""A lab node with a secret param (an API key)."""
from troupe.subprocess_runner.catalog import NodeType, Pack, Param

__version__ = "1"


def _fetch(ctx, inputs, params):
    return {}


PACK = Pack("labkeys", (NodeType(type="labkeys.Fetch", execute=_fetch, description="Fetches with a key.",
                                 params=(Param("api_key", "secret", default=""),
                                         Param("url", "string", default="u"))),))
'''


def test_a_secret_param_is_never_a_column(make_server, tmp_path):
    home = tmp_path / "home"
    (home / "packs").mkdir(parents=True)
    (home / "packs" / "labkeys.py").write_text(SECRET_PACK)
    server = make_server(home=home)
    run_id = server.submit(graph(node("f", "labkeys.Fetch", api_key="sk-PRIVATE", url="https://lab")))["run_id"]
    server.events_until_finished(run_id)
    row = next(r for r in server.get("/api/runs?values=true")["runs"] if r["id"] == run_id)
    assert row["params"] == {"f.url": "https://lab"}, row["params"]


def test_values_are_the_run_index_s_as_the_runs_were_given(make_server):
    """``?values=true`` reads the run index, never a graph: a boolean comes back true or
    false (the index holds 0 or 1), a script's vars as ``node.vars.NAME``, a mapping's
    entries as ``node.param.NAME``, a text past 120 characters left out, a diverged
    series' newest value as its text; the same grouped, sorted, filtered and after a
    restart."""
    from tests.integration.test_hardening_functional import diverging

    server = make_server()
    command = graph(node("cmd", "script.Command", argv=["{python}", "-c", "pass", "{mode}", "{on}", "{n}", "{long}"],
                         vars={"mode": "fast", "on": True, "n": 1, "long": "x" * 121}, env={"LAB": "a"},
                         warm=False, timeout_s=0.0), name="command")
    ran = server.submit(command)["run_id"]
    diverged = server.submit(diverging())["run_id"]
    server.wait_status(ran, "succeeded")
    server.wait_status(diverged, "succeeded")
    expected = {"cmd.vars.mode": "fast", "cmd.vars.on": True, "cmd.vars.n": 1, "cmd.env.LAB": "a", "cmd.warm": False,
                "cmd.timeout_s": 0.0}

    def check() -> None:
        for query in ("values=true", "values=true&grouped=true", "values=true&sort=-val_loss",
                      "values=true&where=cmd.vars.mode%20%3D%20%27fast%27"):
            rows = {r["id"]: r for r in server.get(f"/api/runs?{query}")["runs"]}
            params = rows[ran]["params"]
            assert {k: params.get(k) for k in expected} == expected, (query, params)
            assert (params["cmd.vars.on"] is True, params["cmd.warm"] is False, params["cmd.vars.n"] is True) == (
                True, True, False), (query, params)  # true and false, not 1 and 0 (and 1 stays 1)
            assert "cmd.vars.long" not in params and not any(k.startswith("cmd.argv") for k in params), query
            if "where" not in query:
                assert rows[diverged]["metrics"] == {"train_loss": "nan", "val_loss": "inf"}, query
                assert rows[diverged]["params"]["a.value"] == 1e308, query

    check()
    server.stop()
    server = make_server(server.home)
    check()
