"""What a class session may change, in a real browser (issue 62): a student's page offers
Stop, Delete and the name, tag and note fields on her own runs only, and Cancel and
Resume on her own studies only; on the teacher's it says whose the run is and keeps Run
again. The teacher's page offers them on everyone's."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import MISSING, REASON, show
from tests.helpers import hello, sleeper
from tests.integration.test_studies_functional import post, study_body, variants

pytestmark = [pytest.mark.skipif(MISSING, reason=REASON), pytest.mark.timeout(240)]
sync_api = pytest.importorskip("playwright.sync_api", reason=REASON)
expect = sync_api.expect

SUBMIT = """async (graph) => {
  const r = await fetch('/api/runs', {method: 'POST', body: JSON.stringify({graph}),
    headers: {'Content-Type': 'application/json', 'X-Troupe-Request': '1'}});
  return (await r.json()).run_id;
}"""


def test_a_student_is_offered_changes_to_her_own_work_only(open_page):
    server, teacher, errors = open_page(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="4")
    status, made = server.client.request("POST", "/api/login-links", {"uses": 1})
    assert status == 201, made
    ann = teacher.context.browser.new_context(viewport={"width": 1440, "height": 900}).new_page()
    ann.on("pageerror", lambda error: errors.append(str(error)))
    ann.goto(made["login_url"])
    ann.locator("#editor-status").get_by_text("nodes").wait_for()

    demo = server.submit(hello())["run_id"]
    server.wait_status(demo, "succeeded")
    assert server.client.request("PATCH", f"/api/runs/{demo}", {"tags": ["keep"]})[0] == 200
    demos_nap = server.submit(sleeper(60))["run_id"]
    own, own_nap = ann.evaluate(SUBMIT, hello()), ann.evaluate(SUBMIT, sleeper(60))
    server.wait_status(own, "succeeded")

    # The Runs list: Stop and Delete on her own rows, none on the teacher's.
    show(ann, "#/runs")
    for run_id in (demo, demos_nap, own, own_nap):
        ann.locator(f'tr[data-run="{run_id}"]').wait_for()
    expect(ann.locator(f'tr[data-run="{demo}"]').get_by_role("button", name="Delete")).to_have_count(0)
    expect(ann.locator(f'tr[data-run="{demos_nap}"]').get_by_role("button", name="Stop")).to_have_count(0)
    expect(ann.locator(f'tr[data-run="{own}"]').get_by_role("button", name="Delete")).to_be_visible()
    expect(ann.locator(f'tr[data-run="{own_nap}"]').get_by_role("button", name="Stop")).to_be_visible()

    # The teacher's run page: whose it is, Run again, its tags without a way to change them.
    ann.evaluate("(view) => { location.hash = view; }", f"#/runs/{demo}")
    expect(ann.locator("[data-not-yours]")).to_contain_text("This run is the teacher's")
    expect(ann.get_by_role("button", name="Run again")).to_be_visible()
    expect(ann.locator("[data-tags]")).to_contain_text("keep")
    for control in (ann.get_by_role("button", name="Delete"), ann.get_by_label("Add a tag"),
                    ann.get_by_role("button", name="remove tag keep"), ann.get_by_label("Note")):
        expect(control).to_have_count(0)

    # Her own: she tags it, then deletes it.
    ann.evaluate("(view) => { location.hash = view; }", f"#/runs/{own}")
    expect(ann.locator("[data-not-yours]")).to_have_count(0)
    ann.get_by_label("Add a tag").fill("mine")
    ann.get_by_label("Add a tag").press("Enter")
    expect(ann.locator("[data-tags]")).to_contain_text("mine")
    assert server.get(f"/api/runs/{own}")["tags"] == ["mine"]
    # keep is the teacher's to give: typed on her own run, the page says so and keeps none.
    ann.get_by_label("Add a tag").fill("keep")
    ann.get_by_label("Add a tag").press("Enter")
    expect(ann.locator("#message")).to_contain_text("keep_is_the_teachers")
    expect(ann.locator("#message")).to_contain_text("Ask the teacher")
    assert server.get(f"/api/runs/{own}")["tags"] == ["mine"]
    ann.locator(".actions").get_by_role("button", name="Delete").click()
    ann.locator("dialog[open]").get_by_role("button", name="Delete").click()
    expect(ann.locator(f'tr[data-run="{own}"]')).to_have_count(0)
    assert server.client.request("GET", f"/api/runs/{own}")[0] == 404

    # A study the teacher started and its budget halted: no Cancel, no Resume for her; both for the teacher.
    study = post(server, study_body(variants(1), repeats=1, budget={"max_runs": 0}))
    server.poll_until(lambda: server.get(f"/api/studies/{study['id']}")["state"] == "halted")
    for page in (ann, teacher):
        show(page, f"#/studies/{study['id']}")
        expect(page.locator("#study")).to_contain_text("halted")
    for name in ("Cancel", "Resume…"):
        expect(ann.locator("#study").get_by_role("button", name=name)).to_have_count(0)
        expect(teacher.locator("#study").get_by_role("button", name=name)).to_be_visible()

    # The teacher's page: Stop on a student's run.
    show(teacher, "#/runs")
    expect(teacher.locator(f'tr[data-run="{own_nap}"]').get_by_role("button", name="Stop")).to_be_visible()
    for run_id in (demos_nap, own_nap):
        server.client.request("POST", f"/api/runs/{run_id}/cancel")
    assert errors == []
