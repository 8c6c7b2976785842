"""The page's pictures for the README and docs/ui.md (``make screenshots``, run by hand):
one real server holding what a lab's page holds after a morning's work (three digits
trainings, a failed and a cancelled run, a sweep of nine variants, a study of three
variants twice over under max_runs 5, a worker), each view shot at 1440x900 in Chromium.
The e2e tests check the same views; this only draws them, into the folder it is given.

    python -m tests.e2e.showcase docs/images
"""

from __future__ import annotations

import copy
import sys
import tempfile
from pathlib import Path
from typing import Any

from playwright.sync_api import Page, sync_playwright

from tests.e2e.conftest import CHROMIUM, FLAGS
from tests.helpers import Server, edge, graph, node, sleeper
from tests.integration.test_training_functional import quick_digits
from tests.integration.test_workers_functional import enroll, read_until, start_agent

OBJECTIVE = {"metric": "val_loss", "direction": "minimize"}


def _digits(lr: float, hidden: str = "64,32", epochs: int = 12) -> dict[str, Any]:
    made = copy.deepcopy(quick_digits(epochs=epochs, checkpoint_every=4))
    for item in made["nodes"]:
        if item["id"] == "adam":
            item["params"]["lr"] = lr
        if item["id"] == "mlp":
            item["params"]["hidden"] = hidden
    return made


def _content(server: Server) -> dict[str, Any]:
    """What the views show; answers the ids the shots go to."""
    trained = []
    for name, lr in (("digits baseline", 0.005), ("digits fast", 0.02), ("digits slow", 0.001)):
        trained.append(server.submit({**_digits(lr), "name": name})["run_id"])
    server.client.request("PATCH", f"/api/runs/{trained[0]}", {"tags": ["baseline"], "note": "the one to beat"})
    failing = graph(node("c", "core.Constant", value=1), node("f", "core.Fail", message="the data is gone"),
                    edges=(edge("c", "value", "f", "x"),), name="a failing run")
    failed = server.submit(failing)["run_id"]
    printers = [node(f"p{i}", "core.Print", prefix=f"p{i} says ", stream="stderr" if i == 2 else "stdout")
                for i in range(3)]
    talkers = server.submit(graph(node("c", "core.Constant", value=7), *printers,
                                  edges=tuple(edge("c", "value", f"p{i}", "value") for i in range(3)),
                                  name="three printers at once"))["run_id"]
    cancelled = server.submit({**sleeper(60), "name": "stopped by hand"})["run_id"]
    server.wait_status(cancelled, "running", timeout=120)
    server.client.request("POST", f"/api/runs/{cancelled}/cancel")
    status, sweep = server.client.request("POST", "/api/sweeps", {
        "name": "lr x hidden", "base_graph": _digits(0.005, epochs=6), "objective": OBJECTIVE,
        "sweep_spec": {"method": "grid", "params": [
            {"node_id": "adam", "param": "lr", "values": [0.001, 0.005, 0.02]},
            {"node_id": "mlp", "param": "hidden", "values": ["32", "64,32", "128"]}]}})
    assert status == 201, sweep
    status, study = server.client.request("POST", "/api/studies", {
        "name": "dropout, twice each", "base_graph": _digits(0.005, epochs=4), "objective": OBJECTIVE,
        "repeats": 2, "budget": {"max_runs": 5},
        "variants": [{"name": f"dropout {p}", "params": [{"node_id": "mlp", "param": "dropout", "value": p}]}
                     for p in (0.0, 0.1, 0.3)]})
    assert status == 201, study
    server.poll_until(lambda: not server.get("/api/runs?status=queued,running&limit=500")["runs"], timeout=900)
    return {"trained": trained, "failed": failed, "talkers": talkers, "sweep": sweep["sweep_id"], "study": study["id"]}


def _shoot(tab: Page, server: Server, address: str, drawn: str, path: Path) -> None:
    tab.goto(f"{server.url}/{address}")
    tab.reload()
    tab.locator(drawn).first.wait_for()
    tab.wait_for_timeout(600)  # charts drawn after their data arrive
    tab.screenshot(path=str(path))


