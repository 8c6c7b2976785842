"""Bad requests get a clear 4xx in the one error shape, never a 500; auth and Host."""

from __future__ import annotations

import http.client
import json

import pytest

from tests.helpers import edge, graph, hello, node


def raw_request(server, method, path, body=b"", headers=None):
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    all_headers = {"Authorization": f"Bearer {server.token}", "Content-Type": "application/json"}
    all_headers.update(headers or {})
    conn.request(method, path, body=body, headers=all_headers)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, json.loads(data) if data else None


def submit_error(server, g):
    status, reply = server.client.request("POST", "/api/runs", {"graph": g})
    assert status == 400, (status, reply)
    return reply["error"]


@pytest.mark.parametrize(
    "g, pointer, node_id, word",
    [
        (graph(node("a", "core.Nope")), "/graph/nodes/0/type", "a", "unknown node type"),
        (graph(node("a", "core.Constant", value=1), node("a", "core.Constant", value=2)),
         "/graph/nodes/1/id", "a", "used twice"),
        (graph(node("a", "core.Constant", value="x")), "/graph/nodes/0/params/value", "a", "must be a number"),
        (graph(node("a", "core.Constant")), "/graph/nodes/0/params", "a", "required"),
        (graph(node("a", "core.Constant", value=1, extra=2)), "/graph/nodes/0/params/extra", "a", "no param"),
        (graph(node("z", "core.Sleep", seconds=-1)), "/graph/nodes/0/params/seconds", "z", ">= 0"),
        (graph(node("s", "core.Add")), "/graph/nodes/0", "s", "required input a"),
        (graph(node("a", "core.Constant", value=1), node("s", "core.Add"),
               edges=(edge("a", "value", "s", "a"), edge("a", "nope", "s", "b"))),
         "/graph/edges/1/source_port", "a", "no output"),
        (graph(node("a", "core.Constant", value=1), node("s", "core.Add"),
               edges=(edge("a", "value", "s", "a"), edge("a", "value", "s", "c"))),
         "/graph/edges/1/target_port", "s", "no input"),
        (graph(node("a", "core.Constant", value=1), edges=(edge("a", "value", "ghost", "x"),)),
         "/graph/edges/0/target", None, "unknown target"),
        (graph(node("p", "core.Sleep", seconds=0), node("q", "core.Sleep", seconds=0),
               edges=(edge("p", "x", "q", "x"), edge("q", "x", "p", "x"))),
         "/graph/edges/0", "q", "cycle"),
        (graph(node("a", "core.Constant", value=1), node("s", "core.Add"),
               edges=(edge("a", "value", "s", "a"), edge("a", "value", "s", "a"))),
         "/graph/edges/1/target_port", "s", "fed by edges"),
    ],
)
def test_invalid_graphs_are_refused_with_a_pointer(shared_server, g, pointer, node_id, word):
    before = shared_server.get("/api/runs?limit=500")["runs"]
    error = submit_error(shared_server, g)
    assert error["code"] == "graph_invalid"
    assert error["pointer"] == pointer
    assert error.get("node_id") == node_id
    assert word in error["message"]
    assert shared_server.get("/api/runs?limit=500")["runs"] == before  # nothing was queued


@pytest.mark.parametrize(
    "body, pointer",
    [
        ({"graph": {"nodes": "x"}}, "/graph/nodes"),
        ({"graph": hello(), "options": {"seed": -1}}, "/options/seed"),
        ({"graph": hello(), "options": {"seed": 2**32}}, "/options/seed"),
        ({"graph": hello(), "options": {"lane": "fast"}}, "/options/lane"),
        ({"graph": hello(), "options": {"device": 3}}, "/options/device"),
        ({"graph": hello(), "options": {"device": "gpu0"}}, "/options/device"),
        ({"graph": hello(), "options": {"bogus": 1}}, "/options/bogus"),
        ({"graph": hello(), "options": {"target": {"worker": "gpu-a"}}}, "/options/target/worker"),
        ({"graph": {"nodes": [{"id": "a", "type": 5}]}}, "/graph/nodes/0/type"),
        ({}, "/graph"),
    ],
)
def test_malformed_bodies_get_400_with_a_pointer(shared_server, body, pointer):
    status, reply = shared_server.client.request("POST", "/api/runs", body)
    assert status == 400, reply
    assert reply["error"]["pointer"] == pointer
    assert reply["error"]["code"]


@pytest.mark.parametrize("raw", [b"", b"{", b"[1, 2]", b"\xff\xfe", b"null", b'"text"'])
def test_bodies_that_are_not_json_objects(shared_server, raw):
    status, reply = raw_request(shared_server, "POST", "/api/runs", raw)
    assert status == 400 and reply["error"]["code"] == "invalid_request"


def test_a_huge_body_gets_413(make_server):
    server = make_server(TROUPE_MAX_REQUEST_BYTES="4096")
    status, reply = raw_request(server, "POST", "/api/runs", b'{"graph": "' + b"x" * 10000 + b'"}')
    assert status == 413 and reply["error"]["code"] == "payload_too_large"


@pytest.mark.parametrize("path", ["/api/runs/nothex", "/api/runs/" + "A" * 32, "/api/runs/" + "0" * 32,
                                  "/api/runs/" + "0" * 32 + "/events", "/api/runs/%00/metrics"])
def test_unknown_or_malformed_run_ids_get_404(shared_server, path):
    status, reply = shared_server.client.request("GET", path)
    assert status == 404 and reply["error"]["code"] in ("run_not_found", "not_found")


@pytest.mark.parametrize("query", ["?status=bogus", "?limit=0", "?limit=x", "?cursor=%%%", "?cursor=cnVuczp4"])
def test_bad_list_queries_get_400(shared_server, query):
    status, reply = shared_server.client.request("GET", "/api/runs" + query)
    assert status == 400 and reply["error"]["pointer"].startswith("?")


def test_unknown_route_and_method_get_json_errors(shared_server):
    status, reply = shared_server.client.request("GET", "/api/nope")
    assert status == 404 and reply["error"]["code"] == "not_found"
    status, reply = shared_server.client.request("PUT", "/api/runs")
    assert status == 405 and reply["error"]["code"] == "method_not_allowed"


def test_mutations_need_the_session_token_and_reads_do_not(shared_server):
    status, reply = shared_server.anonymous.request("POST", "/api/runs", {"graph": hello()})
    assert status == 401 and reply["error"]["code"] == "unauthorized"
    status, _ = raw_request(shared_server, "POST", "/api/runs", json.dumps({"graph": hello()}).encode(),
                            {"Authorization": "Bearer wrong"})
    assert status == 401
    status, _ = shared_server.anonymous.request("GET", "/api/runs")
    assert status == 200
    status, _ = shared_server.anonymous.request("DELETE", "/api/runs/" + "0" * 32)
    assert status == 401


@pytest.mark.parametrize("host, allowed", [("evil.example", False), ("localhost:1234", True),
                                           ("127.0.0.1", True), ("[::1]:80", True), ("laptop.lan", True),
                                           ("laptop.lan.evil.example", False)])
def test_host_header_guard(make_server, host, allowed):
    server = make_server(TROUPE_ALLOWED_HOSTS="laptop.lan")
    status, reply = raw_request(server, "GET", "/api/runs", headers={"Host": host})
    if allowed:
        assert status == 200
    else:
        assert status == 403 and reply["error"]["code"] == "host_not_allowed"


def test_public_url_is_what_info_reports(make_server):
    server = make_server(TROUPE_PUBLIC_URL="http://laptop.lan:8765")
    assert server.get("/api/info")["public_url"] == "http://laptop.lan:8765"
