"""Every results view laid out so that it can be read (issue 41): the run page, compare,
a sweep, a study, the Runs list and Workers, at 1440x900 and 1024x768, with content in
them (runs with artifacts, a failed and a cancelled run, a sweep, a study, a worker). A
view fails when a table cell is narrower than its header's text, a header is cut,
anything overflows the window sideways, a word of the parallel coordinates is written
over its lines or another word, or (a results view) the toolbar shows the editor's tools
or cuts the server's line; and axe-core finds no serious or critical accessibility
violation in it (issue 64: a run page whose Console and Events boxes scroll too)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import MISSING, REASON, show
from tests.e2e.test_run_page import RESUMABLE
from tests.helpers import edge, graph, hello, node, sleeper
from tests.integration.test_workers_functional import enroll, read_until, start_agent

try:
    from axe_playwright_python.sync_playwright import Axe
except ImportError:  # pragma: no cover - the test extras install it
    Axe = None  # type: ignore[assignment,misc]  # without it only the accessibility half skips

pytestmark = pytest.mark.skipif(MISSING, reason=REASON)

# Measured in the page: what a person could not read.
# Measured in the page: what a person could not read (cut headers, cramped cells, a
# sideways overflow), as a list of sentences.
PROBLEMS = Path(__file__).with_name("layout_problems.js").read_text()
# A run whose Console and Events boxes both hold more than they show (they scroll).
TALKER = ("import json\nfor i in range(60):\n    print('line', i, 'of what the run says', flush=True)\n"
          "    print(json.dumps({'metric': 'loss', 'value': 1 / (i + 1), 'step': i + 1}), flush=True)\n")
# The editor's tools in the toolbar that a results view shows, as sentences.
EDITOR_TOOLS = """() => ['open-file', 'save-graph', 'examples', 'new-graph', 'tidy-graph', 'fit-graph',
  'run-graph', 'queue-graph', 'editor-status'].map((id) => document.getElementById(id))
  .map((e) => (e.type === 'file' ? e.closest('label') : e)).filter((e) => e.getClientRects().length > 0)
  .map((e) => `${e.id || 'open-file'} is shown`)"""
# The server's line (version and devices) cut short, as a sentence.
SERVER_CUT = """() => { const s = document.getElementById('server');
  return s.scrollWidth > s.clientWidth + 1 ? [`the server's line is cut: ${s.textContent}`] : []; }"""


def _content(server, tmp_path) -> dict[str, Any]:
    """Runs with metrics and artifacts, a failed and a cancelled one, a sweep, a study."""
    (tmp_path / "resumable.py").write_text(RESUMABLE)
    command = graph(node("job", "script.Command", argv=["{python}", "resumable.py", "{steps}", "0"],
                         vars={"steps": 4}, cwd=str(tmp_path)), name="a training with checkpoints")
    trained = [server.submit(command)["run_id"] for _ in range(2)]
    failing = graph(node("c", "core.Constant", value=1), node("f", "core.Fail", message="the data is gone"),
                    edges=(edge("c", "value", "f", "x"),), name="a failing run")
    failed = server.submit(failing)["run_id"]
    cancelled = server.submit(sleeper(60))["run_id"]
    server.wait_status(cancelled, "running")
    server.client.request("POST", f"/api/runs/{cancelled}/cancel")
    objective = {"metric": "val_loss", "direction": "minimize"}
    status, sweep = server.client.request("POST", "/api/sweeps", {
        "name": "a sweep of a", "base_graph": hello(), "objective": objective,
        "sweep_spec": {"method": "grid", "params": [{"node_id": "a", "param": "value", "values": [1, 2, 3]}]}})
    assert status == 201, sweep
    status, study = server.client.request("POST", "/api/studies", {
        "name": "a study of a", "base_graph": hello(), "objective": objective, "repeats": 2,
        "budget": {"max_runs": 3},
        "variants": [{"name": name, "params": [{"node_id": "a", "param": "value", "value": value}]}
                     for name, value in (("low", 1), ("high", 5))]})
    assert status == 201, study
    for run_id in [*trained, failed, cancelled]:
        server.wait_status(run_id, server.get(f"/api/runs/{run_id}")["status"] if run_id == cancelled else
                          "failed" if run_id == failed else "succeeded", timeout=60)
    for row in server.get("/api/runs?status=queued,running&limit=500")["runs"]:
        server.wait_status(row["id"], "succeeded", timeout=60)
    (tmp_path / "talker.py").write_text(TALKER)
    talker = server.submit(graph(node("job", "script.Command", argv=["{python}", "talker.py"], cwd=str(tmp_path)),
                                 name="a run that prints and records"))["run_id"]
    server.wait_status(talker, "succeeded", timeout=60)
    return {"run": trained[0], "compare": f"{trained[0]},{trained[1]}", "sweep": sweep["sweep_id"],
            "study": study["id"], "talker": talker}


def _views(content: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(name, address, what shows it is drawn)."""
    return [("run page", f"#/runs/{content['run']}", "#run-params table"),
            ("run page with a console and events", f"#/runs/{content['talker']}", "#run-console:not(:empty)"),
            ("compare", f"#/compare/{content['compare']}", "table.compare"),
            ("sweep", f"#/sweeps/{content['sweep']}", "#sweep-charts .chart.parallel"),
            ("study", f"#/studies/{content['study']}", "#study h2"),
            ("runs list", "#/runs", "#rows tr"),
            ("runs list filtered and grouped",
             "#/runs?where=status%20!%3D%20'failed'&group_by=job.vars.steps&metric=loss",
             "#run-groups figure.chart.bands"),
            ("workers", "#/workers", "#worker-rows tr"),
            ("editor", "#/editor", "#exec-log-lines")]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("width, height", [(1440, 900), (1024, 768)])
