"""The New sweep dialog, the Studies panel and the Workers panel in a real browser."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import MISSING, REASON, confirm, screenshot, show
from tests.helpers import hello
from tests.integration.test_studies_functional import post, study_body, variants, wait_state
from tests.integration.test_workers_functional import read_until, start_agent

pytestmark = pytest.mark.skipif(MISSING, reason=REASON)
expect = pytest.importorskip("playwright.sync_api", reason=REASON).expect


def test_the_new_sweep_dialog_queues_a_sweep_of_the_editor_graph_and_ranks_it(open_page):
    server, tab, errors = open_page()  # the editor opens on the hello example
    tab.get_by_role("button", name="Sweeps").click()
    tab.get_by_role("button", name="New sweep…").click()
    dialog = tab.locator("dialog[open]")
    dialog.locator("[data-field=param]").select_option(label="a.value (float)")
    dialog.locator("[data-field=values]").fill("3, 1, 2")
    expect(dialog.locator("#sweep-preview")).to_have_text("It queues 3 runs.")  # before anything is queued
    dialog.locator('input[name="name"]').fill("from the dialog")
    dialog.get_by_role("button", name="Queue the sweep").click()
    dialog.wait_for(state="hidden")
    sweeps = server.get("/api/sweeps")["sweeps"]
    assert [(s["name"], s["total"]) for s in sweeps] == [("from the dialog", 3)]
    tab.get_by_text("from the dialog — finished").wait_for(timeout=30_000)
    ranks = tab.locator("#ranking-rows tr")
    expect(ranks).to_have_count(3)
    expect(ranks.nth(0)).to_contain_text("4.000")  # a=1 gives val_loss 1 + 3, the smallest
    expect(ranks.nth(2)).to_contain_text("6.000")

    tab.get_by_role("button", name="New sweep…").click()
    dialog.locator("[data-field=kind]").select_option("range")  # min, max, how many, log: as the API takes them
    dialog.locator("[data-field=min]").fill("0.001")
    dialog.locator("[data-field=max]").fill("0.1")
    dialog.locator("[data-field=count]").fill("3")
    dialog.locator("[data-field=log]").check()
    expect(dialog.locator("#sweep-preview")).to_have_text("It queues 3 runs.")
    dialog.get_by_role("button", name="Add a param").click()  # a second param: the grid grows
    dialog.locator(".sweep-param").nth(1).locator("[data-field=values]").fill("1, 2")
    expect(dialog.locator("#sweep-preview")).to_have_text("It queues 6 runs.")
    dialog.locator(".sweep-param").nth(1).get_by_role("button", name="Remove").click()
    expect(dialog.locator("#sweep-preview")).to_have_text("It queues 3 runs.")  # and shrinks again
    dialog.locator(".sweep-param").nth(0).get_by_role("button", name="Remove").click()
    expect(dialog.locator("#sweep-preview")).to_have_text("Add a param.")
    dialog.get_by_role("button", name="Cancel").click()
    tab.get_by_role("button", name="New sweep…").click()
    dialog.locator("[data-field=values]").fill("1, x")
    dialog.get_by_role("button", name="Queue the sweep").click()
    expect(dialog.locator(".message")).to_contain_text("is not a number")  # refused in the dialog
    dialog.get_by_role("button", name="Cancel").click()
    assert errors == []


def test_the_studies_panel_shows_the_budget_and_resumes_a_halted_study(open_page):
    server, tab, errors = open_page()
    study = post(server, study_body(variants(1, 2), repeats=2, seed=3, budget={"max_runs": 2}))
    wait_state(server, study["id"], "halted")
    tab.get_by_role("button", name="Studies").click()
    row = tab.locator(f'tr[data-study="{study["id"]}"]')
    expect(row).to_contain_text("halted (it started as many runs as its budget allows (max_runs))")
    expect(row).to_contain_text("2 of 2 runs")
    row.click()
    expect(tab.locator("#study")).to_contain_text("v1")
    expect(tab.locator('#study [data-limit="max_runs"]')).to_have_text("2 of 2")
    # Seeded, in the server's process: the page says its attempts run one at a time, and what to do.
    expect(tab.locator('#study [data-note="seeded_runs_one_at_a_time"]')).to_contain_text("local agent")
    tab.locator("#study").get_by_role("button", name="Resume…").click()
    dialog = tab.locator("dialog[open]")
    expect(dialog).to_contain_text("Raise the limit that stopped it")
    dialog.locator('input[name="max_runs"]').fill("4")
    confirm(tab, "Resume")
    expect(row).to_contain_text("finished", timeout=30_000)
    expect(tab.locator("#study tbody tr").first).to_contain_text("v1")  # ranked best first: 1 + 3 < 2 + 3
    assert server.get(f"/api/studies/{study['id']}")["used"]["runs"] == 4
    assert errors == []


def test_add_a_worker_from_the_panel_and_see_it_connect(open_page, tmp_path):
    server, tab, errors = open_page(TROUPE_WORKER_HEARTBEAT_S="1")
    tab.get_by_role("button", name="Workers").click()
    tab.get_by_role("button", name="Add worker…").click()
    dialog = tab.locator("dialog[open]")
    dialog.locator('input[name="name"]').fill("gpu-a")
    dialog.get_by_role("button", name="Create join command").click()
    command = dialog.locator("[data-join]").inner_text()
    assert command.startswith("troupe agent start --url ") and "--token" in command
    expect(dialog).to_contain_text("works 1 time")
    dialog.get_by_role("button", name="Close").click()
    agent = start_agent(server, tmp_path, command)
    try:
        read_until(agent, "connected as gpu-a")
        row = tab.locator('tr[data-worker="gpu-a"]')
        expect(row).to_contain_text("connected")
        expect(row).to_contain_text("Fake 16G")
        row.get_by_role("button", name="Drain").click()
        expect(tab.locator("dialog[open]")).to_contain_text("finish normally")
        confirm(tab, "Drain")
        expect(row).to_contain_text("draining")
        row.get_by_role("button", name="Remove").click()
        expect(tab.locator("dialog[open]")).to_contain_text("end interrupted (worker_lost)")
        confirm(tab, "Remove")
        expect(row).to_have_count(0)
        assert agent.wait(30) == 1  # its credential is revoked: the agent stops
    finally:
        if agent.poll() is None:
            agent.terminate()
            agent.wait(30)
    assert errors == []


def test_share_a_card_by_memory_and_queue_a_run_on_it_with_an_estimated_budget(open_page, tmp_path):
    server, tab, errors = open_page(TROUPE_WORKER_HEARTBEAT_S="1")
    card = {"uuid": "GPU-e2e", "name": "Sim 24G", "index": 0, "memory_total_mib": 24576, "memory_free_mib": 24000}
    agent = start_agent(server, tmp_path, server.client.request(
        "POST", "/api/workers/enrollments", {"name": "gpu-a"})[1]["command"], cards=(card,))
    try:
        read_until(agent, "connected as gpu-a")
        tab.get_by_role("button", name="Workers").click()
        row = tab.locator('tr[data-worker="gpu-a"]')
        row.get_by_role("button", name="cuda:0 sharing…").click()
        dialog = tab.locator("dialog[open]")
        dialog.locator('select[name="sharing"]').select_option("memory")
        expect(dialog).to_contain_text("fails alone with an out-of-memory error")
        dialog.locator('input[name="reserved"]').fill("1024")
        confirm(tab, "Save")
        expect(row).to_contain_text("cuda:0 shared: 0.0 of 23.0 GiB promised (0 runs)")
        screenshot(tab, "workers-shared-card.png")

        show(tab, "#/editor")  # Queue on… is the editor's: a results view leaves it out
        tab.get_by_role("button", name="Queue on…").click()
        dialog = tab.locator("dialog[open]")
        dialog.locator('select[name="device"]').select_option("auto")
        dialog.locator('select[name="target"]').select_option("gpu-a")
        expect(dialog.locator("#queue-explain")).to_contain_text("gpu-a cuda:0 is shared by memory")
        dialog.get_by_role("button", name="Estimate").click()
        expect(dialog.locator("#budget-note")).to_contain_text("an estimate, not a measurement")
        assert float(dialog.locator('input[name="memory_gib"]').input_value()) > 0
        confirm(tab, "Queue")
        run = server.get("/api/runs?limit=1")["runs"][0]
        server.events_until_finished(run["id"])
        detail = server.get(f"/api/runs/{run['id']}")
        assert detail["memory_budget_source"] == "declared" and detail["worker"] == "gpu-a"
        show(tab, "#/runs")
        tab.locator(f'tr[data-run="{run["id"]}"]').click()
        expect(tab.locator("#run-head .facts")).to_contain_text(f"{detail['memory_budget_mib']} MiB (declared)")
        expect(tab.locator("#run-head .facts")).to_contain_text("Peak memory")
    finally:
        agent.terminate()
        agent.wait(30)
    assert errors == []


def test_queue_a_run_on_the_one_shot_pool_and_the_batch_agent_exits_after_it(open_page, tmp_path):
    server, tab, errors = open_page(TROUPE_WORKER_HEARTBEAT_S="1")
    command = server.client.request("POST", "/api/workers/enrollments", {"name": "batch-a"})[1]["command"]
    agent = start_agent(server, tmp_path, command + " --one-shot")
    try:
        read_until(agent, "connected as batch-a")
        tab.get_by_role("button", name="Workers").click()
        expect(tab.locator('tr[data-worker="batch-a"]')).to_contain_text("one-shot: takes one run, then exits")
        show(tab, "#/editor")
        tab.get_by_role("button", name="Queue on…").click()
        dialog = tab.locator("dialog[open]")
        dialog.locator('select[name="target"]').select_option("one-shot")
        expect(dialog.locator("#queue-explain")).to_contain_text("for a one-shot agent")
        confirm(tab, "Queue")
        assert agent.wait(60) == 0
        run = server.get("/api/runs?limit=1")["runs"][0]
        assert (run["queue_key"], run["status"]) == ("one-shot/cpu", "succeeded")
    finally:
        if agent.poll() is None:
            agent.terminate()
            agent.wait(30)
    assert errors == []


def test_add_a_worker_over_ssh_from_the_dialog_and_see_why_it_failed(open_page, tmp_path):
    from tests.sshd import missing, start_sshd

    if missing() is not None:
        pytest.skip(missing())
    sshd = start_sshd(tmp_path / "sshd")
    try:
        server, tab, errors = open_page()
        tab.get_by_role("button", name="Workers").click()
        tab.get_by_role("button", name="Add worker…").click()
        tab.locator("dialog[open]").get_by_role("button", name="Add it over SSH…").click()
        dialog = tab.locator("dialog[open]")
        for field, value in (("name", "far"), ("host", "127.0.0.1"), ("user", "root"), ("port", str(sshd.port)),
                             ("identity_file", str(sshd.key))):
            dialog.locator(f'input[name="{field}"]').fill(value)
        confirm(tab, "Connect")
        # This server's ssh has never seen the private sshd's host key: no retry can fix that.
        row = tab.locator('tr[data-worker="far"]')
        server.poll_until(lambda: any(w["state"] == "failed" for w in server.get("/api/workers")["workers"]))
        tab.get_by_role("button", name="Workers").click()
        expect(row).to_contain_text("failed: the remote host's key does not match the known one")
        row.get_by_role("button", name="Remove").click()
        confirm(tab, "Remove")
        expect(row).to_have_count(0)
        assert errors == []
    finally:
        sshd.stop()


def test_the_inspector_reads_a_worker_runs_outputs_through_its_connection(open_page, tmp_path):
    server, tab, errors = open_page(view="#/editor", TROUPE_WORKER_HEARTBEAT_S="1")
    command = server.client.request("POST", "/api/workers/enrollments", {"name": "gpu-a"})[1]["command"]
    agent = start_agent(server, tmp_path, command)
    try:
        read_until(agent, "connected as gpu-a")
        tab.reload()
        tab.locator("#editor-status").get_by_text("nodes").wait_for()
        tab.locator("#examples").select_option("hello")
        tab.get_by_role("button", name="Queue on…").click()
        dialog = tab.locator("dialog[open]")
        dialog.locator('select[name="target"]').select_option("gpu-a")
        dialog.locator('input[name="record_outputs"]').check()
        confirm(tab, "Queue")
        run = server.get("/api/runs?limit=1")["runs"][0]
        assert server.events_until_finished(run["id"], timeout=60)[-1]["payload"]["status"] == "succeeded"
        tab.locator('g[data-node="s"] text.title').click()
        expect(tab.locator("#node-outputs")).to_contain_text('"sum": 5')
        expect(tab.locator("#node-outputs")).to_contain_text(f"run {run['id'][:8]}")
    finally:
        agent.terminate()
        agent.wait(30)
    server.poll_until(lambda: server.get("/api/workers")["workers"][0]["state"] == "disconnected")
    tab.locator('g[data-node="a"] text.title').click()
    tab.locator('g[data-node="s"] text.title').click()
    expect(tab.locator("#node-outputs")).to_contain_text("is not connected")
    assert [e for e in errors if "503" not in e] == []


def test_the_new_sweep_dialog_offers_string_params_and_a_range_a_log_scale_takes(open_page):
    _, tab, errors = open_page(view="#/editor")
    tab.locator("#examples").select_option("digits_mlp")
    show(tab, "#/sweeps")
    tab.get_by_role("button", name="New sweep…").click()
    dialog = tab.locator("dialog[open]")
    dialog.locator("[data-field=param]").select_option(label="mlp.hidden (string)")
    expect(dialog.locator("[data-field=values]")).to_have_value("64,32")  # an MLP's layers, commas and all
    dialog.locator("[data-field=values]").fill("64,32; 128; 32,32,32")
    expect(dialog.locator("#sweep-preview")).to_have_text("It queues 3 runs.")
    dialog.locator("[data-field=param]").select_option(label="adam.lr (float)")
    dialog.locator("[data-field=kind]").select_option("range")
    assert float(dialog.locator("[data-field=min]").input_value()) > 0  # log scale can start there
    assert errors == []


def test_results_take_the_window_by_their_address_and_the_editor_keeps_its_graph(open_page):
    server, tab, errors = open_page(view="#/editor")
    nodes = tab.locator("#nodes .node").count()
    assert nodes > 0  # the hello example
    tab.goto(f"{server.url}/#/workers")
    expect(tab.locator("#workers")).to_be_visible()
    expect(tab.locator("#canvas")).to_be_hidden()  # the panel has the whole window
    results = tab.locator("#results").bounding_box()
    assert results is not None and results["height"] > 700 and results["width"] > 1300
    tab.get_by_role("link", name="Editor").click()
    expect(tab.locator("#canvas")).to_be_visible()
    expect(tab.locator("#nodes .node")).to_have_count(nodes)  # the graph was kept
    tab.get_by_role("link", name="Results").click()
    expect(tab.locator("#canvas")).to_be_hidden()
    tab.reload()  # the address keeps the view
    expect(tab.locator("#workers")).to_be_visible()
    expect(tab.locator("#canvas")).to_be_hidden()
    assert errors == []


def test_the_teacher_revoking_this_browsers_own_session_is_logged_out_without_a_page_error(open_page):
    _server, tab, errors = open_page(view="#/people")
    rows = tab.locator("#session-rows tr")
    expect(rows).to_have_count(1)  # this browser, the teacher's
    rows.first.get_by_role("button", name="Revoke").click()
    # The next read is refused: the page reloads as what it is now, read-only on loopback.
    expect(tab.locator(".login-banner")).to_contain_text("Read-only", timeout=15_000)
    expect(tab.locator("#log-out")).to_be_hidden()
    assert not [e for e in errors if "teacher_only" in e or "login_required" in e], errors


def test_a_view_whose_reads_land_after_the_address_moved_on_draws_nothing(open_page):
    server, tab, errors = open_page()
    first, second = (server.submit(hello())["run_id"] for _ in range(2))
    server.wait_status(second, "succeeded")
    server.wait_status(first, "succeeded")
    held: list = []  # metrics reads, answered only once the address moved on (a slow link)
    tab.route("**/api/runs/*/metrics*", lambda route: held.append(route))
    tab.evaluate("(to) => { location.hash = to; }", f"#/compare/{first},{second}")
    while len(held) < 2:
        tab.wait_for_timeout(50)
    tab.evaluate("(to) => { location.hash = to; }", f"#/runs/{first}")  # before Compare has its metrics
    expect(tab.locator("#run-head")).to_be_visible()
    for route in held:
        route.continue_()
    tab.unroute("**/api/runs/*/metrics*")
    tab.wait_for_timeout(1000)  # the late reads land
    expect(tab.locator("#run-head")).to_be_visible()  # the run's page stays, as its address says
    expect(tab.get_by_role("heading", name="Comparing 2 runs")).to_have_count(0)
    assert errors == []
