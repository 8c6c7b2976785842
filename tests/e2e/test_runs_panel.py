"""The Runs and Sweeps panels in a real browser."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from tests.e2e.conftest import MISSING, REASON, confirm
from tests.helpers import hello, sleeper

pytestmark = pytest.mark.skipif(MISSING, reason=REASON)
expect = pytest.importorskip("playwright.sync_api", reason=REASON).expect


def _finished_sweep(server, name):
    """A sweep of a.value over 3, 1, 2 (val_loss a + 3), run to its end."""
    status, reply = server.client.request("POST", "/api/sweeps", {
        "base_graph": hello(), "name": name, "objective": {"metric": "val_loss", "direction": "minimize"},
        "sweep_spec": {"method": "grid", "params": [{"node_id": "a", "param": "value", "values": [3, 1, 2]}]}})
    assert status == 201, reply
    for variant in reply["variants"]:
        server.events_until_finished(variant["run_id"])
    return reply


@pytest.fixture
def page(open_page):
    return open_page(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="1")


def test_the_runs_panel_lists_queues_stops_and_deletes_runs(page):
    server, tab, errors = page
    done = server.submit(hello())["run_id"]
    server.events_until_finished(done)
    running = server.submit(sleeper(seconds=60))["run_id"]
    waiting = [server.submit(sleeper(seconds=60))["run_id"] for _ in range(2)]
    server.wait_status(running, "running")

    row = tab.locator(f'tr[data-run="{waiting[1]}"]')
    row.get_by_text("#2 in queue").wait_for()
    tab.locator(f'tr[data-run="{waiting[0]}"]').get_by_text("#1 in queue").wait_for()
    # Active counts what the server started; the others wait, each saying for what.
    tab.get_by_text("1 run active, 2 queued").wait_for()
    expect(tab.locator(f'tr[data-run="{waiting[1]}"] .reason')).to_have_text("#2 in line for cpu: 1 of 1 slots busy")
    expect(tab.locator(f'tr[data-run="{waiting[1]}"] .reason')).to_have_attribute("data-code", "slots_busy")
    tab.locator(f'tr[data-run="{done}"] .status.succeeded').wait_for()

    tab.locator(f'tr[data-run="{running}"]').get_by_role("button", name="Stop").click()
    tab.locator(f'tr[data-run="{running}"] .status.cancelled').wait_for()
    row.get_by_text("#1 in queue").wait_for()  # the queue moved up, live

    tab.locator(f'tr[data-run="{done}"]').click()  # its own page, a chart per metric series
    expect(tab.locator('#run-metrics figure.chart[data-series="val_loss"]')).to_contain_text("last 5")
    assert tab.url.endswith(f"#/runs/{done}")
    tab.get_by_role("link", name="← Runs").click()
    tab.locator(f'tr[data-run="{done}"]').get_by_role("button", name="Delete").click()
    expect(tab.locator("dialog[open]")).to_contain_text("Checkpoint files stay on disk")
    confirm(tab, "Delete")
    tab.locator(f'tr[data-run="{done}"]').wait_for(state="detached")
    status, _ = server.client.request("GET", f"/api/runs/{done}")
    assert status == 404

    tab.locator(f'tr[data-run="{running}"]').click()
    tab.locator("#run-events").get_by_text("run_finished").wait_for()
    tab.go_back()
    tab.locator('.chip[data-filter="cancelled"]').click()
    expect(tab.locator("#rows tr")).to_have_count(1)
    expect(tab.locator(f'tr[data-run="{running}"]')).to_be_visible()
    for run_id in waiting:
        server.client.request("POST", f"/api/runs/{run_id}/cancel")
    assert errors == []


def test_watch_replays_a_run_from_the_start_into_the_editors_log_and_csv_downloads_it(page):
    server, tab, errors = page
    first = server.submit(hello())["run_id"]
    server.events_until_finished(first)
    row = tab.locator(f'tr[data-run="{first}"]')
    row.get_by_role("button", name="Watch").click()  # a run from a terminal, followed in this tab
    tab.wait_for_url("**#/editor")
    log = tab.locator("#exec-log-lines")
    expect(log).to_contain_text("run_started")  # replayed from its first event
    expect(log).to_contain_text("run_finished")
    expect(tab.locator("#exec-log-run")).to_contain_text("Watching")
    tab.keyboard.press("r")  # back to the results by a key
    second = server.submit(sleeper(seconds=60))["run_id"]
    server.wait_status(second, "running")
    tab.locator(f'tr[data-run="{second}"]').get_by_role("button", name="Watch").click()
    expect(log).not_to_contain_text("run_finished")  # the first let go, the second followed live
    expect(log).to_contain_text("node_started")
    server.client.request("POST", f"/api/runs/{second}/cancel")
    expect(log).to_contain_text("cancelled")
    tab.keyboard.press("r")
    with tab.expect_download() as arrived:
        row.get_by_role("link", name="CSV").click()
    assert Path(arrived.value.path()).read_text().splitlines()[0].startswith("series,")
    assert errors == []


def test_picked_param_and_metric_columns_show_sort_and_stay_in_the_browser(page):
    server, tab, errors = page
    reply = _finished_sweep(server, "cols")
    tab.locator(f'tr[data-group="sweep:{reply["sweep_id"]}"]').click()  # its runs, open
    expect(tab.locator("#rows tr.child")).to_have_count(3)
    tab.get_by_role("button", name="Columns…").click()
    dialog = tab.locator("dialog[open]")
    dialog.get_by_label("a.value").check()
    dialog.get_by_label("val_loss").check()
    confirm(tab, "Show")
    header = tab.locator('#runs th[data-sort="metric:val_loss"]')
    expect(header).to_have_text("val_loss")
    expect(tab.locator('#runs th[data-sort="param:a.value"]')).to_have_text("a.value")
    header.click()  # lowest first
    cells = tab.locator("#rows tr.child td.picked.metric")
    expect(cells).to_have_text(["4", "5", "6"])
    header.click()
    expect(cells).to_have_text(["6", "5", "4"])
    expect(tab.locator("#rows tr.child td.picked.param")).to_have_text(["3", "2", "1"])
    tab.reload()  # kept in this browser
    tab.locator(f'tr[data-group="sweep:{reply["sweep_id"]}"]').click()
    expect(tab.locator('#runs th[data-sort="metric:val_loss"]')).to_be_visible()
    assert errors == []


def test_every_run_can_be_reached_page_by_page(open_page):
    server, tab, errors = open_page(TROUPE_RUN_RETENTION_KEEP_LAST="1000")
    ids = [server.submit(hello())["run_id"] for _ in range(205)]
    server.events_until_finished(ids[-1])
    server.wait_status(ids[0], "succeeded")
    expect(tab.locator("#rows tr")).to_have_count(200)
    tab.get_by_role("button", name="Show more").click()
    expect(tab.locator("#rows tr")).to_have_count(205)
    expect(tab.locator(f'tr[data-run="{ids[0]}"]')).to_be_visible()
    expect(tab.get_by_role("button", name="Show more")).to_be_hidden()
    assert errors == []


def test_a_browser_without_the_login_cookie_is_read_only_and_told_how_to_log_in(page):
    server, tab, errors = page
    assert tab.locator(".login-banner").count() == 0  # logged in with the printed link
    stranger = tab.context.browser.new_page()  # a fresh context: no cookie
    try:
        stranger.goto(server.url + "/")
        banner = stranger.locator(".login-banner")
        banner.wait_for()
        assert "Read-only" in banner.inner_text() and "troupe open" in banner.inner_text()
        assert server.token not in stranger.content()
        # No control that would only fail: the teacher's Connected panel (by its address
        # too) and its New class link..., an upload for a file param.
        stranger.evaluate("() => { location.hash = '#/people'; }")
        expect(stranger).to_have_url(re.compile(r"#/runs$"))
        expect(stranger.locator("#class-link-button")).to_be_hidden()
        stranger.evaluate("() => { location.hash = '#/editor'; }")
        stranger.locator("#open-file").set_input_files(files=[{
            "name": "csv.json", "mimeType": "application/json", "buffer": json.dumps({"name": "csv", "edges": [],
            "nodes": [{"id": "data", "type": "torch.CSVDataset", "params": {"target": "y"}}]}).encode()}])
        stranger.locator('g[data-node="data"] text.title').click()
        expect(stranger.locator('#inspector [data-param="path"]')).to_be_visible()
        expect(stranger.locator("#inspector .file-param button")).to_be_hidden()
    finally:
        stranger.close()
    assert errors == []


def test_the_sweeps_panel_ranks_variants_best_first(page):
    server, tab, errors = page
    reply = _finished_sweep(server, "a sweep")
    tab.get_by_role("button", name="Sweeps").click()
    tab.locator(f'tr[data-sweep="{reply["sweep_id"]}"]').click()
    tab.get_by_text("a sweep — finished").wait_for()
    expect(tab.locator(f'tr[data-sweep="{reply["sweep_id"]}"]')).to_contain_text("finished")
    ranks = tab.locator("#ranking-rows tr")
    expect(ranks).to_have_count(3)
    expect(ranks.nth(0)).to_contain_text("1")
    expect(ranks.nth(0)).to_contain_text("4.000")  # a=1: val_loss 1 + 3
    assert tab.locator("#sweep-csv").get_attribute("href") == f"/api/sweeps/{reply['sweep_id']}?format=csv"
    assert errors == []


def test_the_chart_of_a_diverged_loss_shows_where_it_diverged(page):
    from tests.integration.test_hardening_functional import diverging

    server, tab, errors = page
    run_id = server.submit(diverging())["run_id"]
    server.wait_status(run_id, "succeeded")
    tab.locator(f'tr[data-run="{run_id}"]').click()
    chart = tab.locator('#run-metrics figure.chart[data-series="val_loss"]')
    expect(chart).to_contain_text("inf at step 1")
    expect(chart).to_have_attribute("data-diverged", "1")  # a red line drawn at step 1
    assert errors == []


def test_seed_and_determinism_appear_in_the_details_only_when_set(page):
    server, tab, errors = page
    plain = server.submit(hello())["run_id"]
    seeded = server.submit(hello(), seed=7, deterministic=True)["run_id"]
    for run_id in (plain, seeded):
        server.wait_status(run_id, "succeeded")
    tab.locator(f'tr[data-run="{seeded}"]').click()
    facts = tab.locator("#run-head .facts")
    expect(facts).to_contain_text("Seed7")
    expect(facts).to_contain_text("Deterministicyes")
    tab.go_back()
    tab.locator(f'tr[data-run="{plain}"]').click()
    expect(tab.locator("#run-head")).to_contain_text(plain)
    expect(facts).to_contain_text("Started")
    expect(facts).not_to_contain_text("Seed")
    expect(facts).not_to_contain_text("Deterministic")
    assert errors == []


def test_an_artifact_is_listed_with_where_it_lives_and_downloads_whole(page):
    from tests.integration.test_training_functional import quick_digits

    server, tab, errors = page
    run_id = server.submit(quick_digits(epochs=1, checkpoint_every=1))["run_id"]
    server.wait_status(run_id, "succeeded", timeout=120)
    listed = server.get(f"/api/runs/{run_id}")["artifacts"][0]
    tab.locator(f'tr[data-run="{run_id}"]').click()
    tab.locator("#run-artifacts summary").click()  # a run with checkpoints folds its files under one line
    row = tab.locator("#run-artifacts .artifact").first
    expect(row).to_contain_text("checkpoints/trainer-epoch-1.pt")
    expect(row).to_contain_text("local")
    with tab.expect_download() as arrived:
        row.get_by_role("link", name="Download").click()
    saved = arrived.value.path()
    assert hashlib.sha256(Path(saved).read_bytes()).hexdigest() == listed["sha256"]
    assert arrived.value.suggested_filename == "trainer-epoch-1.pt"
    assert errors == []


def test_a_run_is_made_again_and_a_stopped_training_resumed_from_the_page(page):
    from tests.integration.test_training_functional import quick_digits

    server, tab, errors = page
    graph = quick_digits(epochs=4, checkpoint_every=1)
    run_id = server.submit(graph, seed=3)["run_id"]
    for kind, data in server.client.stream(f"/api/runs/{run_id}/stream", read_timeout=120):
        if kind == "run_event" and data["type"] == "artifact" and data["payload"]["path"].endswith("epoch-2.state.pt"):
            server.client.request("POST", f"/api/runs/{run_id}/cancel")
        if kind == "run_event" and data["type"] == "run_finished":
            break
    tab.locator(f'tr[data-run="{run_id}"]').click()
    expect(tab.locator("#run-head .facts")).to_contain_text("Can be resumed")
    resume = tab.locator("#run-head .actions").get_by_role("button", name=re.compile(r"Resume from epoch \d"))
    resume.click()
    server.wait_until(lambda: server.get(f"/api/runs/{run_id}")["reruns"] != [])
    resumed = server.get(f"/api/runs/{run_id}")["reruns"][0]
    tab.wait_for_url(f"**#/runs/{resumed}")  # the page goes to the new run
    assert server.events_until_finished(resumed, timeout=120)[-1]["payload"]["status"] == "succeeded"
    assert server.get(f"/api/runs/{resumed}")["resumed_from"]["run_id"] == run_id
    expect(tab.locator("#run-head")).to_contain_text("succeeded")  # followed live to its end
    tab.go_back()
    tab.locator("#run-head .actions").get_by_role("button", name="Run again").click()
    server.wait_until(lambda: len(server.get(f"/api/runs/{run_id}")["reruns"]) == 2)
    assert errors == []


def test_a_runs_console_output_shows_in_its_details(page):
    from tests.integration.test_terminal_functional import talker

    server, tab, errors = page
    run_id = server.submit(talker("P", pause=0.05))["run_id"]
    server.wait_status(run_id, "succeeded")
    tab.locator(f'tr[data-run="{run_id}"]').click()
    # Each line marked with its node and its stream.
    expect(tab.locator("#run-console")).to_have_text("one › P-1 1.0\ntwo ! P-2 1.0\nthree › P-3 1.0\n")
    assert errors == []


def test_the_list_sorts_by_a_column_and_a_column_widens_by_its_edge(page):
    from tests.helpers import graph, node

    server, tab, errors = page
    for value in (3, 1, 2):
        run_id = server.submit(graph(node("a", "core.Constant", value=value),
                                     node("m", "core.LogMetric", name="val_loss"),
                                     edges=({"source": "a", "source_port": "value", "target": "m",
                                             "target_port": "value"},), name=f"loss {value}"))["run_id"]
        server.wait_status(run_id, "succeeded")
    rows = tab.locator("#rows tr[data-run]")
    expect(rows).to_have_count(3)
    loss = tab.locator('#runs th[data-sort="final_loss"]')
    loss.click()
    expect(loss).to_have_attribute("aria-sort", "ascending")
    expect(rows.first).to_contain_text("loss 1")
    loss.click()
    expect(rows.first).to_contain_text("loss 3")
    name = tab.locator('#runs th[data-sort="name"]')
    before = name.bounding_box()
    grip = name.locator(".grip").bounding_box()
    assert before is not None and grip is not None
    tab.mouse.move(grip["x"] + 2, grip["y"] + 5)
    tab.mouse.down()
    tab.mouse.move(grip["x"] + 82, grip["y"] + 5)
    tab.mouse.up()
    after = name.bounding_box()
    assert after is not None and after["width"] > before["width"] + 40
    assert errors == []


# The Runs list's unfiltered reads held back 1.5 s inside the page (a big list on a busy server).
_SLOW_LIST = """(() => { const plain = window.fetch; window.slowList = false; window.slowStarted = false;
  window.fetch = async (url, options) => {
    const held = window.slowList && String(url).includes("grouped=true") && !String(url).includes("q=");
    if (held) window.slowStarted = true;
    const answer = await plain(url, options);
    if (held) await new Promise((done) => setTimeout(done, 1500));
    return answer; }; })();"""


def test_an_older_list_that_lands_last_never_replaces_a_search_and_a_failed_refresh_is_cleared(open_page):
    server, tab, errors = open_page()
    server.events_until_finished(server.submit(hello())["run_id"])
    tab.add_init_script(_SLOW_LIST)
    tab.reload()
    expect(tab.locator("#rows tr")).to_have_count(1)
    tab.evaluate("() => { window.slowList = true; }")
    server.submit(hello())  # the live stream asks for a refresh, held back
    tab.wait_for_function("() => window.slowStarted")
    tab.locator("#run-search").fill("zzz-matches-nothing")
    expect(tab.locator("#no-match")).to_be_visible()
    tab.wait_for_timeout(2000)  # past the held answer: it is not drawn over the search
    expect(tab.locator("#no-match")).to_be_visible()
    expect(tab.locator("#rows tr")).to_have_count(0)
    # A refresh that failed says so; the next one that works clears it.
    tab.evaluate("() => { window.slowList = false; }")
    tab.locator("#run-search").fill("")
    tab.route("**/api/queues", lambda route: route.abort())
    server.submit(hello())
    expect(tab.locator("#message")).to_contain_text("Failed to fetch")
    tab.unroute("**/api/queues")
    server.submit(hello())
    expect(tab.locator("#message")).to_be_hidden()
    assert [e for e in errors if "ERR_FAILED" not in e] == [], errors
