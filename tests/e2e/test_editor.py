"""The graph editor in a real browser: build from the palette, connect, run on the
interactive lane, see node states, and queue with the "Queue on..." dialog."""

from __future__ import annotations

import json
import re

import pytest

from tests.e2e.conftest import MISSING, REASON
from tests.helpers import sleeper

pytestmark = pytest.mark.skipif(MISSING, reason=REASON)
expect = pytest.importorskip("playwright.sync_api", reason=REASON).expect


def add(tab, node_type: str) -> None:
    tab.locator(f'button[data-palette="{node_type}"]').click()


def connect(tab, source: str, target: str) -> None:
    tab.locator(f'circle[data-port="out:{source}"]').drag_to(tab.locator(f'circle[data-port="in:{target}"]'))


def set_param(tab, node: str, param: str, value: str) -> None:
    tab.locator(f'g[data-node="{node}"] text.title').click()
    expect(tab.locator("#inspector h3").first).to_have_text(node)  # the form now is this node's
    field = tab.locator(f'#inspector [data-param="{param}"]')
    field.fill(value)


def expect_state(tab, node: str, state: str) -> None:
    # A run's first node imports its pack: on a loaded 2-core CI machine that can take
    # longer than the 5 s a locator waits by default.
    expect(tab.locator(f'g[data-node="{node}"]')).to_have_class(re.compile(rf"\b{state}\b"), timeout=20_000)


def test_build_a_graph_from_the_palette_run_it_and_see_node_states(open_page):
    server, tab, errors = open_page(view="#/editor")
    tab.get_by_role("button", name="New").click()
    tab.locator("#palette-search").fill("const")
    expect(tab.locator("#palette-groups button")).to_have_count(1)  # the palette is searchable
    add(tab, "core.Constant")
    tab.locator("#palette-search").fill("")
    for node_type in ("core.Constant", "core.Add", "core.LogMetric", "eval.Texts"):
        add(tab, node_type)
    set_param(tab, "constant1", "value", "2")
    set_param(tab, "constant2", "value", "3")
    set_param(tab, "logmetric1", "name", "val_loss")
    expect(tab.locator("#inspector")).to_contain_text("name (string)")  # a form from the param schema
    expect(tab.locator('[data-params="constant1"]')).to_have_text("value=2")  # its key params on its card

    connect(tab, "texts1:texts", "add1:a")  # texts into a float input: refused, visibly
    expect(tab.locator("#editor-status")).to_contain_text("types differ")
    expect(tab.locator("#edges path.edge")).to_have_count(0)
    connect(tab, "constant1:value", "add1:a")
    connect(tab, "constant2:value", "add1:b")
    connect(tab, "add1:sum", "logmetric1:value")
    expect(tab.locator("#edges path.edge")).to_have_count(3)
    tab.locator('g[data-node="texts1"] text.title').click()
    tab.locator("#inspector").get_by_role("button", name="Delete node").click()
    expect(tab.locator('g[data-node="texts1"]')).to_have_count(0)

    tab.get_by_role("button", name="Run", exact=True).click()
    for node in ("constant1", "constant2", "add1", "logmetric1"):
        expect_state(tab, node, "done")
    expect(tab.locator("#editor-status")).to_contain_text("run succeeded")
    runs = server.get("/api/runs")["runs"]
    assert [(r["lane"], r["status"], r["final_loss"]) for r in runs] == [("interactive", "succeeded", 5.0)]
    log = tab.locator("#exec-log-lines")  # the run's events under the canvas, a line each
    expect(log).to_contain_text("val_loss = 5, step")
    expect(log).to_contain_text("run_finished")
    assert tab.locator("#results").is_hidden()  # the editor is a view of its own
    before = tab.locator("#viewport").get_attribute("transform")
    tab.get_by_role("button", name="Fit", exact=True).click()  # every node in view
    expect(tab.locator("#viewport")).not_to_have_attribute("transform", before or "")
    tab.locator('g[data-node="add1"] text.title').click()
    expect(tab.locator("#node-outputs")).to_contain_text('"sum": 5')  # the inspector shows recorded outputs
    tab.get_by_role("button", name="Tidy").click()

    # Only the last node changed: the second Run takes the others from the editor-session cache.
    set_param(tab, "logmetric1", "name", "train_loss")
    tab.get_by_role("button", name="Run", exact=True).click()
    expect_state(tab, "logmetric1", "done")
    for node in ("constant1", "constant2", "add1"):
        expect_state(tab, node, "cached")
    expect(tab.locator('text[data-state="add1"]')).to_have_text("cached")
    assert errors == []


