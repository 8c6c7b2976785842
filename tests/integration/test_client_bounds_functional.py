"""Bounds on what a client's request can cost the server: a long list is counted before
anything compares its items, through sweeps, studies and plugin jobs alike."""

from __future__ import annotations

import pytest

from tests.helpers import graph, node


def _spec(values: list[object]) -> dict[str, object]:
    return {"method": "grid", "params": [{"node_id": "a", "param": "value", "values": values}]}


@pytest.mark.timeout(120)
def test_a_sweeps_long_list_of_values_is_refused_by_its_count_before_any_compare(shared_server):
    base = graph(node("a", "core.Constant", value=1), name="long")
    objective = {"metric": "val_loss", "direction": "minimize"}
    values = list(range(300_000))  # compared pairwise, once, this froze the server for hours
    bodies = [("/api/sweeps", {"base_graph": base, "sweep_spec": _spec(values), "objective": objective}),
              ("/api/studies", {"base_graph": base, "sweep_spec": _spec(values), "objective": objective}),
              ("/api/plugins/lab.tool/jobs", {"kind": "study", "idempotency_key": "long", "spec": {
                  "base_graph": base, "sweep_spec": _spec(values), "objective": objective}})]
    for path, body in bodies:
        status, reply = shared_server.client.request("POST", path, body, timeout=60)
        assert status == 400, reply
        assert "300000 values" in reply["error"]["message"] and reply["error"]["pointer"].endswith("/values")
    # Duplicates are still found, at the place of the second one.
    status, reply = shared_server.client.request("POST", "/api/sweeps", {
        "base_graph": base, "sweep_spec": _spec([1, 2.0, 2, 1.0, 2.0]), "objective": objective})
    assert status == 400 and reply["error"]["pointer"] == "/sweep_spec/params/0/values/4", reply
    assert "listed twice" in reply["error"]["message"]
