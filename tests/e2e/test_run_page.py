"""The page people would rather look at (issue 29), in real Chromium: a run's own page by
its URL, charts that answer a hover and grow while the run runs, two runs overlaid and
their params compared, the list grouped by sweep, searched and tagged. Screenshots of the
run page, the compare view and a sweep's page go to docs/images."""

from __future__ import annotations

import re

import pytest

from tests.e2e.conftest import MISSING, REASON
from tests.helpers import graph, hello, node

pytestmark = pytest.mark.skipif(MISSING, reason=REASON)
expect = pytest.importorskip("playwright.sync_api", reason=REASON).expect


def ticker(count: int, interval: float) -> dict:
    return graph(node("t", "core.Ticker", count=count, interval=interval, name="tick"), name="ticker")


def test_a_run_page_by_its_url_with_charts_that_answer_a_hover_and_grow_live(open_page):
    server, tab, errors = open_page()
    from tests.integration.test_training_functional import quick_digits

    trained = server.submit(quick_digits(epochs=6))["run_id"]
    server.wait_status(trained, "succeeded", timeout=120)
    tab.goto(f"{server.url}/#/runs/{trained}")
    tab.reload()  # the address keeps the view
    chart = tab.locator('#run-metrics figure.chart[data-series="val_loss"]')
    expect(chart).to_have_attribute("data-points", "6")
    box = chart.locator(".u-over").bounding_box()
    assert box is not None
    tab.mouse.move(box["x"] + box["width"] - 2, box["y"] + box["height"] / 2)  # the last step
    tip = chart.locator(".tooltip")
    expect(tip.locator(".row").first).to_have_text("step 6")  # by the point, not a row under the chart
    expect(tip.locator(".row").nth(1)).to_have_text(re.compile(r"val_loss \d+\.\d+"))
    other = tab.locator('#run-metrics figure.chart[data-series="train_loss"] .tooltip')
    expect(other.locator(".row").first).to_have_text("step 6")  # one cursor for every chart of the page
    expect(chart.locator(".u-legend")).to_have_count(0)
    tab.locator("#run-metrics").get_by_label("log y").check()
    expect(chart).to_have_attribute("data-points", "6")
    expect(tab.locator("#run-head .facts")).to_contain_text("epoch 6/6")
    expect(tab.locator("#run-environment")).to_contain_text("CPython")
    expect(tab.locator("#run-params")).to_contain_text("torch.TrainingLoop")

    live = server.submit(ticker(40, 0.1))["run_id"]
    tab.goto(f"{server.url}/#/runs/{live}")
    grows = tab.locator('#run-metrics figure.chart[data-series="tick"]')
    grows.wait_for()
    first = int(grows.get_attribute("data-points") or 0)
    assert first < 40
    expect(grows).to_have_attribute("data-points", "40", timeout=30_000)  # it grew without a reload
    expect(tab.locator("#run-head h1")).to_contain_text("succeeded")
    assert errors == []


def test_two_runs_compared_overlaid_with_their_differing_params_marked(open_page):
    server, tab, errors = open_page()
    low = server.submit(graph(node("a", "core.Constant", value=1), node("m", "core.LogMetric", name="val_loss"),
                              edges=({"source": "a", "source_port": "value", "target": "m", "target_port": "value"},),
                              name="low"))["run_id"]
    high = server.submit(hello())["run_id"]
    for run_id in (low, high):
        server.wait_status(run_id, "succeeded")
    tab.locator(f'input[data-pick="{low}"]').check()
    tab.locator(f'input[data-pick="{high}"]').check()
    tab.get_by_role("button", name="Compare 2 runs").click()
    chart = tab.locator('#view figure.chart[data-series="val_loss"]')
    expect(chart.locator(".bar-row")).to_have_count(2)  # one point each: a value per run, as bars
    expect(tab.locator('tr[data-key="a.value"]')).to_have_class(re.compile("differs"))
    expect(tab.locator('tr[data-key="final val_loss"]')).to_have_class(re.compile("differs"))
    expect(tab.locator('tr[data-key="status"]')).not_to_have_class(re.compile("differs"))
    assert errors == []