def test_run_is_disabled_while_active_and_a_full_lane_is_said(open_page):
    server, tab, errors = open_page(view="#/editor", TROUPE_RUN_INTERACTIVE_MAX_CONCURRENT="1")
    blocker = server.submit(sleeper(seconds=60), lane="interactive", editor_session="someone-else")["run_id"]
    server.wait_status(blocker, "running")
    run = tab.get_by_role("button", name="Run", exact=True)
    run.click()
    expect(tab.locator("#editor-status")).to_contain_text("Run refused: interactive_lane_full")
    expect(tab.locator("#message")).to_contain_text("TROUPE_RUN_INTERACTIVE_MAX_CONCURRENT")
    expect(run).to_be_enabled()
    server.client.request("POST", f"/api/runs/{blocker}/cancel")
    server.wait_status(blocker, "cancelled")

    tab.locator("#examples").select_option("sleepy")
    run.click()
    expect(run).to_be_disabled()  # its run is active
    expect(run).to_be_enabled(timeout=30_000)
    expect(tab.locator("#editor-status")).to_contain_text("run succeeded")
    # Chromium logs every non-2xx response itself; the refusal above is the only one.
    assert [e for e in errors if "status of 503" not in e] == []


def test_queue_on_explains_the_queue_before_it_submits(open_page):
    server, tab, errors = open_page(view="#/editor", TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="1")
    busy = server.submit(sleeper(seconds=60))["run_id"]
    server.wait_status(busy, "running")
    tab.get_by_role("button", name="Queue on…").click()
    dialog = tab.locator("dialog[open]")
    expect(dialog.locator("#queue-explain")).to_contain_text("Queue cpu: 1 of 1 slots busy, 0 waiting")
    expect(dialog.locator("#queue-explain")).to_contain_text("would not start at once: it #1 in line for cpu")
    dialog.get_by_role("button", name="Queue").click()
    expect(tab.locator("#editor-status")).to_contain_text("#1 in queue")
    queued = [r for r in server.get("/api/runs")["runs"] if r["id"] != busy]
    assert [(r["lane"], r["queue_key"], r["queue_position"]) for r in queued] == [("queued", "cpu", 1)]
    tab.get_by_role("link", name="Results").click()  # the Runs list has the window
    tab.locator(f'tr[data-run="{queued[0]["id"]}"]').get_by_text("#1 in queue").wait_for()
    for run_id in (busy, queued[0]["id"]):
        server.client.request("POST", f"/api/runs/{run_id}/cancel")
    assert errors == []


def test_a_node_names_a_flavor_in_the_inspector_and_the_run_gets_its_size(open_page):
    server, tab, errors = open_page(view="#/editor", TROUPE_CPUS="1")
    server.client.request("POST", "/api/flavors", {"name": "wide", "cpus": 3, "description": "for the big box"})
    tab.locator('g[data-node="s"] text.title').click()
    picker = tab.locator("#inspector #node-flavor")
    picker.select_option("wide")
    expect(tab.locator("#flavor-note")).to_contain_text("3 cpus: for the big box")
    tab.get_by_role("button", name="Queue on…").click()
    tab.locator("dialog[open]").get_by_role("button", name="Queue").click()
    expect(tab.locator("#editor-status")).to_contain_text("queued")
    run = server.get("/api/runs?limit=1")["runs"][0]
    events = server.events_until_finished(run["id"])
    detail = server.get(f"/api/runs/{run['id']}")
    assert next(n for n in detail["graph"]["nodes"] if n["id"] == "s")["resources"] == {"flavor": "wide"}
    assert detail["warnings"] == ["node s asks for 3 cpus; this server lends (TROUPE_CPUS) 1: cut down to 1"]
    assert events[-1]["payload"]["status"] == "succeeded"
    assert errors == []


def test_a_file_param_takes_an_upload_and_the_run_reads_it(open_page, tmp_path):
    server, tab, errors = open_page(view="#/editor")
    data = tmp_path / "train.csv"
    data.write_text("a,b,y\n" + "".join(f"{i},{i * 7},{i % 2}\n" for i in range(30)))
    tab.get_by_role("button", name="New").click()
    add(tab, "torch.CSVDataset")
    set_param(tab, "csvdataset1", "target", "y")
    tab.locator('#inspector input[data-upload="path"]').set_input_files(str(data))
    expect(tab.locator("#inspector [data-upload-note]")).to_contain_text("uploaded train.csv")
    ref = tab.locator('#inspector [data-param="path"]').input_value()
    (made,) = server.get("/api/files")["files"]
    assert ref == f"upload:{made['id']}" and made["name"] == "train.csv"
    tab.get_by_role("button", name="Queue on…").click()
    tab.locator("dialog[open]").get_by_role("button", name="Queue").click()
    expect(tab.locator("#editor-status")).to_contain_text("queued")
    run = server.get("/api/runs?limit=1")["runs"][0]
    assert server.events_until_finished(run["id"], timeout=90)[-1]["payload"]["status"] == "succeeded"
    assert errors == []


