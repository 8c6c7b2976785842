"""A folder pack edited while the server runs (issue 65, section 5), through the real
server and a real agent that accepts packs: before the edit both paths run the version
the server loaded; after it, a run of the pack is refused alike in-process and on the
worker (409 pack_changed at submission, and a run queued before the edit fails at its
start with the same code), while a graph without the pack runs on; the pack put back as
it was runs again; and a run's fingerprint names the pack's version and digest."""

from __future__ import annotations

import pytest

from tests.helpers import hello, sleeper
from tests.integration.test_packs_functional import GRAPH, LABPACK, _agent, _files_digest, _mean, _restart

ON_WORKER = {"worker": "gpu-a"}


@pytest.fixture
def pack_server(make_server):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1", TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="1")
    (server.home / "packs").mkdir()
    (server.home / "packs" / "labpack.py").write_bytes(LABPACK.read_bytes())
    _restart(server)
    return server


def _both(server, **target) -> str:
    run_id = server.submit(GRAPH, **target)["run_id"]
    assert server.wait_status(run_id, "succeeded", timeout=90)["status"] == "succeeded"
    assert _mean(server, run_id) == [5.5]  # the version the server loaded
    return run_id


def _queued_behind_a_sleeper(server, **target) -> tuple[str, str]:
    """A run of the pack that waits for its slot behind a sleeper (cpu: one at a time)."""
    busy = server.submit(sleeper(60), **target)["run_id"]
    server.wait_status(busy, "running", timeout=60)
    waiting = server.submit(GRAPH, **target)["run_id"]
    assert server.get(f"/api/runs/{waiting}")["status"] == "queued"
    return busy, waiting


@pytest.mark.timeout(300)
def test_an_edited_pack_is_refused_alike_in_process_and_on_a_worker_until_a_restart(pack_server, tmp_path):
    server = pack_server
    agent = _agent(server, tmp_path, "gpu-a", "--accept-packs")
    try:
        for target in ({}, {"target": ON_WORKER}):
            run_id = _both(server, **target)
            (pack,) = [p for p in server.get(f"/api/runs/{run_id}")["execution_facts"]["fingerprint"]["packs"]
                       if p.get("source") == "folder"]
            assert (pack["name"], pack["version"], pack["digest"]) == ("labpack", "1.0", _files_digest(LABPACK))
        waiting = [_queued_behind_a_sleeper(server), _queued_behind_a_sleeper(server, target=ON_WORKER)]

        edited = server.home / "packs" / "labpack.py"
        edited.write_text(LABPACK.read_text().replace("return x * factor", "return x * factor + 1"))
        for target in ({}, {"target": ON_WORKER}):
            refused = server.submit(GRAPH, expect=409, **target)["error"]
            assert refused["code"] == "pack_changed" and "restart the server" in refused["message"], refused
            other = server.submit(hello(), **target)["run_id"]  # a graph without the pack runs on
        for busy, queued in waiting:  # queued before the edit: fails at its start, wherever it was to run
            server.client.request("POST", f"/api/runs/{busy}/cancel")
            row = server.wait_status(queued, "failed", timeout=90)
            assert "labpack's files changed" in row["error"], row
            assert server.events_until_finished(queued)[-1]["payload"]["reason"] == "pack_changed"
        assert server.wait_status(other, "succeeded", timeout=60)["status"] == "succeeded"

        edited.write_bytes(LABPACK.read_bytes())  # put back as the server loaded it: runs again
        for target in ({}, {"target": ON_WORKER}):
            _both(server, **target)
    finally:
        agent.terminate()
        agent.wait(30)