def test_every_results_view_can_be_read_and_has_no_serious_accessibility_violation(open_page, tmp_path, width,
                                                                                    height):
    server, tab, errors = open_page(width=width, TROUPE_DATA_ROOTS=str(tmp_path), TROUPE_WORKER_HEARTBEAT_S="1")
    tab.set_viewport_size({"width": width, "height": height})
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"])
    try:
        read_until(agent, "connected as gpu-a")
        content = _content(server, tmp_path)
        found: dict[str, list[str]] = {}
        # The Runs list with two columns a person picked (kept in the browser).
        tab.evaluate("localStorage.setItem('troupe.runs.columns', JSON.stringify("
                     "[{kind: 'param', name: 'job.vars.steps'}, {kind: 'metric', name: 'val_loss'}]))")
        for name, address, drawn in _views(content):
            tab.goto(f"{server.url}/{address}")
            tab.reload()  # a change of the address alone is no fresh page
            tab.locator(drawn).first.wait_for()
            problems = tab.evaluate(PROBLEMS)
            assert isinstance(problems, list), problems  # the function ran and answered
            if name != "editor":  # a results view shows what belongs to it, the server's line whole
                problems += tab.evaluate(EDITOR_TOOLS) + tab.evaluate(SERVER_CUT)
            else:
                assert "run-graph is shown" in tab.evaluate(EDITOR_TOOLS)  # the check sees them where they are
            if Axe is not None:
                results = Axe().run(tab, options={"resultTypes": ["violations"]})
                problems += [f"axe {v['id']} ({v['impact']}): {v['help']}: "
                             + "; ".join(" ".join(n["target"]) for n in v["nodes"][:4])
                             for v in results.response["violations"] if v["impact"] in ("serious", "critical")]
            if problems:
                found[name] = problems
        assert found == {}, "\n".join(f"{view}: {problem}" for view, problems in found.items() for problem in problems)
        if Axe is None:
            pytest.skip("axe-playwright-python is not installed: the accessibility half was not checked")
        assert errors == []
    finally:
        agent.terminate()
        agent.wait(30)


@pytest.mark.timeout(120)
def test_a_students_toolbar_keeps_to_one_line_at_1024_with_a_long_name_and_a_run_going(open_page):
    server, tab, errors = open_page(width=1024)
    running = server.submit(sleeper(60))["run_id"]
    server.wait_status(running, "running")
    status, made = server.client.request("POST", "/api/login-links", {"uses": 1})
    assert status == 201, made
    tab = tab.context.browser.new_page(viewport={"width": 1024, "height": 768})  # a student's own browser
    tab.on("pageerror", lambda error: errors.append(str(error)))
    tab.goto(made["login_url"])  # a student's page: You: and Log out besides
    tab.locator("#editor-status").get_by_text("nodes").wait_for()
    name = "Maria Fernanda Gonzalez de la Vega Soto"  # 39 characters: a name is at most 40
    tab.locator("#my-name").click()
    tab.locator("dialog[open] input[name=name]").fill(name)
    tab.locator("dialog[open]").get_by_role("button", name="Save").click()
    # Saved once the server answered the name (the page's "1 run active" says nothing of it).
    tab.wait_for_function("(want) => document.getElementById('my-name').title === want", arg=f"You: {name}")
    for view in ("#/editor", "#/runs"):
        show(tab, view)
        assert tab.evaluate(PROBLEMS) == [], view
        said = tab.evaluate("(() => { const s = document.getElementById('editor-status'); "
                            "return [Math.round(s.getBoundingClientRect().width), "
                            "document.getElementById('my-name').title]; })()")
        # The editor's words keep room in the editor (a results view leaves them out); the name is whole.
        assert (said[0] >= 100 if view == "#/editor" else said[0] == 0) and said[1] == f"You: {name}", said
    server.client.request("POST", f"/api/runs/{running}/cancel")
    assert errors == []
