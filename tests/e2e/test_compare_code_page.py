"""Two runs of one script edited in between, compared on the page in real Chromium
(issue 65, section 3): the Compare view names the file whose sha256 differs and the git
tree that became dirty, and shows the later run's uncommitted diff to read; two runs of
the same code say so."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import MISSING, REASON
from tests.integration.test_code_record_functional import _git, _two_runs, lab  # noqa: F401 (lab: a fixture)

pytestmark = pytest.mark.skipif(MISSING, reason=REASON)
expect = pytest.importorskip("playwright.sync_api", reason=REASON).expect


def test_compare_names_the_edited_file_and_shows_its_diff(open_page, lab):  # noqa: F811
    server, tab, errors = open_page(TROUPE_DATA_ROOTS=str(lab.parent))
    first, second = _two_runs(server, lab)
    tab.evaluate("(to) => { location.hash = to; }", f"#/compare/{first},{second}")
    found = tab.locator(f'#compare-code .code-differs[data-run="{second}"]')
    script = found.locator('li[data-key="code.train.files.train.py.sha256"]')
    expect(script).to_contain_text("train: file train.py sha256")
    before = server.get(f"/api/runs/{first}")["execution_facts"]["fingerprint"]["code"]["train"]
    expect(script).to_contain_text(before["files"][0]["sha256"][:12])
    tree = before["repos"][0]["name"]
    expect(found.locator(f'li[data-key="code.train.repos.{tree}.dirty"]')).to_contain_text("false → true")
    diff = found.locator(f'li[data-key="code.train.repos.{tree}.diff"]')
    diff.locator("summary").click()
    expect(diff.locator("pre.diff")).to_contain_text("+print('one more line')")
    expect(found.locator('li[data-key^="python"]')).to_have_count(0)  # one interpreter: not a difference

    _git(lab, "commit", "-q", "-am", "one more line")  # committed: the same file, a clean tree
    third = server.submit(server.get(f"/api/runs/{second}")["graph"])["run_id"]
    server.wait_status(third, "succeeded", timeout=90)
    fourth = server.submit(server.get(f"/api/runs/{second}")["graph"])["run_id"]
    server.wait_status(fourth, "succeeded", timeout=90)
    tab.evaluate("(to) => { location.hash = to; }", f"#/compare/{third},{fourth}")
    expect(tab.locator(f'#compare-code .code-differs[data-run="{fourth}"]')).to_contain_text(
        "The same code, packs and environment.")
    assert errors == []
