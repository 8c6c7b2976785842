"""Packs in one file (issue 39), through the real server, real agents and the CLI: a pack
put in TROUPE_HOME/packs is in the catalog after a restart and runs in-process, listed
by `troupe packs` with its digest; a broken one is listed with its error, refused at
submission with a code naming it, and the server runs on; an agent with --accept-packs
runs a pack's nodes with nothing installed by hand, and the changed pack after the
control plane restarts, the agent going on; one without the flag is degraded and names
what it lacks; a tampered or truncated archive is refused and nothing of it is loaded;
a run's fingerprint lists the digest of every pack it used."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.helpers import EXAMPLES
from tests.integration.test_cli_functional import cli
from tests.integration.test_workers_functional import enroll, read_until, start_agent, worker_state
from tests.tamper_proxy import TamperProxy

LABPACK = EXAMPLES / "packs" / "labpack.py"
GRAPH = json.loads((EXAMPLES / "packs" / "labpack_graph.json").read_text())


def _files_digest(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha256(f"{path.name}\0{len(data)}\0".encode() + data).hexdigest()


def _mean(server, run_id: str) -> list[float]:
    return [p["value"] for p in server.get(f"/api/runs/{run_id}/metrics")["series"]["mean"]]


def _packs_used(server, run_id: str) -> dict[str, str]:
    """The folder packs in the run's fingerprint: name -> digest."""
    def facts() -> dict | None:
        return server.get(f"/api/runs/{run_id}").get("execution_facts")

    server.poll_until(lambda: facts() is not None, timeout=30)
    packs = facts()["fingerprint"]["packs"]
    return {p["name"]: p["digest"] for p in packs if p.get("source") == "folder"}


def _restart(server) -> None:
    server.port = urlsplit(server.url).port  # the same address: its agents dial it again
    server.stop()
    server.start()


def test_a_pack_in_home_packs_runs_in_process_and_a_broken_one_is_listed(make_server, tmp_path):
    server = make_server()
    assert "labpack.scale" not in {n["type"] for n in server.get("/api/nodes")["nodes"]}
    (server.home / "packs").mkdir()
    shutil.copy(LABPACK, server.home / "packs")
    (server.home / "packs" / "broken.py").write_text("import lab_secret_library\n")
    (server.home / "packs" / "sized.py").write_text(
        "from troupe import node\n\n@node(flavor='cpu-small')\ndef half(x: float) -> float:\n    return x / 2\n")
    # What runs after the import is a user's code too: a module attribute that raises when read.
    (server.home / "packs" / "proxy.py").write_text(
        "from troupe import node\n\nclass P:\n    def __getattr__(self, name):\n        raise RuntimeError('outside "
        "of context')\n\nrequest = P()\n\n@node\ndef f(x: float) -> float:\n    return x\n")
    folder = server.home / "packs" / "folderpack"
    folder.mkdir()
    (folder / "__init__.py").write_text("from troupe import node\n\n@node\ndef g(x: float) -> float:\n    return x\n")
    _restart(server)
    types = {n["type"]: n for n in server.get("/api/nodes")["nodes"]}
    assert types["labpack.summary"]["resources"] == {"cpus": 1}
    assert [p["name"] for p in types["labpack.summary"]["outputs"]] == ["mean", "spread"]

    listed = cli(server, "packs")
    assert listed.returncode == 0, listed.stderr
    digest = _files_digest(LABPACK)
    row = next(line for line in listed.stdout.splitlines() if line.startswith("labpack"))
    assert digest[:12] in row and "labpack.scale, labpack.summary" in row and "1.0" in row, listed.stdout
    assert "broken: broken: ModuleNotFoundError: No module named 'lab_secret_library'" in listed.stdout
    assert "proxy: RuntimeError: outside of context" in listed.stdout

    # A pack an agent would refuse is not built and sent: refused from the files' sizes, or their names.
    with (folder / "weights.bin").open("wb") as out:
        out.truncate(300 * 2**20)  # sparse: no disk taken, and never read
    status, reply = server.client.request("GET", "/api/packs/folderpack/archive")
    assert (status, reply["error"]["code"]) == (409, "pack_unsendable") and "over 256 MiB" in reply["error"]["message"]
    (folder / "weights.bin").unlink()
    (folder / os.fsdecode(b"caf\xe9.txt")).write_text("data")
    status, reply = server.client.request("GET", "/api/packs/folderpack/archive")
    assert (status, reply["error"]["code"]) == (409, "pack_unsendable") and "not UTF-8" in reply["error"]["message"]

    run_id = server.submit(GRAPH)["run_id"]
    assert server.wait_status(run_id, "succeeded", timeout=60)["status"] == "succeeded"
    assert _mean(server, run_id) == [5.5]  # (3 * 2 + 5) / 2
    assert _packs_used(server, run_id) == {"labpack": digest}
    stored = server.get(f"/api/runs/{run_id}")["graph"]["nodes"]
    assert next(n for n in stored if n["id"] == "stats")["resources"] == {"cpus": 1}  # the type's ask

    sized = server.submit({"version": 1, "nodes": [
        {"id": "four", "type": "core.Constant", "params": {"value": 4}}, {"id": "half", "type": "sized.half"},
        {"id": "out", "type": "core.LogMetric", "params": {"name": "half"}}], "edges": [
        {"source": "four", "source_port": "value", "target": "half", "target_port": "x"},
        {"source": "half", "source_port": "value", "target": "out", "target_port": "value"}]})["run_id"]
    assert server.wait_status(sized, "succeeded", timeout=60)["status"] == "succeeded"
    stored = server.get(f"/api/runs/{sized}")["graph"]["nodes"]
    assert next(n for n in stored if n["id"] == "half")["resources"] == {"flavor": "cpu-small"}  # read as a node's

    refused = server.submit({"version": 1, "nodes": [{"id": "a", "type": "broken.read"}], "edges": []}, expect=400)
    assert refused["error"]["code"] == "pack_broken" and "lab_secret_library" in refused["error"]["message"]
    assert refused["error"]["pointer"] == "/graph/nodes/0/type"


