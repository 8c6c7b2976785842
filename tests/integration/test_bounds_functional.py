"""Nothing one request does can take the server down (issue 25): bodies are capped by
route before a byte is read and must arrive within a deadline; a client's number never
sizes a list a limit refuses; a sweep's runs share their base graph; small things (a
binary frame, an id with a newline, a malformed request, Infinity) get a clear answer.
Each test also checks that the server's memory stays within 100 MB of where it began."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.parse
from pathlib import Path

import aiohttp

from tests.helpers import graph, hello, node, sleeper
from tests.integration.test_hardening_functional import forger

MIB = 1024 * 1024
GROWTH_MIB = 100


def _raw(server, head: str, body: bytes = b"", read: bool = True, timeout: float = 30) -> socket.socket | bytes:
    """Sends a request by hand; returns the whole reply, or the open socket."""
    parsed = urllib.parse.urlsplit(server.url)
    conn = socket.create_connection((parsed.hostname, parsed.port), timeout=timeout)
    conn.sendall(head.encode() + body)
    if not read:
        return conn
    reply = b""
    with conn:
        while chunk := conn.recv(65536):
            reply += chunk
    return reply


def _with_body(path: str, text: str, token: str) -> tuple[str, bytes]:
    body = text.encode()
    return _post_head(path, len(body), token).replace("\r\n\r\n", "\r\nConnection: close\r\n\r\n"), body


def _post_head(path: str, length: int, token: str | None = None) -> str:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{auth}"
            f"Content-Length: {length}\r\n\r\n")


def test_a_credential_exchange_announcing_a_large_body_is_refused_before_it_is_read(make_server):
    server = make_server()
    baseline = server.rss_mib()
    sockets = [_raw(server, _post_head("/api/workers/credentials", 15 * MIB), b"x" * 65536, read=False)
               for _ in range(30)]
    replies = []
    for conn in sockets:
        with conn:
            reply = b""
            while chunk := conn.recv(65536):  # the server closes: it never reads the rest
                reply += chunk
            replies.append(reply)
    for reply in replies:
        status = int(reply.split(b" ", 2)[1])
        body = json.loads(reply.split(b"\r\n\r\n", 1)[1])
        assert status == 413 and body["error"]["code"] == "payload_too_large", reply[:300]
        assert body["error"]["details"]["limit_bytes"] == 4096
    assert server.rss_mib() - baseline < GROWTH_MIB


def test_a_body_over_its_cap_that_announces_no_length_is_refused_when_it_came_whole(make_server):
    server = make_server()
    data = b"x" * 5000  # over a credential exchange's 4 KiB, in one chunk sent with the headers
    head = ("POST /api/workers/credentials HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
    reply = _raw(server, head, f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n\r\n")
    assert isinstance(reply, bytes)
    body = json.loads(reply.split(b"\r\n\r\n", 1)[1])
    assert int(reply.split(b" ", 2)[1]) == 413 and body["error"]["code"] == "payload_too_large", reply[:300]
    assert body["error"]["details"]["limit_bytes"] == 4096


def test_a_body_that_stalls_is_cut_at_the_read_deadline_and_its_connection_closed(make_server):
    server = make_server(TROUPE_REQUEST_READ_TIMEOUT_S="1")
    baseline = server.rss_mib()
    body = json.dumps({"graph": hello()}).encode()
    stalled = [_raw(server, _post_head("/api/runs", len(body) + 1000, server.token), body, read=False)
               for _ in range(20)]
    for conn in stalled:  # the rest never comes
        with conn:
            reply = b""
            while chunk := conn.recv(65536):
                reply += chunk
        assert int(reply.split(b" ", 2)[1]) == 408, reply[:300]
        assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
    assert server.get("/api/runs")["runs"] == []  # nothing half-read was queued
    whole = server.submit(hello())  # and the server answers everyone else
    assert whole["status"] == "queued"
    assert server.rss_mib() - baseline < GROWTH_MIB


def _sweep(base: dict, param: dict, **extra) -> dict:
    return {"base_graph": base, "sweep_spec": {"method": "grid", "params": [param]},
            "objective": {"metric": "val_loss", "direction": "minimize"}, **extra}


def test_a_range_is_refused_before_it_is_expanded(make_server):
    server = make_server()
    baseline = server.rss_mib()
    base = graph(node("a", "core.Constant", value=1), node("t", "core.Ticker", count=1, interval=0))

    def refused(body: dict, path: str = "/api/sweeps") -> dict:
        status, reply = server.client.request("POST", path, body)
        assert status == 400, (status, reply)
        return reply["error"]

    huge = refused(_sweep(base, {"node_id": "a", "param": "value", "range": {"min": 0, "max": 1, "count": 10**9}}))
    assert huge["pointer"] == "/sweep_spec/params/0/range/count" and "10000" in huge["message"]
    floats = refused(_sweep(base, {"node_id": "a", "param": "value", "range": {"min": 0, "max": 1, "count": 33}}))
    assert (floats["code"], floats["pointer"]) == ("sweep_invalid", "/sweep_spec/params/0/range/count")
    ints = refused(_sweep(base, {"node_id": "t", "param": "count", "range": {"min": 1, "max": 1000, "count": 10000}}))
    assert ints["code"] == "sweep_invalid" and "more than 32 distinct" in ints["message"]
    logs = refused(_sweep(base, {"node_id": "t", "param": "count",
                                 "range": {"min": 1, "max": 1e6, "count": 10000, "scale": "log"}}))
    assert logs["code"] == "sweep_invalid"
    # Many points that round to a few values are what seed 002 accepts: counted, not refused.
    few = {"node_id": "t", "param": "count", "range": {"min": 1, "max": 5, "count": 10000, "type": "int"}}
    status, reply = server.client.request("POST", "/api/sweeps", _sweep(base, few))
    assert status == 201 and reply["total_combinations"] == 5, reply
    study = {"base_graph": base, "sweep_spec": {"method": "grid", "params": [
        {"node_id": "a", "param": "value", "range": {"min": 0, "max": 1, "count": 10**9}}]},
        "objective": {"metric": "val_loss", "direction": "minimize"}}
    assert refused(study, "/api/studies")["pointer"] == "/sweep_spec/params/0/range/count"
    job = {"kind": "study", "idempotency_key": "k1", "spec": study}
    assert refused(job, "/api/plugins/lab/jobs")["pointer"] == "/spec/sweep_spec/params/0/range/count"
    many = {"base_graph": base, "variants": [{"name": f"v{i}", "params": []} for i in range(1000)],
            "repeats": 11, "objective": {"metric": "val_loss", "direction": "minimize"}}
    assert refused(many, "/api/studies")["pointer"] == "/repeats"
    infinite = _sweep(base, {"node_id": "a", "param": "value", "range": {"min": 0, "max": 1, "count": 2}})
    reply = _raw(server, *_with_body("/api/sweeps", json.dumps(infinite).replace('"max": 1', '"max": Infinity'),
                                     server.token))
    error = json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]
    assert reply.startswith(b"HTTP/1.1 400") and "Infinity is not a JSON number" in error["message"], error
    assert server.rss_mib() - baseline < GROWTH_MIB


def _filler(i: int) -> str:
    return (f"{i}-" * 60_000)[:60_000]


def _db_bytes(home: Path) -> int:
    return sum(p.stat().st_size for p in home.glob("troupe.db*"))


def test_a_sweeps_runs_share_their_base_graph_and_a_param_value_is_capped(make_server):
    server = make_server(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="1")
    blocker = server.submit(sleeper(120))["run_id"]
    server.wait_status(blocker, "running")
    too_long = graph(node("p", "core.Print", prefix="x" * 70_000))
    refused = server.submit(too_long, expect=400)["error"]
    assert (refused["code"], refused["pointer"]) == ("graph_invalid", "/graph/nodes/0/params/prefix")
    # A base graph of about 8 MB: 130 nodes of 60 000 characters each, and one swept param.
    big = graph(node("a", "core.Constant", value=0),
                *(node(f"p{i}", "core.Print", prefix=_filler(i)) for i in range(130)))
    body = _sweep(big, {"node_id": "a", "param": "value", "values": list(range(32))})
    size = len(json.dumps(body))
    baseline_db, baseline_rss = _db_bytes(server.home), server.rss_mib()
    status, reply = server.client.request("POST", "/api/sweeps", body)
    assert status == 201 and len(reply["variants"]) == 32, str(reply)[:300]
    grown = _db_bytes(server.home) - baseline_db
    assert grown < 3 * size, f"the sweep took {grown / MIB:.1f} MB of database for a {size / MIB:.1f} MB request"
    assert server.rss_mib() - baseline_rss < GROWTH_MIB
    run = server.get(f"/api/runs/{reply['variants'][7]['run_id']}")  # read back whole, its own param set
    nodes = {n["id"]: n for n in run["graph"]["nodes"]}
    assert nodes["a"]["params"]["value"] == 7 and nodes["p129"]["params"]["prefix"] == _filler(129)
    server.client.request("POST", f"/api/sweeps/{reply['sweep_id']}/cancel")
    server.client.request("POST", f"/api/runs/{blocker}/cancel")
    for variant in reply["variants"]:
        server.wait_status(variant["run_id"], "cancelled")
        assert server.client.request("DELETE", f"/api/runs/{variant['run_id']}")[0] == 200
    # The base is gone with the last run that named it.
    assert _db_bytes(server.home) - baseline_db < 3 * size


def test_small_things_get_clear_answers(make_server):
    server = make_server()
    run_id = server.submit(hello())["run_id"]
    status, reply = server.client.request("GET", f"/api/runs/{run_id}%0A")
    assert status == 404 and reply["error"]["code"] == "run_not_found"
    for _ in range(20):  # a flood of malformed requests: each refused, one line in the log
        answer = _raw(server, "GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: x\r\n\r\n")
        assert answer.split(b"\r\n", 1)[0].endswith(b"400 Bad Request"), answer[:200]
    server.get("/api/runs")
    log = server.printed("refused a malformed request")  # the line the first one logged
    assert "Traceback" not in log and log.count("refused a malformed request") == 1, log[-3000:]

    async def binary_frame() -> int | None:
        session, ws = await forger(server, "bin")
        try:
            await ws.send_bytes(b"\x00\x01")
            message = await ws.receive(timeout=10)
            while message.type == aiohttp.WSMsgType.TEXT:  # what the server had queued for us
                message = await ws.receive(timeout=10)
            return ws.close_code
        finally:
            await session.close()

    assert asyncio.run(binary_frame()) == 1003  # unsupported data


def test_an_artifact_path_that_names_no_file_in_the_run_folder_is_refused(make_server):
    server = make_server()
    run_id = server.submit(hello())["run_id"]
    for path in (".", "./", "a\x00b", "x" * 300, "a//b", "../up", "/abs"):
        query = urllib.parse.urlencode({"path": path})
        head = (f"PUT /api/runs/{run_id}/artifacts?{query} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Authorization: Bearer {server.token}\r\nX-Troupe-Sha256: {'0' * 64}\r\nContent-Length: 1\r\n"
                "Connection: close\r\n\r\n")
        reply = _raw(server, head, b"x")
        assert reply.startswith(b"HTTP/1.1 400"), (path, reply[:300])
        assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]["pointer"] == "?path"
    assert not (server.home / "runs" / run_id / "x").exists()
