"""Finding runs by what they were and reached (issue 64): ``GET /api/runs?where=`` through
the real server, each key kind and operator against a lab of runs whose params, node
types, series, tags, statuses and submitters are known; a malformed filter's 400 with its
offset, an unknown key's and an unknown parameter's; ``q`` through node types and param
values; ``group_by`` rows against the runs they fold; the index after retention and
after the migration of an older database."""

from __future__ import annotations

import json
import statistics
import urllib.parse
from typing import Any

import apsw
import pytest

from tests.helpers import Server, edge, graph, node

pytestmark = pytest.mark.timeout(120)


def trial(lr: float, first: float, delta: float, *, series: str = "val_loss", nap: bool = False,
          fail: bool = False) -> dict[str, Any]:
    """A run whose series gets two points, ``first`` then ``first + delta`` (newest),
    with ``adam.value`` as its learning rate."""
    nodes = [node("adam", "core.Constant", value=lr), node("first", "core.Constant", value=first),
             node("m1", "core.LogMetric", name=series), node("delta", "core.Constant", value=delta),
             node("s", "core.Add"), node("m2", "core.LogMetric", name=series)]
    edges = [edge("first", "value", "m1", "value"), edge("m1", "value", "s", "a"), edge("delta", "value", "s", "b"),
             edge("s", "sum", "m2", "value")]
    if nap:
        nodes.append(node("nap", "core.Sleep", seconds=0))
        edges.append(edge("adam", "value", "nap", "x"))
    if fail:
        nodes.append(node("boom", "core.Fail", message="asked to"))
        edges.append(edge("m2", "value", "boom", "x"))
    return graph(*nodes, edges=tuple(edges), name=f"lr {lr}")


def command(mode: str) -> dict[str, Any]:
    return graph(node("cmd", "script.Command", argv=["{python}", "-c", "pass", "{mode}"], vars={"mode": mode}),
                 name="command")


