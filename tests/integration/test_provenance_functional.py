"""Provenance (issue 16, point 3): with ``options.provenance``, a node that reads a
dataset records what it read at that moment, by identity or by content, on both paths."""

from __future__ import annotations

import hashlib

from tests.helpers import graph, node
from tests.integration.test_workers_functional import enroll, read_until, start_agent


def reader(path) -> dict:
    return graph(node("csv", "torch.CSVDataset", path=str(path), target="y"))


def test_identity_and_content_are_recorded_per_reading_node_on_both_paths(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1", TROUPE_DATA_ROOTS=str(tmp_path))
    data = tmp_path / "data.csv"
    data.write_text("a,b,y\n" + "".join(f"{i},{i * 2},{i % 2}\n" for i in range(40)))
    by_content = server.submit(reader(data), provenance="content")["run_id"]
    by_identity = server.submit(reader(data), provenance="identity")["run_id"]
    plain = server.submit(reader(data))["run_id"]
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"], TROUPE_DATA_ROOTS=str(tmp_path))
    try:
        read_until(agent, "connected as gpu-a")
        remote = server.submit(reader(data), provenance="content", target={"worker": "gpu-a"})["run_id"]
        for run_id in (by_content, by_identity, plain, remote):
            assert server.events_until_finished(run_id, timeout=90)[-1]["payload"]["status"] == "succeeded"
    finally:
        agent.terminate()
        agent.wait(30)
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    for run_id in (by_content, remote):
        (record,) = server.get(f"/api/runs/{run_id}/provenance")["records"]
        assert (record["node_id"], record["kind"], record["ref"], record["mode"]) == ("csv", "dataset", str(data),
                                                                                        "content")
        assert record["sha256"] == digest and record["size"] == data.stat().st_size and "mtime" not in record
    identity = server.get(f"/api/runs/{by_identity}/provenance")
    assert identity["mode"] == "identity" and identity["records"][0]["mtime"] == data.stat().st_mtime
    assert "sha256" not in identity["records"][0]
    assert server.get(f"/api/runs/{plain}/provenance") == {"run_id": plain, "mode": None, "records": []}


def test_provenance_takes_a_kind_not_a_flag(shared_server):
    error = shared_server.submit(reader("/nowhere.csv"), expect=400, provenance=True)["error"]
    assert error["pointer"] == "/options/provenance"
    assert "identity" in error["message"] and "content" in error["message"]