def _agent(server, tmp_path: Path, name: str, *flags: str, url: str | None = None):
    """A real agent with a home of its own (no packs there), enrolled as ``name``."""
    command = enroll(server, name=name)["command"]
    if url is not None:
        command = command.replace(server.url, url)
    agent = start_agent(server, tmp_path / name, f"{command} {' '.join(flags)}", machine=f"machine-{name}",
                        TROUPE_HOME=str(tmp_path / name / "home"), TROUPE_WORKER_HEARTBEAT_S="1")
    read_until(agent, f"connected as {name}")
    return agent


@pytest.fixture
def pack_server(make_server):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    (server.home / "packs").mkdir()
    shutil.copy(LABPACK, server.home / "packs")
    _restart(server)
    return server


@pytest.mark.timeout(240)
def test_an_agent_that_accepts_packs_runs_them_and_the_changed_pack_after_a_restart(pack_server, tmp_path):
    server = pack_server
    agent = _agent(server, tmp_path, "gpu-a", "--accept-packs")
    try:
        row = worker_state(server, "gpu-a")
        assert not row["degraded"] and row["missing_node_types"] == [], row
        run_id = server.submit(GRAPH, target={"worker": "gpu-a"})["run_id"]
        assert server.wait_status(run_id, "succeeded", timeout=90)["status"] == "succeeded"
        assert _mean(server, run_id) == [5.5]
        assert _packs_used(server, run_id) == {"labpack": _files_digest(LABPACK)}
        cached = list((tmp_path / "gpu-a" / "state").rglob("labpack.py"))
        assert len(cached) == 1 and cached[0].read_bytes() == LABPACK.read_bytes(), cached

        changed = server.home / "packs" / "labpack.py"
        changed.write_text(LABPACK.read_text().replace("return x * factor", "return x * factor + 1"))
        _restart(server)
        server.poll_until(lambda: (worker_state(server, "gpu-a") or {}).get("state") == "connected", timeout=60)
        again = server.submit(GRAPH, target={"worker": "gpu-a"})["run_id"]
        assert server.wait_status(again, "succeeded", timeout=90)["status"] == "succeeded"
        assert _mean(server, again) == [6.0]  # (3 * 2 + 1 + 5) / 2: the new version ran
        assert _packs_used(server, again) == {"labpack": _files_digest(changed)}
        assert agent.poll() is None  # the same agent process all along
    finally:
        agent.terminate()
        agent.wait(30)


def test_an_agent_without_the_flag_is_degraded_and_names_what_it_lacks(pack_server, tmp_path):
    server = pack_server
    agent = _agent(server, tmp_path, "gpu-b")
    try:
        row = worker_state(server, "gpu-b")
        assert row["degraded"] and row["missing_node_types"] == ["labpack.scale", "labpack.summary"], row
        refused = server.submit(GRAPH, target={"worker": "gpu-b"}, expect=400)["error"]
        assert refused["code"] == "worker_lacks_node_types" and "labpack.scale" in refused["message"], refused
    finally:
        agent.terminate()
        agent.wait(30)


def _rewritten(archive: bytes) -> bytes:
    """The same pack, one line changed: a well-formed archive of other code."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as source, \
            tarfile.open(fileobj=out, mode="w:gz") as target:
        for member in source.getmembers():
            data = source.extractfile(member).read().replace(b"return x * factor", b"return x * factor * 100")
            member.size = len(data)
            target.addfile(member, io.BytesIO(data))
    return out.getvalue()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["tampered", "truncated"])
def test_a_tampered_or_truncated_archive_is_refused_and_nothing_of_it_loads(pack_server, tmp_path, how):
    server = pack_server
    proxy = TamperProxy(server.url, _rewritten if how == "tampered" else lambda data: data[: len(data) // 2])
    agent = _agent(server, tmp_path, "gpu-c", "--accept-packs", url=proxy.url)
    try:
        run_id = server.submit(GRAPH, target={"worker": "gpu-c"})["run_id"]
        row = server.wait_status(run_id, "failed", timeout=90)
        assert proxy.archives >= 1
        assert "pack_archive_refused: pack labpack" in row["error"], row["error"]
        assert ("not the" if how == "tampered" else "cannot be read") in row["error"], row["error"]
        state = tmp_path / "gpu-c" / "state"
        assert not list(state.rglob("labpack.py")), "nothing of a refused archive is kept"
        assert "mean" not in server.get(f"/api/runs/{run_id}/metrics")["series"]  # no node of it ran
    finally:
        agent.terminate()
        agent.wait(30)
        proxy.close()
