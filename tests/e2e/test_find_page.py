"""Finding and folding runs in the page (issue 64): the Runs list's filter box (a `where`
expression with key suggestions, a malformed one said with where its fault is), Group by
(a row per group with the metric's mean, min, max and spread, and each group's mean curve
with a min-max band), both kept in the address across a reload; and a study's variants
drawn as their repeats' mean with a band, not as separate lines."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import pytest

from tests.e2e.conftest import MISSING, REASON
from tests.helpers import graph, hello, node

pytestmark = pytest.mark.skipif(MISSING, reason=REASON)
expect = pytest.importorskip("playwright.sync_api", reason=REASON).expect

# A training's loss over five steps: BASE / step, plus noise so that repeats differ.
NOISY = """
import json, random, sys
base = float(sys.argv[1])
for step in range(1, 6):
    print(json.dumps({"metric": "loss", "value": base / step + random.random(), "step": step}), flush=True)
"""

# What a band chart drew: its groups (mean, min, max at each step) and uPlot's bands.
DRAWN = """(figure) => ({bands: figure.bands, plotted: figure.plot.bands.length,
  series: figure.plot.series.map((s) => s.label)})"""


def _noisy(tmp_path, base: float = 1, name: str = "noisy") -> dict[str, Any]:
    (tmp_path / "noisy.py").write_text(NOISY)
    return graph(node("job", "script.Command", argv=["{python}", "noisy.py", "{base}"], vars={"base": base},
                      cwd=str(tmp_path)), name=name)


def _assert_bands(drawn: dict[str, Any], groups: dict[str, int]) -> None:
    """Each group a mean line inside its min-max band, as many runs in it as said."""
    assert {band["label"]: band["runs"] for band in drawn["bands"]} == groups, drawn["bands"]
    assert drawn["plotted"] == len(groups)  # uPlot fills a band per group
    for band in drawn["bands"]:
        assert band["steps"] == [1, 2, 3, 4, 5], band
        assert all(low <= mean <= high for low, mean, high in zip(band["min"], band["mean"], band["max"], strict=True))
        if band["runs"] > 1:
            assert any(low < high for low, high in zip(band["min"], band["max"], strict=True)), band  # a spread
    for label in groups:
        assert drawn["series"].count(label) == 1, drawn["series"]  # one line per group, not one per run


@pytest.mark.timeout(180)
def test_a_studys_variants_are_drawn_as_their_repeats_mean_with_a_band(open_page, tmp_path):
    server, tab, errors = open_page(TROUPE_DATA_ROOTS=str(tmp_path))
    status, study = server.client.request("POST", "/api/studies", {
        "name": "noisy study", "base_graph": _noisy(tmp_path), "repeats": 3,
        "objective": {"metric": "loss", "direction": "minimize"},
        "variants": [{"name": name, "params": [{"node_id": "job", "param": "vars.base", "value": base}]}
                     for name, base in (("low", 1), ("high", 5))]})
    assert status == 201, study
    for attempt in server.get(f"/api/studies/{study['id']}")["attempts"]:
        server.wait_status(attempt["run_id"], "succeeded", timeout=60)
    tab.goto(f"{server.url}/#/studies/{study['id']}")
    tab.reload()
    figure = tab.locator('#study .study-curves figure.chart.bands[data-series="loss"]')
    expect(figure).to_have_attribute("data-runs", "3|3", timeout=30_000)
    _assert_bands(figure.evaluate(DRAWN), {"low": 3, "high": 3})
    expect(figure.locator(".band-legend")).to_contain_text("low (3 runs)")
    expect(figure.locator("canvas").first).to_be_visible()
    assert errors == []


def _group_rows(reply: dict[str, Any]) -> list[dict[str, Any]]:
    """The API's groups as {value, runs, mean, min, max}."""
    return [{"value": g["value"], "runs": g["runs"], **{k: g["metric"][k] for k in ("mean", "min", "max")}}
            for g in reply["groups"]]


def _hello(value: int) -> dict[str, Any]:
    """hello with a.value set (val_loss is a + 3)."""
    doc = hello()
    next(n for n in doc["nodes"] if n["id"] == "a")["params"]["value"] = value
    return doc


def _rows(tab) -> set[str]:
    return set(tab.locator("#rows tr[data-run]").evaluate_all("(rows) => rows.map((r) => r.dataset.run)"))