def test_the_list_groups_a_sweep_searches_and_keeps_tags(open_page):
    server, tab, errors = open_page()
    body = {"base_graph": hello(), "name": "a sweep",
            "sweep_spec": {"method": "grid", "params": [{"node_id": "a", "param": "value", "values": [3, 1, 2]}]},
            "objective": {"metric": "val_loss", "direction": "minimize"}}
    status, sweep = server.client.request("POST", "/api/sweeps", body)
    assert status == 201
    alone = server.submit({**hello(), "name": "lonely"})["run_id"]
    for variant in sweep["variants"]:
        server.events_until_finished(variant["run_id"])
    server.wait_status(alone, "succeeded")
    group = tab.locator(f'tr[data-group="sweep:{sweep["sweep_id"]}"]')
    expect(group).to_contain_text("3 runs: 3 succeeded")
    expect(group).to_contain_text("best val_loss 4")
    expect(tab.locator("#rows tr.child")).to_have_count(0)
    toggle = group.locator("button.toggle")
    expect(toggle).to_have_attribute("aria-expanded", "false")
    toggle.focus()
    tab.keyboard.press("Enter")  # keyboard reachable, its state said on its button
    expect(tab.locator("#rows tr.child")).to_have_count(3)
    expect(group.locator("button.toggle")).to_have_attribute("aria-expanded", "true")
    expect(tab.locator("#rows tr.child").first).to_contain_text("a.value=")  # named by what sets it apart

    tab.locator("#run-search").fill("lonely")
    expect(tab.locator("#rows tr")).to_have_count(1)
    tab.locator(f'tr[data-run="{alone}"] a').first.click()
    tags = tab.get_by_label("Add a tag")
    tags.fill("baseline")
    tags.press("Enter")
    expect(tab.locator("#run-head [data-tags]")).to_contain_text("baseline")
    tab.reload()
    expect(tab.locator("#run-head [data-tags]")).to_contain_text("baseline")  # kept by the server
    tab.go_back()
    tab.locator("#run-search").fill("baseline")  # a tag is searched too
    expect(tab.locator("#rows tr")).to_have_count(1)
    expect(tab.locator(f'tr[data-run="{alone}"] .tag')).to_have_text("baseline")

    tab.locator(f'tr[data-group="sweep:{sweep["sweep_id"]}"]').count()
    tab.goto(f"{server.url}/#/sweeps/{sweep['sweep_id']}")
    expect(tab.locator("#sweep-title")).to_contain_text("a sweep")
    expect(tab.locator('#sweep-charts figure[data-param="a.value"]')).to_be_visible()
    assert errors == []


def test_a_run_page_lists_what_set_changed(open_page):
    from tests.helpers import hello

    server, tab, errors = open_page()
    run_id = server.submit(hello(), params_set={"a.value": 40})["run_id"]
    server.wait_status(run_id, "succeeded")
    tab.goto(f"{server.url}/#/runs/{run_id}")
    expect(tab.locator("#run-head dl.facts")).to_contain_text("a.value=40")
    assert errors == []


RESUMABLE = """
import json, os, sys
steps, fail_at = int(sys.argv[1]), int(sys.argv[2])
start = int(open(os.environ["TROUPE_RESUME_FROM"]).read()) if os.environ.get("TROUPE_RESUME_FROM") else 0
for step in range(start + 1, steps + 1):
    if step == fail_at:
        sys.exit(1)
    print(json.dumps({"metric": "loss", "value": 1.0 / step, "step": step}), flush=True)
    path = os.path.join(os.environ["TROUPE_CHECKPOINT_DIR"], f"step-{step}.ckpt")
    with open(path + ".tmp", "w") as out:
        out.write(str(step))
    os.rename(path + ".tmp", path)
"""


def test_a_resumed_runs_page_charts_the_chain_as_one_training(open_page, tmp_path):
    from tests.helpers import graph, node

    (tmp_path / "resumable.py").write_text(RESUMABLE)
    server, tab, errors = open_page(TROUPE_DATA_ROOTS=str(tmp_path))
    doc = graph(node("job", "script.Command", argv=["{python}", "resumable.py", "{steps}", "{fail_at}"],
                     vars={"steps": 5, "fail_at": 3}, cwd=str(tmp_path)), name="resumable")
    broke = server.submit(doc)["run_id"]
    server.wait_status(broke, "failed")
    status, again = server.client.request("POST", f"/api/runs/{broke}/rerun",
                                          {"resume": True, "params_set": {"job.vars.fail_at": 0}})
    assert status == 201, again
    server.wait_status(again["run_id"], "succeeded")
    tab.goto(f"{server.url}/#/runs/{again['run_id']}")
    chart = tab.locator('#run-metrics figure[data-series="loss"]')
    # A line for each run of the chain.
    expect(chart).to_have_attribute("data-labels", f"loss (run {broke[:8]})|loss (this run)")
    expect(chart).to_have_attribute("data-points", "5")  # steps 1-2 of the first run, 3-5 of this one
    assert errors == []


FAST = """
import json, time
for epoch in range(1, 1501):
    print(json.dumps({"metric": "loss", "value": 1.0 / epoch, "step": epoch}))
    print(json.dumps({"progress": epoch, "total": 1500}), flush=True)
    time.sleep(0.003)
"""