def test_a_commands_argv_and_vars_are_edited_as_json(open_page, tmp_path):
    server, tab, errors = open_page(view="#/editor", TROUPE_DATA_ROOTS=str(tmp_path))
    (tmp_path / "hi.py").write_text('import json\nprint(json.dumps({"metric": "loss", "value": 0.25}))\n')
    tab.get_by_role("button", name="New").click()
    add(tab, "script.Command")
    set_param(tab, "command1", "argv", '["{python}", "hi.py", "{lr}"]')
    tab.locator('#inspector [data-param="argv"]').press("Tab")
    set_param(tab, "command1", "vars", '{"lr": 0.5}')
    tab.locator('#inspector [data-param="vars"]').press("Tab")
    set_param(tab, "command1", "cwd", str(tmp_path))
    tab.get_by_role("button", name="Run", exact=True).click()
    expect(tab.locator("#editor-status")).to_contain_text("run succeeded", timeout=30_000)
    run = server.get("/api/runs")["runs"][0]
    node = server.get(f"/api/runs/{run['id']}")["graph"]["nodes"][0]
    assert node["params"]["argv"] == ["{python}", "hi.py", "{lr}"] and node["params"]["vars"] == {"lr": 0.5}
    assert errors == []


def open_file(tab, doc: dict, name: str = "g.json") -> None:
    tab.locator("#open-file").set_input_files(files=[{"name": name, "mimeType": "application/json",
                                                      "buffer": json.dumps(doc).encode()}])


def test_a_node_id_with_a_colon_connects_and_a_file_that_cannot_be_drawn_keeps_the_graph(open_page):
    _, tab, errors = open_page(view="#/editor")
    open_file(tab, {"name": "colon", "edges": [], "nodes": [
        {"id": "load:1", "type": "core.Constant", "params": {"value": 2}},
        {"id": "m", "type": "core.LogMetric", "params": {"name": "loss"}}]})
    expect(tab.locator("#editor-status")).to_contain_text("2 nodes")
    connect(tab, "load:1:value", "m:value")
    expect(tab.locator("#editor-status")).to_contain_text("connected load:1.value → m.value")
    expect(tab.locator("#edges path.edge")).to_have_count(1)  # drawn: its source is the node that is there
    open_file(tab, {"name": "broken", "nodes": [{"id": "q"}]}, "broken.json")
    expect(tab.locator("#editor-status")).to_contain_text('needs an "id" and a "type"')
    expect(tab.locator('g[data-node="load:1"]')).to_have_count(1)  # the graph on the canvas is still there
    expect(tab.locator("#edges path.edge")).to_have_count(1)
    assert errors == []


def test_an_edge_made_in_place_of_another_clears_an_edge_selection(open_page):
    _, tab, errors = open_page(view="#/editor")
    open_file(tab, {"name": "edges", "nodes": [
        {"id": "c1", "type": "core.Constant", "params": {"value": 1}},
        {"id": "c2", "type": "core.Constant", "params": {"value": 2}},
        {"id": "a", "type": "core.Add", "params": {}},
        {"id": "m", "type": "core.LogMetric", "params": {"name": "loss"}}], "edges": [
        {"source": "c1", "source_port": "value", "target": "a", "target_port": "a"},
        {"source": "c2", "source_port": "value", "target": "a", "target_port": "b"},
        {"source": "a", "source_port": "sum", "target": "m", "target_port": "value"}]})
    expect(tab.locator("#edges path.edge")).to_have_count(3)
    tab.locator('#edges path.edge[data-index="2"]').click(force=True)  # a.sum -> m.value
    expect(tab.locator("#edges path.edge.selected")).to_have_count(1)
    connect(tab, "c2:value", "a:a")  # replaces c1 -> a.a: the list shifts under the selection
    expect(tab.locator("#edges path.edge.selected")).to_have_count(0)
    tab.keyboard.press("Delete")  # deletes nothing now, least of all the edge just made
    expect(tab.locator("#edges path.edge")).to_have_count(3)
    assert errors == []