@pytest.mark.timeout(180)
def test_the_filter_box_offers_keys_finds_runs_says_a_fault_and_survives_a_reload(open_page):
    server, tab, errors = open_page()
    runs = {}
    for value in (1, 2, 3):  # val_loss is a + 3: 4, 5, 6
        runs[value] = server.submit(_hello(value))["run_id"]
        server.events_until_finished(runs[value])
    tab.reload()
    expect(tab.locator("#rows tr[data-run]")).to_have_count(3)
    box = tab.locator("#run-where")
    box.click()
    box.press_sequentially("a.v")
    offered = tab.locator('#where-suggestions li[data-key="a.value"]')  # from GET /api/runs/keys
    expect(offered).to_be_visible()
    offered.click()
    expect(box).to_have_value("a.value ")
    box.press_sequentially("= 2 or metric.val_l")
    tab.keyboard.press("ArrowDown")
    tab.keyboard.press("Enter")  # takes the key offered first
    expect(box).to_have_value("a.value = 2 or metric.val_loss ")
    box.press_sequentially(">= 6")
    box.press("Enter")  # applies it
    expect(tab.locator("#rows tr[data-run]")).to_have_count(2)
    assert _rows(tab) == {runs[2], runs[3]}
    assert "where=a.value%20%3D%202%20or%20metric.val_loss%20%3E%3D%206" in tab.url

    tab.reload()  # the address keeps the filter
    expect(tab.locator("#rows tr[data-run]")).to_have_count(2)
    assert _rows(tab) == {runs[2], runs[3]}
    expect(tab.locator("#run-where")).to_have_value("a.value = 2 or metric.val_loss >= 6")

    malformed = "a.value = = 2"
    status, said = server.client.request("GET", "/api/runs?" + urlencode({"where": malformed}))
    assert status == 400 and said["error"]["code"] == "where_invalid", said
    box.fill(malformed)
    box.press("Enter")
    fault = tab.locator("#where-error")
    expect(fault).to_contain_text(said["error"]["message"])  # the server's words
    expect(fault.locator("mark")).to_have_attribute("data-offset", str(said["error"]["offset"]))
    expect(fault.locator("mark")).to_have_text("=")
    expect(box).to_have_attribute("aria-invalid", "true")
    expect(tab.locator("#rows tr[data-run]")).to_have_count(0)
    box.fill("a.value = 1")
    box.press("Enter")
    expect(fault).to_be_hidden()
    assert _rows(tab) == {runs[1]}
    assert [e for e in errors if "status of 400" not in e] == []  # Chromium logs the refused filter


@pytest.mark.timeout(180)
def test_group_by_folds_the_list_draws_each_groups_band_and_survives_a_reload(open_page, tmp_path):
    server, tab, errors = open_page(TROUPE_DATA_ROOTS=str(tmp_path))
    for base in (1, 1, 5, 5, 5):
        server.events_until_finished(server.submit(_noisy(tmp_path, base))["run_id"])
    tab.reload()
    tab.locator("#group-by").select_option("job.vars.base")
    tab.locator("#group-metric").select_option("loss")
    groups = server.get("/api/runs?" + urlencode({"group_by": "job.vars.base", "metric": "loss"}))
    table = tab.locator("#run-groups table.groups")
    expect(table.locator("tbody tr")).to_have_count(2)
    for row in _group_rows(groups):
        cells = table.locator(f'tbody tr[data-group-value="{row["value"]}"] td')
        expect(cells.nth(1)).to_have_text(str(row["runs"]))
        expect(cells.nth(2)).to_have_text(f"{row['mean']:.4g}")
        expect(cells.nth(3)).to_have_text(f"{row['min']:.4g}")
        expect(cells.nth(4)).to_have_text(f"{row['max']:.4g}")
    figure = tab.locator('#run-groups figure.chart.bands[data-series="loss"]')
    expect(figure).to_have_attribute("data-runs", "2|3")
    _assert_bands(figure.evaluate(DRAWN), {"job.vars.base=1": 2, "job.vars.base=5": 3})
    assert "group_by=job.vars.base&metric=loss" in tab.url

    tab.reload()  # the address keeps the grouping
    expect(tab.locator("#group-by")).to_have_value("job.vars.base")
    expect(tab.locator("#run-groups table.groups tbody tr")).to_have_count(2)
    expect(tab.locator('#run-groups figure.chart.bands[data-series="loss"]')).to_have_attribute("data-runs", "2|3")

    table.get_by_role("button", name="5", exact=True).click()  # a group's runs, unfolded
    expect(tab.locator("#run-where")).to_have_value("job.vars.base = 5")
    expect(tab.locator("#rows tr[data-run]")).to_have_count(3)
    expect(tab.locator("#run-groups")).to_be_hidden()
    assert errors == []