@pytest.mark.timeout(120)
def test_a_live_runs_page_keeps_up_without_asking_the_server_for_each_epoch(open_page, tmp_path):
    import time

    from tests.helpers import graph, node

    (tmp_path / "fast.py").write_text(FAST)
    server, tab, errors = open_page(TROUPE_DATA_ROOTS=str(tmp_path))
    asked: list[str] = []
    tab.on("request", lambda request: asked.append(request.url) if "/api/" in request.url else None)
    run_id = server.submit(graph(node("job", "script.Command", argv=["{python}", "fast.py"], cwd=str(tmp_path)),
                                 name="many epochs"))["run_id"]
    server.wait_status(run_id, "running")
    started = time.monotonic()
    tab.goto(f"{server.url}/#/runs/{run_id}")
    chart = tab.locator('#run-metrics figure[data-series="loss"]')
    expect(chart).to_have_attribute("data-points", "1500", timeout=60000)  # every epoch drawn, live or at the end
    followed = time.monotonic() - started
    expect(tab.locator("#run-head")).to_contain_text("epoch 1500/1500")
    reads = [url for url in asked if "/stream" not in url]
    # The page's first reads, then at most about two a second: never one per epoch (3,000 events).
    assert len(reads) <= 12 + 2 * followed, (len(reads), followed, reads[-20:])
    assert len(tab.locator("#run-events").inner_text().splitlines()) <= 500  # the newest lines, not all 3,000
    assert errors == []


def test_console_lines_stay_whole_per_node_and_events_filter_by_kind(open_page):
    from tests.helpers import edge, graph, node

    server, tab, errors = open_page()
    printers = [node(f"p{i}", "core.Print", prefix=f"line of p{i}:", stream="stderr" if i == 5 else "stdout")
                for i in range(6)]
    doc = graph(node("c", "core.Constant", value=7), *printers, node("m", "core.LogMetric", name="seven"),
                edges=(*(edge("c", "value", f"p{i}", "value") for i in range(6)), edge("c", "value", "m", "value")),
                name="six printers")
    run_id = server.submit(doc)["run_id"]
    server.wait_status(run_id, "succeeded")
    tab.goto(f"{server.url}/#/runs/{run_id}")
    printed = tab.locator("#run-console")
    expect(printed).to_contain_text("p5 ! line of p5:7.0")
    lines = [line for line in printed.inner_text().splitlines() if line.strip()]
    assert sorted(lines) == [f"p{i} › line of p{i}:7.0" for i in range(5)] + ["p5 ! line of p5:7.0"], lines
    events = tab.locator("#run-events")
    expect(events).to_contain_text("metric")
    tab.get_by_label("Show events of kind").select_option("no metrics")
    expect(events).not_to_contain_text("seven =")
    expect(events).to_contain_text("node_started")
    assert errors == []


def test_train_and_val_drawn_in_one_chart_when_asked(open_page):
    from tests.integration.test_training_functional import quick_digits

    server, tab, errors = open_page()
    run_id = server.submit(quick_digits(epochs=2))["run_id"]
    server.wait_status(run_id, "succeeded", timeout=120)
    tab.goto(f"{server.url}/#/runs/{run_id}")
    tab.locator('#run-metrics figure[data-series="val_loss"]').wait_for()
    tab.get_by_label("train and val in one chart").check()
    together = tab.locator('#run-metrics figure[data-series="loss"]')
    expect(together).to_have_attribute("data-labels", re.compile(r"^(train_loss\|val_loss|val_loss\|train_loss)$"))
    expect(tab.locator('#run-metrics figure[data-series="val_loss"]')).to_have_count(0)
    assert errors == []


