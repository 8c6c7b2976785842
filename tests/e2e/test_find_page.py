"""Finding and folding runs in the page (issue 64): the Runs list's filter box (a `where`
expression with key suggestions, a malformed one said with where its fault is), Group by
(a row per group with the metric's mean, min, max and spread, and each group's mean curve
with a min-max band), both kept in the address across a reload; and a study's variants
drawn as their repeats' mean with a band, not as separate lines."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.conftest import MISSING, REASON
from tests.helpers import graph, node

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
