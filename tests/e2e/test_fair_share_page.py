"""A class sharing one slot, in real browsers (issue 43): the teacher makes a class link
with limits in the page's dialog; two students open it and name themselves; one fills
her share of the line, and the page refuses her next run with the counts; the other's
"Queue on…" says his run is next, and it is; the teacher's Runs list says who ran
what, and groups it by person on a click."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import MISSING, REASON, screenshot, show
from tests.helpers import graph, node

pytestmark = [pytest.mark.skipif(MISSING, reason=REASON), pytest.mark.timeout(240)]
sync_api = pytest.importorskip("playwright.sync_api", reason=REASON)
expect = sync_api.expect

SUBMIT = """async (body) => {
  const r = await fetch('/api/runs', {method: 'POST', body: JSON.stringify(body),
    headers: {'Content-Type': 'application/json', 'X-Troupe-Request': '1'}});
  return [r.status, await r.json()];
}"""


def _student(browser, link: str, name: str):
    page = browser.new_context(viewport={"width": 1440, "height": 900}).new_page()
    page.goto(link)
    page.locator("#editor-status").get_by_text("nodes").wait_for()
    page.locator("#my-name").click()
    page.locator("dialog[open] input[name=name]").fill(name)
    page.locator("dialog[open]").get_by_role("button", name="Save").click()
    expect(page.locator("#my-name")).to_have_text(f"You: {name}")
    page.locator("#examples").select_option("hello")
    return page


def test_a_class_shares_one_slot_fairly_in_the_page(open_page):
    server, teacher, errors = open_page(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="1")
    teacher.get_by_role("button", name="Connected").click()
    teacher.get_by_role("button", name="New class link…").click()
    dialog = teacher.locator("dialog[open]")
    dialog.locator('input[name="uses"]').fill("2")
    dialog.locator('input[name="max_waiting"]').fill("2")
    dialog.get_by_role("button", name="Make the link").click()
    link = dialog.locator("[data-login-link]").inner_text()
    dialog.get_by_role("button", name="Close").click()

    browser = teacher.context.browser
    ann, bob = _student(browser, link, "Ann"), _student(browser, link, "Bob")
    nap = {"graph": graph(node("z", "core.Sleep", seconds=20), device="cpu", name="ann's nap"), "options": {}}
    ann_runs = [ann.evaluate(SUBMIT, nap)[1]["run_id"] for _ in range(3)]  # one runs, two wait: her share
    server.wait_status(ann_runs[0], "running")

    ann.get_by_role("button", name="Queue on…").click()
    ann.locator("dialog[open]").get_by_role("button", name="Queue").click()
    expect(ann.locator("dialog[open] .message")).to_contain_text("2 runs waiting at once")  # refused, with counts
    assert len(server.get("/api/runs?limit=100")["runs"]) == 3

    bob.get_by_role("button", name="Queue on…").click()
    expect(bob.locator("#queue-explain")).to_contain_text("#1 in line for cpu")  # ahead of Ann's two
    expect(bob.locator("#queue-explain")).to_contain_text("fair order")
    bob.locator("dialog[open]").get_by_role("button", name="Queue").click()
    expect(bob.locator("#editor-status")).to_contain_text("#1 in queue")
    bob_run = next(r for r in server.get("/api/runs?limit=100")["runs"] if r["submitted_label"] == "Bob")["id"]

    teacher.get_by_role("button", name="Runs").click()
    show(teacher, "#/runs")
    row = teacher.locator(f'tr[data-run="{bob_run}"]')
    expect(row.locator(".position")).to_have_text("#1 in queue")
    expect(row.locator("td.by")).to_have_text("Bob")
    expect(teacher.locator(f'tr[data-run="{ann_runs[2]}"] td.by')).to_have_text("Ann")
    teacher.locator('#runs th[data-sort="by"]').click()
    expect(teacher.locator('tr.person[data-person="Ann"]')).to_contain_text("Ann · 3 runs")
    expect(teacher.locator('tr.person[data-person="Bob"]')).to_contain_text("Bob · 1 run")
    screenshot(teacher, "fair-share-runs.png")
    server.client.request("POST", f"/api/runs/{ann_runs[0]}/cancel")
    bob_started = server.wait_status(bob_run, "succeeded")["started_at"]
    ann_next = server.get(f"/api/runs/{ann_runs[1]}")["started_at"]
    assert ann_next is None or ann_next > bob_started  # the slot Ann's run freed went to Bob
    for run_id in ann_runs[1:]:
        server.client.request("POST", f"/api/runs/{run_id}/cancel")
    assert errors == []