def _post(client: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
    status, reply = client.request("POST", path, body)
    assert status == 201, reply
    return dict(reply)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A server with nine runs whose every indexed fact is known, all ended."""
    server = Server(tmp_path_factory.mktemp("where")).start()
    try:
        ids = {key: server.submit(g)["run_id"] for key, g in (
            ("r1", trial(0.1, 0.9, -0.5)), ("r2", trial(0.01, 0.3, 0.5)), ("r3", trial(0.01, 0.7, -0.6, nap=True)),
            ("r5", trial(0.1, 0.5, 0.0, fail=True)), ("cmd", command("fast")))}
        ann = server.session()
        assert ann.request("PUT", "/api/sessions/me", {"name": "ann"})[0] == 200
        ids["r4"] = _post(ann, "/api/runs", {"graph": trial(0.001, 0.2, 0.05)})["run_id"]
        # A sweep whose objective says acc is maximized: acc's best is its highest.
        sweep = _post(server.client, "/api/sweeps", {
            "base_graph": trial(0.5, 0.5, 0.0, series="acc"), "name": "acc sweep",
            "objective": {"metric": "acc", "direction": "maximize"},
            "sweep_spec": {"method": "grid",
                           "params": [{"node_id": "delta", "param": "value", "values": [0.3, -0.3]}]}})
        server.poll_until(lambda: all(r["status"] in ("succeeded", "failed")
                                      for r in server.get("/api/runs?limit=100")["runs"]) and
                          len(server.get("/api/runs?limit=100")["runs"]) == 8)
        rows = server.get(f"/api/runs?sweep_id={sweep['sweep_id']}&values=true")["runs"]
        by_delta = {row["params"]["delta.value"]: row["id"] for row in rows}
        ids["up"], ids["down"] = by_delta[0.3], by_delta[-0.3]
        status, _ = server.client.request("PATCH", f"/api/runs/{ids['r3']}", {"tags": ["best", "keep"], "name": "star"})
        assert status == 200
        server.ids, server.sweep_id = ids, sweep["sweep_id"]
        yield server
    finally:
        server.kill()


def found(server: Server, where: str, **query: str) -> set[str]:
    """The lab's names of the runs a filter finds (every page read)."""
    names = {run_id: name for name, run_id in server.ids.items()}
    seen: list[str] = []
    cursor = None
    while True:
        params = {"where": where, "limit": "3", **query, **({"cursor": cursor} if cursor else {})}
        status, page = server.client.request("GET", f"/api/runs?{urllib.parse.urlencode(params)}")
        assert status == 200, (where, page)
        seen += [row["id"] for row in page["runs"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert len(seen) == len(set(seen)), where  # paged newest first, nothing twice
    return {names[run_id] for run_id in seen}


CASES = [
    # params: numbers, a quoted number, text, in, !=, ranges
    ("adam.value = 0.01", {"r2", "r3"}),
    ("adam.value = '0.01'", {"r2", "r3"}),
    ("adam.value != 0.01", {"r1", "r4", "r5", "up", "down"}),
    ("adam.value < 0.05", {"r2", "r3", "r4"}),
    ("adam.value >= 0.1", {"r1", "r5", "up", "down"}),
    ("adam.value in (0.001, 0.5)", {"r4", "up", "down"}),
    ("m1.name = 'acc'", {"up", "down"}),
    ("m1.name ~ 'VAL'", {"r1", "r2", "r3", "r4", "r5"}),
    ("m1.name > 'b'", {"r1", "r2", "r3", "r4", "r5"}),
    ("adam.value > 'a'", set()),  # a number is never text
    # a script's vars
    ("cmd.vars.mode = 'fast'", {"cmd"}),
    ("cmd.vars.mode ~ 'as'", {"cmd"}),
    # node types
    ("type = 'core.Sleep'", {"r3"}),
    ("type = 'script.Command'", {"cmd"}),
    ("type != 'core.Constant'", {"cmd"}),
    ("type ~ 'fail'", {"r5"}),
    ("type in ('core.Sleep', 'core.Fail')", {"r3", "r5"}),
    ("type = 'core.Nothing'", set()),
    # metrics: the newest value, and the best by the series' direction
    ("metric.val_loss < 0.5", {"r1", "r3", "r4"}),
    ("metric.val_loss >= 0.5", {"r2", "r5"}),
    ("metric.val_loss = 0.25", {"r4"}),
    ("metric.val_loss.best < 0.35", {"r2", "r3", "r4"}),  # r2 ended at 0.8 but was 0.3
    ("metric.val_loss.best > 0.35", {"r1", "r5"}),
    ("metric.acc > 0.6", {"up"}),
    ("metric.acc.best >= 0.5", {"up", "down"}),  # maximize: down's best is its first 0.5
    ("metric.acc.best > 0.6", {"up"}),
    # tags, status, name, submitter, sweep, created
    ("tag = 'best'", {"r3"}),
    ("tag in ('keep', 'nope')", {"r3"}),
    ("tag != 'best'", {"r1", "r2", "r4", "r5", "cmd", "up", "down"}),
    ("tag ~ 'KE'", {"r3"}),
    ("status = 'failed'", {"r5"}),
    ("status != 'succeeded'", {"r5"}),
    ("status in ('failed', 'cancelled')", {"r5"}),
    ("name = 'star'", {"r3"}),
    ("name ~ 'lr 0.1'", {"r1", "r5"}),
    ("by = 'ann'", {"r4"}),
    ("by = 'server'", {"r1", "r2", "r3", "r5", "cmd", "up", "down"}),
    ("by != 'ann'", {"r1", "r2", "r3", "r5", "cmd", "up", "down"}),
    ("by ~ 'AN'", {"r4"}),
    ("sweep = 'acc sweep'", {"up", "down"}),
    ("created < '2000-01-01'", set()),
    ("created >= '2000-01-01T00:00:00Z' and status = 'failed'", {"r5"}),
    # and, or, parentheses (and binds tighter)
    ("adam.value = 0.01 and metric.val_loss < 0.5", {"r3"}),
    ("adam.value = 0.01 or metric.val_loss < 0.3", {"r2", "r3", "r4"}),
    ("type = 'core.Sleep' or adam.value = 0.1 and metric.val_loss > 0.5", {"r3"}),
    ("(type = 'core.Sleep' or adam.value = 0.1) and metric.val_loss > 0.5", set()),
    ("(type = 'core.Fail' or adam.value = 0.01) AND metric.val_loss < 0.5", {"r3"}),
    ("status = 'succeeded' and (by = 'ann' or tag = 'best') and adam.value < 1", {"r3", "r4"}),
]


@pytest.mark.parametrize(("where", "expected"), CASES, ids=[c[0] for c in CASES])
def test_each_key_kind_and_operator_finds_exactly_its_runs(lab, where, expected):
    assert found(lab, where) == expected


def test_where_holds_with_the_other_filters_and_sweep_runs_name_their_sweep_by_id(lab):
    assert found(lab, "metric.val_loss < 0.5", status="succeeded") == {"r1", "r3", "r4"}
    assert found(lab, "adam.value < 1", q="star") == {"r3"}
    assert found(lab, f"sweep = '{lab.sweep_id}'") == {"up", "down"}
    # a day is the whole day: every run was created on the day the first one was
    day = lab.get(f"/api/runs/{lab.ids['r1']}")["created_at"][:10]
    assert found(lab, f"created = '{day}' and status = 'failed'") == {"r5"}
    grouped = lab.get("/api/runs?grouped=true&" + urllib.parse.urlencode({"where": "metric.acc > 0.6"}))["runs"]
    assert [row.get("kind") for row in grouped] == ["sweep"] and grouped[0]["runs"] == 1


BAD = [
    ("adam.value = ", 13, "a number"),
    ("adam.value == 1", 12, "a number"),
    ("(adam.value = 1", 15, ")"),
    ("adam.value = 1 and", 18, "a key (NODE.PARAM, metric.SERIES, type, status, tag, name, by, sweep, study, created)"),
    ("adam.value = 1 adam.value = 2", 15, "and"),
    ("status = failed", 9, "a quoted text"),
    ("status = 'runing'", 9, "running"),
    ("metric.val_loss < 'low'", 18, "a number"),
    ("created > 'yesterday'", 10, "an ISO date or time ('2026-01-05', '2026-01-05T10:30:00Z')"),
    ("adam.value in 1", 14, "( after in"),
    ("name = 'open", 7, "a closing '"),
]


@pytest.mark.parametrize(("where", "offset", "expected"), BAD, ids=[b[0] for b in BAD])
def test_a_malformed_filter_is_a_400_with_the_offset_of_its_fault(lab, where, offset, expected):
    status, reply = lab.client.request("GET", "/api/runs?" + urllib.parse.urlencode({"where": where}))
    error = reply["error"]
    assert (status, error["code"], error["pointer"], error["offset"]) == (400, "where_invalid", "?where", offset)
    assert expected in error["expected"], error


def test_an_unknown_key_or_parameter_is_a_400_naming_it(lab):
    for where, key, offset in (("adam.valu = 1", "adam.valu", 0), ("status = 'failed' and metric.loss < 1",
                                                                  "metric.loss", 22), ("lr = 0.1", "lr", 0)):
        status, reply = lab.client.request("GET", "/api/runs?" + urllib.parse.urlencode({"where": where}))
        assert (status, reply["error"]["code"], reply["error"]["key"], reply["error"]["offset"]) == (
            400, "where_unknown_key", key, offset), reply
        assert key in reply["error"]["message"]
    status, reply = lab.client.request("GET", "/api/runs?wehre=adam.value%3D1")
    assert (status, reply["error"]["code"], reply["error"]["pointer"]) == (400, "unknown_parameter", "?wehre")
    assert "where" in reply["error"]["message"]
    status, reply = lab.client.request("GET", "/api/runs?group_by=adam.nope")
    assert (status, reply["error"]["code"], reply["error"]["pointer"]) == (400, "where_unknown_key", "?group_by")
    status, reply = lab.client.request("GET", "/api/runs?group_by=metric.val_loss")
    assert (status, reply["error"]["code"]) == (400, "where_invalid")
    status, reply = lab.client.request("GET", "/api/runs?metric=val_loss")
    assert (status, reply["error"]["pointer"]) == (400, "?metric")
    status, reply = lab.client.request("GET", "/api/runs/keys?x=1")
    assert (status, reply["error"]["code"]) == (400, "unknown_parameter")


def test_search_matches_node_types_and_param_values_again(lab):
    def searched(text: str) -> set[str]:
        names = {run_id: name for name, run_id in lab.ids.items()}
        rows = lab.get("/api/runs?" + urllib.parse.urlencode({"q": text, "limit": "100"}))["runs"]
        return {names[row["id"]] for row in rows}

    assert searched("core.sleep") == {"r3"}  # a node type, any case
    assert searched("script.Command") == {"cmd"}
    assert searched("fast") == {"cmd"}  # a var's value
    assert searched("0.05") == {"r4"}  # a number param's value (its delta)
    assert searched("val_loss") == {"r1", "r2", "r3", "r4", "r5"}  # a text param's value


def _newest(lab: Server, run_id: str, series: str) -> float | None:
    points = lab.get(f"/api/runs/{run_id}/metrics")["series"].get(series)
    return points[-1]["value"] if points else None


def test_group_by_rows_match_the_runs_they_fold(lab):
    reply = lab.get("/api/runs?group_by=adam.value&metric=val_loss")
    rows = lab.get("/api/runs?values=true&limit=100")["runs"]
    expected: dict[Any, list[str]] = {}
    for row in rows:
        expected.setdefault(row["params"].get("adam.value"), []).append(row["id"])
    assert [g["value"] for g in reply["groups"]] == [0.001, 0.01, 0.1, 0.5, None]  # by value, null last
    for group in reply["groups"]:
        members = expected[group["value"]]
        values = [v for v in (_newest(lab, run_id, "val_loss") for run_id in members) if v is not None]
        stats = group["metric"]
        assert (group["runs"], stats["series"], stats["runs"]) == (len(members), "val_loss", len(values))
        if values:
            assert stats["mean"] == pytest.approx(statistics.mean(values))
            assert (stats["min"], stats["max"]) == (pytest.approx(min(values)), pytest.approx(max(values)))
        assert stats["std"] == (pytest.approx(statistics.stdev(values)) if len(values) > 1 else None)
    # within the filters; a key a run holds several of puts it in each row
    types = lab.get("/api/runs?" + urllib.parse.urlencode({"group_by": "type", "where": "adam.value = 0.01"}))
    assert {g["value"]: g["runs"] for g in types["groups"]} == {
        "core.Add": 2, "core.Constant": 2, "core.LogMetric": 2, "core.Sleep": 1}
    status = lab.get("/api/runs?group_by=status&metric=val_loss&status=failed,succeeded")["groups"]
    assert [(g["value"], g["runs"], g["metric"]["runs"]) for g in status] == [("failed", 1, 1), ("succeeded", 7, 4)]
    who = lab.get("/api/runs?group_by=by")["groups"]
    assert sorted((g.get("label"), g["runs"]) for g in who) == [("ann", 1), ("server token", 7)]
    sweeps = lab.get("/api/runs?group_by=sweep&limit=1")
    assert [(g["value"], g["label"], g["runs"]) for g in sweeps["groups"]] == [(lab.sweep_id, "acc sweep", 2)]
    rest = lab.get(f"/api/runs?group_by=sweep&limit=1&cursor={sweeps['next_cursor']}")
    assert [(g["value"], g["runs"]) for g in rest["groups"]] == [(None, 6)] and rest["next_cursor"] is None


def test_the_keys_that_exist_are_listed_with_counts(lab):
    reply = lab.get("/api/runs/keys")
    keys = {k["key"]: k for k in reply["keys"]}
    assert {name for name, k in keys.items() if k["kind"] == "fixed"} == {
        "type", "status", "tag", "name", "by", "sweep", "study", "created"}
    assert (keys["adam.value"]["kind"], keys["adam.value"]["runs"]) == ("param", 7)
    assert (keys["cmd.vars.mode"]["kind"], keys["cmd.vars.mode"]["runs"]) == ("var", 1)
    assert (keys["metric.val_loss"]["runs"], keys["metric.val_loss.best"]["direction"]) == (5, "minimize")
    assert (keys["metric.acc"]["runs"], keys["metric.acc.best"]["direction"]) == (2, "maximize")
    assert {t["name"]: t["runs"] for t in reply["types"]}["core.Sleep"] == 1


def test_retention_and_delete_take_a_runs_index_rows(make_server):
    server = make_server(TROUPE_RUN_RETENTION_KEEP_LAST="2")
    ids = []
    for lr in (0.1, 0.2, 0.3):  # each followed to its end before the next (the first is pruned at the third's)
        ids.append(server.submit(trial(lr, 0.5, 0.0))["run_id"])
        server.events_until_finished(ids[-1])
    server.poll_until(lambda: len(server.get("/api/runs")["runs"]) == 2)
    keys = {k["key"]: k["runs"] for k in server.get("/api/runs/keys")["keys"]}
    assert (keys["adam.value"], keys["metric.val_loss"], keys["status"]) == (2, 2, 2)  # a fixed key: every run
    assert server.get("/api/runs?where=adam.value%20%3D%200.1")["runs"] == []
    assert server.client.request("DELETE", f"/api/runs/{ids[1]}")[0] == 200
    keys = {k["key"]: k["runs"] for k in server.get("/api/runs/keys")["keys"]}
    assert (keys["adam.value"], keys["metric.val_loss"], keys["status"]) == (1, 1, 1)
    assert [r["id"] for r in server.get("/api/runs?where=adam.value%20%3E%200")["runs"]] == [ids[2]]


def _old_database(path: Any) -> None:
    """A database as schema 22 left it (before the run index): three ended runs, one of
    them a sweep's over a shared base graph, their points, and the sweep's objective."""
    from troupe.actors.store.schema import MIGRATIONS

    conn = apsw.Connection(str(path))
    for step in MIGRATIONS[:22]:
        assert isinstance(step, str)
        conn.execute(step)
    conn.execute("PRAGMA user_version=22")
    runs = [("a" * 32, 1, trial(0.01, 0.9, -0.8, nap=True), None, None),
            ("b" * 32, 2, trial(0.1, 0.9, 0.0), None, None),
            ("c" * 32, 3, {"adam.value": 0.3}, "base", "s" * 32)]
    conn.execute("INSERT INTO graph_bases(digest, graph) VALUES ('base', ?)",
                 (json.dumps(trial(0.5, 0.2, 0.1, series="acc")),))
    conn.execute("INSERT INTO sweeps(id, name, state, spec, objective, domains, total, created_at) VALUES "
                 "(?, 'old', 'finished', '{}', ?, '{}', 1, '2026-01-01T00:00:00.000000Z')",
                 ("s" * 32, json.dumps({"metric": "acc", "direction": "maximize"})))
    for run_id, seq, doc, base, sweep in runs:
        conn.execute("INSERT INTO runs(id, name, status, device, queue_key, lane, graph, options, enqueue_seq, "
                     "created_at, graph_base, sweep_id) VALUES (?, 'old', 'succeeded', 'cpu', 'cpu', 'queued', ?, "
                     "'{}', ?, '2026-01-01T00:00:00.000000Z', ?, ?)", (run_id, json.dumps(doc), seq, base, sweep))
    points = [("a" * 32, "val_loss", 0.9), ("a" * 32, "val_loss", 0.1), ("b" * 32, "val_loss", 0.9),
              ("b" * 32, "val_loss", 0.9), ("c" * 32, "acc", 0.2), ("c" * 32, "acc", 0.3 - 0.25)]
    conn.executemany("INSERT INTO metrics(run_id, series, step, value, ts, seq) VALUES (?, ?, ?, ?, 't', ?)",
                     [(run_id, series, k, value, k) for k, (run_id, series, value) in enumerate(points)])
    conn.close()


def test_an_older_database_is_indexed_by_its_migration(make_server, tmp_path):
    home = tmp_path / "old"
    home.mkdir()
    _old_database(home / "troupe.db")
    server = make_server(home)
    where = urllib.parse.urlencode({"where": "metric.val_loss < 0.5 and type = 'core.Sleep' and adam.value = 0.01"})
    assert [r["id"] for r in server.get(f"/api/runs?{where}")["runs"]] == ["a" * 32]
    assert [r["id"] for r in server.get("/api/runs?q=core.sleep")["runs"]] == ["a" * 32]
    # a sweep's run: its params over the base, its series' best by the sweep's objective
    where = urllib.parse.urlencode({"where": "adam.value = 0.3 and first.value = 0.2 and metric.acc.best > 0.1"})
    assert [r["id"] for r in server.get(f"/api/runs?{where}")["runs"]] == ["c" * 32]
    keys = {k["key"]: k for k in server.get("/api/runs/keys")["keys"]}
    assert (keys["metric.val_loss.best"]["runs"], keys["metric.acc.best"]["direction"]) == (2, "maximize")


def test_the_cli_finds_groups_and_lists_keys_and_says_a_bad_filter_with_exit_2(lab):
    from tests.integration.test_cli_functional import cli

    names = {run_id: name for name, run_id in lab.ids.items()}
    result = cli(lab, "ls", "--where", "adam.value = 0.01 and metric.val_loss.best < 0.5", "-q")
    assert result.returncode == 0, result.stderr
    assert {names[line] for line in result.stdout.split()} == {"r2", "r3"}
    result = cli(lab, "ls", "--where", "adam.value = ")  # said before the server is asked
    assert result.returncode == 2 and "offset 13" in result.stderr, result.stderr
    result = cli(lab, "ls", "--where", "adam.valu = 1")
    assert result.returncode == 2 and "unknown key adam.valu" in result.stderr, result.stderr
    result = cli(lab, "ls", "--group-by", "adam.value", "--metric", "val_loss", "--where", "status = 'succeeded'")
    assert result.returncode == 0, result.stderr
    lines = [line.split() for line in result.stdout.splitlines()]
    assert lines[0] == ["ADAM.VALUE", "RUNS", "VAL_LOSS", "RUNS", "MEAN", "MIN", "MAX", "STD"]
    assert lines[1][:2] == ["0.001", "1"] and lines[2][:6] == ["0.01", "2", "2", "0.45", "0.1", "0.8"]
    assert lines[-1][:3] == ["(none)", "1", "0"]  # the command: no adam, no val_loss
    result = cli(lab, "ls", "--group-by", "adam.nope")
    assert result.returncode == 2 and "adam.nope" in result.stderr, result.stderr
    result = cli(lab, "ls", "--metric", "val_loss")
    assert result.returncode == 2, result.stderr
    result = cli(lab, "ls", "--keys")
    assert result.returncode == 0 and any(line.split()[:3] == ["cmd.vars.mode", "var", "1"]
                                          for line in result.stdout.splitlines()), result.stdout


def test_the_python_client_finds_runs_and_groups_them_in_a_frame(lab):
    import troupe

    names = {run_id: name for name, run_id in lab.ids.items()}
    with troupe.Client(lab.url, token=lab.token) as client:
        assert {names[r.id] for r in client.runs(where="type = 'core.Sleep' or by = 'ann'")} == {"r3", "r4"}
        assert {names[r.id] for r in client.runs(where="metric.val_loss < 1", limit=2)} == {"r4", "r5"}
        frame = client.runs_frame(where="metric.val_loss < 0.5")
        assert sorted(frame["adam.value"]) == [0.001, 0.01, 0.1]
        table = client.runs_frame(group_by="adam.value", metric="val_loss", status="succeeded")
        assert list(table.columns) == ["adam.value", "runs", "metric.val_loss.runs", "metric.val_loss.mean",
                                       "metric.val_loss.min", "metric.val_loss.max", "metric.val_loss.std"]
        row = table[table["adam.value"] == 0.01].iloc[0]
        assert (row["runs"], row["metric.val_loss.mean"]) == (2, pytest.approx(0.45))
        who = client.runs_frame(group_by="by")
        assert sorted(who["label"]) == ["ann", "server token"]
        assert {k["key"] for k in client.run_keys()["keys"]} >= {"adam.value", "metric.acc.best"}
        with pytest.raises(troupe.ApiError) as refused:
            client.runs(where="adam.value = ")
        assert (refused.value.code, refused.value.details["offset"]) == ("where_invalid", 13)
        with pytest.raises(troupe.ApiError) as refused:
            client.runs(where="metric.nope > 1")
        assert (refused.value.code, refused.value.details["key"]) == ("where_unknown_key", "metric.nope")


def test_a_secret_param_is_no_key_and_never_searched(make_server, tmp_path):
    from tests.integration.test_find_runs_functional import SECRET_PACK

    home = tmp_path / "home"
    (home / "packs").mkdir(parents=True)
    (home / "packs" / "labkeys.py").write_text(SECRET_PACK)
    server = make_server(home=home)
    run_id = server.submit(graph(node("f", "labkeys.Fetch", api_key="sk-PRIVATE", url="https://lab")))["run_id"]
    server.events_until_finished(run_id)
    assert [r["id"] for r in server.get("/api/runs?where=f.url%20~%20'lab'")["runs"]] == [run_id]
    status, reply = server.client.request("GET", "/api/runs?where=f.api_key%20~%20'sk'")
    assert (status, reply["error"]["code"]) == (400, "where_unknown_key")
    assert server.get("/api/runs?q=PRIVATE")["runs"] == []
    assert "f.api_key" not in {k["key"] for k in server.get("/api/runs/keys")["keys"]}
