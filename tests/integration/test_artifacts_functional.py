"""Artifacts of worker runs come back (issue 16, point 1): through the control plane
(transfer), onto the control plane's own storage label when the worker holds it too
(mount), each row with its backend, size and sha256, and listed only once its file is
whole: a transfer cut short, or one whose bytes do not match, leaves no file and no row."""

from __future__ import annotations

import hashlib
import socket
import urllib.parse

import pytest

from tests.helpers import hello, sleeper
from tests.integration.test_training_functional import quick_digits
from tests.integration.test_workers_functional import enroll, read_until, start_agent

CHECKPOINTS = ["checkpoints/trainer-epoch-1.pt", "checkpoints/trainer-epoch-2.pt"]


def trained_on(server, worker: str) -> tuple[str, list[dict]]:
    run_id = server.submit(quick_digits(epochs=2, checkpoint_every=1), target={"worker": worker})["run_id"]
    events = server.events_until_finished(run_id, timeout=180)
    assert events[-1]["payload"]["status"] == "succeeded", events[-3:]
    everything = server.get(f"/api/runs/{run_id}")["artifacts"]
    artifacts = [a for a in everything if a["kind"] == "checkpoint"]  # beside each, its training state
    assert [a["path"] for a in artifacts] == CHECKPOINTS
    assert {a["state"] for a in everything} == {"stored"}
    announced = [e["payload"] for e in events if e["type"] == "artifact" and e["payload"]["kind"] == "checkpoint"]
    assert [(a["path"], a["sha256"]) for a in announced] == [(a["path"], a["sha256"]) for a in artifacts]
    for artifact in artifacts:
        body = server.download(f"/api/runs/{run_id}/artifacts/{artifact['id']}")
        assert (len(body), hashlib.sha256(body).hexdigest()) == (artifact["size"], artifact["sha256"])
    return run_id, artifacts


def test_a_worker_runs_checkpoints_come_back_by_transfer_and_by_mount(make_server, tmp_path):
    shared = tmp_path / "nas"
    shared.mkdir()
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1", TROUPE_MOUNT_PATH=str(shared))
    far = start_agent(server, tmp_path / "far", enroll(server, name="far")["command"], machine="far")
    near = start_agent(server, tmp_path / "near", enroll(server, name="near")["command"] + f" --mount data={shared}",
                       machine="near")
    try:
        read_until(far, "connected as far")
        read_until(near, "connected as near")
        run_id, artifacts = trained_on(server, "far")
        assert {(a["backend"], a["label"]) for a in artifacts} == {("transfer", None)}
        assert (server.home / "runs" / run_id / CHECKPOINTS[0]).is_file()
        run_id, artifacts = trained_on(server, "near")
        assert {(a["backend"], a["label"]) for a in artifacts} == {("mount", "data")}
        copied = shared / "troupe-artifacts" / run_id / CHECKPOINTS[1]
        assert hashlib.sha256(copied.read_bytes()).hexdigest() == artifacts[1]["sha256"]
    finally:
        for agent in (far, near):
            agent.terminate()
            agent.wait(30)


def _put(server, run_id: str, path: str, body: bytes, sha256: str, length: int | None = None,
         token: str | None = None, header: bytes = b"") -> tuple[int, bytes]:
    """A worker's PUT by hand; ``length`` larger than the body: the sender stops midway;
    ``header``: one more header line, as raw bytes."""
    parsed = urllib.parse.urlsplit(server.url)
    head = (f"PUT /api/runs/{run_id}/artifacts?{urllib.parse.urlencode({'path': path, 'kind': 'checkpoint'})} "
            f"HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token or server.token}\r\n"
            f"X-Troupe-Sha256: {sha256}\r\nContent-Length: {length or len(body)}\r\nConnection: close\r\n\r\n")
    with socket.create_connection((parsed.hostname, parsed.port), timeout=30) as conn:
        conn.sendall(head.encode()[:-2] + header + b"\r\n" + body)
        if length is not None and length > len(body):
            conn.shutdown(socket.SHUT_WR)  # cut short: the rest never comes
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    status = int(reply.split(b" ", 2)[1]) if reply else 0
    return status, reply