def _hover(tab: Page, selector: str, at: float = 0.7) -> None:
    box = tab.locator(selector).first.bounding_box()
    assert box is not None
    tab.mouse.move(box["x"] + box["width"] * at, box["y"] + box["height"] / 2)


def shoot(images: Path) -> None:
    images.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        server = Server(Path(scratch) / "home", TROUPE_WORKER_HEARTBEAT_S="1",
                        TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="2").start()
        agent = start_agent(server, Path(scratch), enroll(server, name="gpu-a")["command"])
        try:
            read_until(agent, "connected as gpu-a")
            content = _content(server)
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
                tab = browser.new_page(viewport={"width": 1440, "height": 900})
                tab.goto(server.login_url)
                tab.locator("#editor-status").get_by_text("nodes").wait_for()
                _views(tab, server, content, images)
                browser.close()
        finally:
            agent.terminate()
            agent.wait(30)
            server.stop()


def _views(tab: Page, server: Server, content: dict[str, Any], images: Path) -> None:
    trained, sweep = content["trained"], content["sweep"]
    tab.evaluate("localStorage.setItem('troupe.runs.columns', JSON.stringify("
                 "[{kind: 'param', name: 'adam.lr'}, {kind: 'metric', name: 'eval_accuracy'}]))")
    tab.goto(f"{server.url}/#/runs")
    tab.reload()
    tab.locator(f'tr[data-group="sweep:{sweep}"]').click()  # the sweep's runs, by what tells them apart
    tab.locator("#rows tr.child").first.wait_for()
    tab.wait_for_timeout(400)
    tab.screenshot(path=str(images / "runs-panel.png"))
    _shoot(tab, server, "#/runs?group_by=adam.lr&metric=val_loss", "#run-groups figure.chart.bands .u-over",
           images / "runs-grouped.png")
    _shoot(tab, server, f"#/runs/{trained[0]}", '#run-metrics figure.chart[data-series="val_loss"] .u-over',
           images / "run-page.png")
    _hover(tab, '#run-metrics figure.chart[data-series="val_loss"] .u-over')
    tab.screenshot(path=str(images / "run-page.png"))
    _shoot(tab, server, f"#/runs/{content['talkers']}", "#run-console", images / "run-console.png")
    tab.get_by_label("Show events of kind").select_option("no metrics")
    tab.locator("#run-printed").scroll_into_view_if_needed()
    tab.wait_for_timeout(400)  # the Events box is drawn once on screen
    tab.screenshot(path=str(images / "run-console.png"))
    _shoot(tab, server, f"#/compare/{','.join(trained)}", "#view figure.chart .u-over", images / "compare-runs.png")
    _hover(tab, "#view figure.chart .u-over")
    tab.screenshot(path=str(images / "compare-runs.png"))
    _shoot(tab, server, f"#/sweeps/{sweep}", "#sweep-charts .chart.parallel", images / "sweep-page.png")
    tab.locator("#sweep-charts").scroll_into_view_if_needed()
    tab.wait_for_timeout(400)
    tab.screenshot(path=str(images / "sweep-charts.png"))
    _shoot(tab, server, f"#/studies/{content['study']}", "#study h2", images / "studies-panel.png")
    tab.locator("#study .study-curves figure.chart.bands .u-over").wait_for()
    tab.locator("#study .study-curves").scroll_into_view_if_needed()
    tab.wait_for_timeout(400)
    tab.screenshot(path=str(images / "study-bands.png"))
    _shoot(tab, server, "#/workers", 'tr[data-worker="gpu-a"]', images / "workers-panel.png")
    tab.goto(f"{server.url}/#/editor")
    tab.locator("#examples").select_option("digits_mlp")
    tab.get_by_role("button", name="Tidy").click()
    tab.goto(f"{server.url}/#/runs")
    tab.locator(f'tr[data-run="{trained[1]}"]').get_by_role("button", name="Watch").click()
    tab.locator("#exec-log-lines").get_by_text("run_finished").wait_for()
    tab.screenshot(path=str(images / "editor.png"))


if __name__ == "__main__":
    shoot(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/images"))
