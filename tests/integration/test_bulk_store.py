"""The bulk path (troupe/actors/store/bulk.py) bench/history.py builds a year of runs with: a run
stored in bulk into another home reads back through the real server's API exactly as the
submitted run it copies (its row, events, metrics, the run index ``where`` and the keys
read), so a bulk-built database is what a server would have written."""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Server, edge, graph, node
from troupe.actors.store.bulk import BulkStore, FinishedRun

pytestmark = pytest.mark.timeout(120)

WHERE = "adam.value = 0.01 and metric.val_loss < 1 and type = 'core.Add'"


def _reads(server: Server, run_id: str) -> dict[str, Any]:
    where = urllib.parse.quote(WHERE)
    return {
        "row": server.get(f"/api/runs/{run_id}"),
        "events": server.get(f"/api/runs/{run_id}/events"),
        "metrics": server.get(f"/api/runs/{run_id}/metrics"),
        "where": [r["id"] for r in server.get(f"/api/runs?where={where}")["runs"]],
        "list": server.get("/api/runs?limit=5"),
        "keys": server.get("/api/runs/keys"),
    }


def test_a_bulk_stored_run_reads_back_as_the_submitted_run(tmp_path: Path) -> None:
    trial = graph(node("adam", "core.Constant", value=0.01), node("first", "core.Constant", value=0.9),
                  node("m1", "core.LogMetric", name="val_loss"), node("delta", "core.Constant", value=-0.5),
                  node("s", "core.Add"), node("m2", "core.LogMetric", name="val_loss"),
                  edges=(edge("first", "value", "m1", "value"), edge("m1", "value", "s", "a"),
                         edge("delta", "value", "s", "b"), edge("s", "sum", "m2", "value")), name="lr 0.01")
    submitted = Server(tmp_path / "submitted").start()
    try:
        run_id = submitted.submit(trial)["run_id"]
        submitted.wait_status(run_id, "succeeded")
        status, _ = submitted.client.request("PATCH", f"/api/runs/{run_id}", {"tags": ["baseline"]})
        assert status == 200
        before = _reads(submitted, run_id)
    finally:
        submitted.stop()
    assert before["where"] == [run_id]

    home = tmp_path / "bulk"
    bulk = BulkStore(home / "troupe.db", home / "runs")
    try:
        bulk.store([FinishedRun.from_stored(before["row"], before["events"]["events"])])
    finally:
        bulk.close()
    copied = Server(home).start()
    try:
        assert _reads(copied, run_id) == before
    finally:
        copied.stop()