def test_a_transfer_cut_short_or_corrupted_leaves_no_row(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"])
    other = enroll(server, name="gpu-b")
    try:
        read_until(agent, "connected as gpu-a")
        run_id = server.submit(sleeper(60), target={"worker": "gpu-a"})["run_id"]
        server.wait_status(run_id, "running")
        body = bytes(range(256)) * 4096  # 1 MiB
        good = hashlib.sha256(body).hexdigest()
        status, _ = _put(server, run_id, "checkpoints/cut.pt", body[: len(body) // 2], good, length=len(body))
        assert status in (0, 400)  # the reply may not reach a sender that stopped sending
        status, reply = _put(server, run_id, "checkpoints/bad.pt", body[:-1] + b"x", good)
        assert status == 400 and b"artifact_refused" in reply
        status, reply = _put(server, run_id, "../escape.pt", body, good)
        assert status == 400 and b'"?path"' in reply
        credential = _credential(server, other)
        status, reply = _put(server, run_id, "checkpoints/theirs.pt", body, good, token=credential)
        assert status == 401 and b"does not execute this run" in reply
        assert server.get(f"/api/runs/{run_id}")["artifacts"] == []
        folder = server.home / "runs" / run_id / "checkpoints"
        assert sorted(p.name for p in folder.iterdir()) == []  # no partial file left behind
        status, reply = _put(server, run_id, "checkpoints/whole.pt", body, good)
        assert status == 201, reply
        listed = server.get(f"/api/runs/{run_id}")["artifacts"]
        assert [(a["path"], a["backend"], a["size"], a["sha256"]) for a in listed] == [
            ("checkpoints/whole.pt", "transfer", len(body), good)]
        assert server.download(f"/api/runs/{run_id}/artifacts/{listed[0]['id']}") == body
        server.client.request("POST", f"/api/runs/{run_id}/cancel")
        server.events_until_finished(run_id, timeout=60)
        # A file its worker kept while the control plane was away still comes after the
        # run ended: stored, with its artifact event after the run's last.
        status, reply = _put(server, run_id, "checkpoints/late.pt", body, good)
        assert status == 201, reply
        late = server.get(f"/api/runs/{run_id}")["artifacts"][-1]
        assert (late["path"], late["state"], late["sha256"]) == ("checkpoints/late.pt", "stored", good)
        events = server.get(f"/api/runs/{run_id}/events")["events"]
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        assert events[-1]["type"] == "artifact" and events[-1]["payload"]["path"] == "checkpoints/late.pt"
        # A worker that gives up says why in a header, which may hold any bytes.
        status, reply = _put(server, run_id, "checkpoints/lost.pt", b"", good,
                             header=b"X-Troupe-Artifact-Failed: disk \xff gone\r\n")
        assert status == 200, reply
        lost = server.get(f"/api/runs/{run_id}")["artifacts"][-1]
        assert (lost["path"], lost["state"], lost["reason"]) == ("checkpoints/lost.pt", "failed", "disk ? gone")
    finally:
        agent.terminate()
        agent.wait(30)
    status, reply = server.client.request("GET", f"/api/runs/{run_id}/artifacts/999")
    assert (status, reply["error"]["code"]) == (404, "artifact_not_found")


def _credential(server, enrollment: dict) -> str:
    token = enrollment["command"].split("--token ")[1].split()[0]
    status, reply = server.anonymous.request("POST", "/api/workers/credentials",
                                             {"token": token, "machine_id": "machine-b"})
    assert status == 201, reply
    return str(reply["credential"])


def test_a_give_up_on_a_file_of_a_run_that_ran_here_is_refused(shared_server):
    run_id = shared_server.submit(hello())["run_id"]
    shared_server.wait_status(run_id, "succeeded")
    status, reply = _put(shared_server, run_id, "evil/x.bin", b"", "0" * 64, header=b"X-Troupe-Artifact-Failed: no\r\n")
    assert status == 409 and b"run_not_executing" in reply, reply
    assert shared_server.get(f"/api/runs/{run_id}")["artifacts"] == []


@pytest.mark.parametrize("removed_by", ["delete", "retention"])
def test_a_late_file_of_a_run_removed_while_it_arrives_is_a_404_and_leaves_nothing(make_server, tmp_path,
                                                                                   removed_by):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1", TROUPE_RUN_RETENTION_KEEP_LAST="1")
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"])
    try:
        read_until(agent, "connected as gpu-a")
        run_id = server.submit(sleeper(60), target={"worker": "gpu-a"})["run_id"]
        server.wait_status(run_id, "running")
        server.client.request("POST", f"/api/runs/{run_id}/cancel")
        server.events_until_finished(run_id, timeout=60)
    finally:
        agent.terminate()
        agent.wait(30)
    body = bytes(range(256)) * 4096
    good = hashlib.sha256(body).hexdigest()
    parsed = urllib.parse.urlsplit(server.url)
    head = (f"PUT /api/runs/{run_id}/artifacts?path=checkpoints%2Flate.pt&kind=checkpoint HTTP/1.1\r\n"
            f"Host: 127.0.0.1\r\nAuthorization: Bearer {server.token}\r\nX-Troupe-Sha256: {good}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    with socket.create_connection((parsed.hostname, parsed.port), timeout=30) as conn:
        conn.sendall(head.encode() + body[: len(body) // 2])
        folder = server.home / "runs" / run_id
        server.poll_until(lambda: any(folder.rglob(".arriving-*")))  # the transfer has begun
        if removed_by == "delete":
            assert server.client.request("DELETE", f"/api/runs/{run_id}")[0] == 200
        else:  # a newer run ends: the one kept, the worker's run pruned, its folder too
            server.events_until_finished(server.submit(hello())["run_id"])
            server.poll_until(lambda: server.client.request("GET", f"/api/runs/{run_id}")[0] == 404)
        conn.sendall(body[len(body) // 2:])
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 404") and b"run_not_found" in reply, reply[:300]
    assert not folder.exists(), sorted(folder.rglob("*"))  # the folders made for the file went with it
    status, reply = _put(server, run_id, "checkpoints/lost.pt", b"", good, header=b"X-Troupe-Artifact-Failed: x\r\n")
    assert status == 404 and b"run_not_found" in reply, reply
    assert "Traceback" not in "".join(server.output)
