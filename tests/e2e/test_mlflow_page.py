"""A run of an unchanged MLflow script, on its page in real Chromium: the params and tags
the script logged are among the run's facts, its points are charted with their steps,
the file it logged is listed with the run's artifacts, and the Runs list's filter box
offers its logged param (``params.lr``), finds it by it and shows it as a column."""

from __future__ import annotations

import importlib.util

import pytest

from tests.e2e.conftest import MISSING, REASON, confirm, show
from tests.helpers import graph, node
from tests.integration.test_mlflow_functional import SCRIPT, mlflow_graph, with_cwd

pytestmark = [pytest.mark.skipif(MISSING, reason=REASON),
              pytest.mark.skipif(importlib.util.find_spec("mlflow") is None,
                                 reason="the MLflow client is not installed (pip install mlflow-skinny)")]
expect = pytest.importorskip("playwright.sync_api", reason=REASON).expect


def test_a_run_page_shows_what_an_mlflow_script_logged(open_page, tmp_path):
    folder = tmp_path / "lab"
    folder.mkdir()
    (folder / "train.py").write_text(SCRIPT)
    server, tab, errors = open_page(TROUPE_DATA_ROOTS=str(tmp_path))
    run_id = server.submit(with_cwd(mlflow_graph(), folder))["run_id"]
    server.wait_status(run_id, "succeeded", timeout=90)
    tab.goto(f"{server.url}/#/runs/{run_id}")
    params = tab.locator('#run-head [data-logged="Logged params"]')
    expect(params).to_contain_text("lr=0.1")
    expect(params).to_contain_text("optimizer=adam")
    expect(tab.locator('#run-head [data-logged="Logged tags"]')).to_have_text("stage=smoke, team=a")
    expect(tab.locator('#run-metrics figure.chart[data-series="loss"]')).to_have_attribute("data-points", "40")
    expect(tab.locator("#run-artifacts")).to_contain_text("mlflow/results/out.txt")

    other = server.submit(graph(node("a", "core.Constant", value=0.1)))["run_id"]  # logs nothing
    server.wait_status(other, "succeeded")
    show(tab, "#/runs")
    tab.reload()  # the keys the box offers are read again after 10 s, or at a load
    box = tab.locator("#run-where")
    box.click()
    box.press_sequentially("params.l")
    offered = tab.locator('#where-suggestions li[data-key="params.lr"]')  # the param the script logged
    expect(offered).to_be_visible()
    offered.click()
    box.press_sequentially("< 0.5")
    box.press("Enter")
    expect(tab.locator("#rows tr[data-run]")).to_have_count(1)
    expect(tab.locator(f'#rows tr[data-run="{run_id}"]')).to_have_count(1)
    tab.get_by_role("button", name="Columns…").click()  # and shows it as a column of the list
    tab.locator("dialog[open]").get_by_label("params.lr").check()
    confirm(tab, "Show")
    expect(tab.locator('#runs th[data-sort="logged:lr"]')).to_have_text("params.lr")
    expect(tab.locator(f'#rows tr[data-run="{run_id}"] td.picked.logged')).to_have_text("0.1")
    assert errors == []
