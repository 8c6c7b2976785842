"""Storage labels (issue 16, point 1): a ``path`` param says ``data:train.csv``; each
machine that executes the run reads it where it mounts ``data``. A named worker without
the label is refused, ``any`` waits for one that has it."""

from __future__ import annotations

from tests.helpers import graph, node
from tests.integration.test_workers_functional import enroll, read_until, start_agent

ROWS = "a,b,y\n" + "".join(f"{i},{i * 3},{i % 2}\n" for i in range(30))


def reader(ref: str) -> dict:
    return graph(node("csv", "torch.CSVDataset", path=ref, target="y"))


def test_a_label_reference_is_read_where_each_machine_mounts_it(make_server, tmp_path):
    here, there = tmp_path / "server-data", tmp_path / "worker-data"
    for folder in (here, there):
        folder.mkdir()
        (folder / "train.csv").write_text(ROWS)
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1", TROUPE_MOUNT_PATH=str(here))
    local = server.submit(reader("data:train.csv"), provenance="identity")["run_id"]
    assert server.events_until_finished(local, timeout=90)[-1]["payload"]["status"] == "succeeded"
    assert server.get(f"/api/runs/{local}/provenance")["records"][0]["ref"] == str(here / "train.csv")
    assert server.get(f"/api/runs/{local}")["graph"]["nodes"][0]["params"]["path"] == "data:train.csv"  # as sent
    for ref, code in (("data:../../etc/passwd", "mount_unavailable"), ("scratch:x.csv", "mount_unavailable")):
        assert server.submit(reader(ref), expect=400)["error"]["code"] == code
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"] + f" --mount data={there}")
    try:
        read_until(agent, "connected as gpu-a")
        remote = server.submit(reader("data:train.csv"), provenance="identity", target={"worker": "gpu-a"})["run_id"]
        assert server.events_until_finished(remote, timeout=90)[-1]["payload"]["status"] == "succeeded"
        assert server.get(f"/api/runs/{remote}/provenance")["records"][0]["ref"] == str(there / "train.csv")
        lacking = server.submit(reader("scratch:x.csv"), expect=400, target={"worker": "gpu-a"})["error"]
        assert lacking["code"] == "worker_lacks_mount" and "scratch" in lacking["message"]
        waits = server.submit(reader("scratch:x.csv"), target={"worker": "any"})["run_id"]
        anywhere = server.submit(reader("data:train.csv"), target={"worker": "any"})["run_id"]
        assert server.events_until_finished(anywhere, timeout=90)[-1]["payload"]["status"] == "succeeded"
        assert server.get(f"/api/runs/{waits}")["queue_reason"]["code"] == "no_free_worker"
        server.client.request("POST", f"/api/runs/{waits}/cancel")
    finally:
        agent.terminate()
        agent.wait(30)


def test_placement_counts_every_label_a_graph_reads(make_server, tmp_path):
    data, scratch = tmp_path / "data", tmp_path / "scratch"
    for folder in (data, scratch):
        folder.mkdir()
        (folder / "train.csv").write_text(ROWS)
    two = graph(node("a", "torch.CSVDataset", path="data:train.csv", target="y"),
                node("b", "torch.CSVDataset", path="scratch:train.csv", target="y"))
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    one = start_agent(server, tmp_path / "one", enroll(server, name="one")["command"] + f" --mount data={data}",
                      machine="one")
    both = start_agent(server, tmp_path / "both", enroll(server, name="both")["command"]
                       + f" --mount data={data} --mount scratch={scratch}", machine="both")
    try:
        read_until(one, "connected as one")
        read_until(both, "connected as both")
        lacking = server.submit(two, expect=400, target={"worker": "one"})["error"]
        assert lacking["code"] == "worker_lacks_mount" and "scratch" in lacking["message"]
        for _ in range(3):  # never on the worker with only one of the two labels
            run_id = server.submit(two, target={"worker": "any"})["run_id"]
            assert server.events_until_finished(run_id, timeout=90)[-1]["payload"]["status"] == "succeeded"
            assert server.get(f"/api/runs/{run_id}")["worker"] == "both"
    finally:
        for agent in (one, both):
            agent.terminate()
            agent.wait(30)