def test_a_sweeps_charts_take_words_too_and_draw_every_variant_across_its_params(open_page):
    from tests.helpers import hello

    server, tab, errors = open_page()
    base = hello()
    base["nodes"].append({"id": "p", "type": "core.Print", "params": {"prefix": "x"}})
    base["edges"].append({"source": "s", "source_port": "sum", "target": "p", "target_port": "value"})
    status, sweep = server.client.request("POST", "/api/sweeps", {
        "name": "words and numbers", "base_graph": base, "objective": {"metric": "val_loss", "direction": "minimize"},
        "sweep_spec": {"method": "grid", "params": [{"node_id": "a", "param": "value", "values": [1, 2]},
                                                    {"node_id": "p", "param": "prefix", "values": ["x", "y"]}]}})
    assert status == 201, sweep
    for variant in sweep["variants"]:
        server.wait_status(variant["run_id"], "succeeded")
    tab.goto(f"{server.url}/#/sweeps/{sweep['sweep_id']}")
    expect(tab.locator('#sweep-charts figure[data-param="p.prefix"]')).to_have_attribute("data-points", "4")
    lines = tab.locator("#sweep-charts figure.parallel polyline.variant")
    expect(lines).to_have_count(4)
    expect(tab.locator("#sweep-charts figure.parallel polyline.best")).to_have_count(1)
    best = tab.locator("#sweep-charts figure.parallel polyline.best").get_attribute("data-run")
    curves = tab.locator('#sweep-charts figure.curves[data-series="val_loss"]')  # every variant's curve
    expect(curves).to_have_attribute("data-labels", re.compile(r"^best: a\.value=1(\.0)? p\.prefix=\w(\|[^|]+){3}$"))
    tab.locator("#sweep-charts figure.parallel polyline.best").dispatch_event("click")  # lines cross: its own
    expect(tab).to_have_url(re.compile(f"#/runs/{best}$"))
    assert errors == []


# Reads of one run's id held back 1.5 s inside the page, as a run with a long log is slow to read.
_SLOW_READS = """(() => { const plain = window.fetch; window.slowId = "";
  window.fetch = async (url, options) => { const answer = await plain(url, options);
    if (window.slowId && String(url).includes(window.slowId)) await new Promise((done) => setTimeout(done, 1500));
    return answer; }; })();"""


def test_a_page_opened_last_wins_a_gone_run_says_so_and_an_end_is_shown_at_once(open_page):
    server, tab, errors = open_page()
    first = server.submit(graph(node("c", "core.Constant", value=1.0), name="first run"))["run_id"]
    server.wait_status(first, "succeeded")
    live = server.submit(ticker(600, 0.1))["run_id"]
    tab.add_init_script(_SLOW_READS)
    tab.reload()
    tab.locator("#results").wait_for(state="visible")
    # The first page's reads land after the second page opened: the second stays shown.
    tab.evaluate("(id) => { window.slowId = id; location.hash = '#/runs/' + id; }", first)
    tab.evaluate("(id) => { location.hash = '#/runs/' + id; }", live)
    expect(tab.locator("#run-head h1")).to_contain_text("ticker")
    tab.wait_for_timeout(2000)  # past the held reads: nothing replaces it
    expect(tab.locator("#run-head h1")).to_contain_text("ticker")
    # Its end is shown from the stream at once, even when the header's read then fails (a server stopping).
    tab.route(f"**/api/runs/{live}", lambda route: route.abort())
    assert server.client.request("POST", f"/api/runs/{live}/cancel")[0] == 200
    expect(tab.locator("#run-head h1")).to_contain_text("cancelled")
    # A deleted run's address says so where the page would be, with the way back.
    assert server.client.request("DELETE", f"/api/runs/{first}")[0] == 200
    tab.evaluate("() => { window.slowId = ''; }")
    tab.goto(f"{server.url}/#/runs/{first}")
    expect(tab.locator("#view [role=alert]")).to_contain_text("run_not_found")
    expect(tab.locator("#view")).not_to_contain_text("Loading")
    expect(tab.locator("#view").get_by_role("link", name="← Runs")).to_be_visible()
    assert [e for e in errors if "404" not in e and "ERR_FAILED" not in e] == [], errors


def test_a_secret_params_value_is_shown_on_no_page(open_page, tmp_path):
    from tests.integration.test_find_runs_functional import SECRET_PACK

    home = tmp_path / "home"
    (home / "packs").mkdir(parents=True)
    (home / "packs" / "labkeys.py").write_text(SECRET_PACK)
    server, tab, errors = open_page(home=home)
    runs = [server.submit(graph(node("f", "labkeys.Fetch", api_key=key, url="https://lab")))["run_id"]
            for key in ("sk-FIRST-PRIVATE", "sk-SECOND-PRIVATE")]
    for run_id in runs:
        server.wait_status(run_id, "succeeded")
    tab.evaluate("(id) => { location.hash = `#/runs/${id}`; }", runs[0])
    expect(tab.locator("#view")).to_contain_text("https://lab")
    expect(tab.locator("#view")).to_contain_text("(a secret)")
    assert "PRIVATE" not in tab.locator("#view").inner_text()
    tab.evaluate("(ids) => { location.hash = `#/compare/${ids}`; }", ",".join(runs))
    expect(tab.locator('tr[data-key="f.url"]')).to_be_visible()
    expect(tab.locator('tr[data-key="f.api_key"]')).to_contain_text("(a secret)")
    assert "PRIVATE" not in tab.locator("#view").inner_text()
    assert errors == []
