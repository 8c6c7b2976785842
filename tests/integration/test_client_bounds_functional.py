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
    # Duplicates are still found, as the param takes them (2 is 2.0 for a float), at the place of the second one.
    status, reply = shared_server.client.request("POST", "/api/sweeps", {
        "base_graph": base, "sweep_spec": _spec([1, 2.0, 2, 1.0, 2.0]), "objective": objective})
    assert status == 400 and reply["error"]["pointer"] == "/sweep_spec/params/0/values/2", reply
    assert "listed twice" in reply["error"]["message"]


def _post_form(server, parts: bytes, boundary: str = "b0und") -> tuple[int, dict]:
    import http.client
    import json
    import urllib.parse

    parsed = urllib.parse.urlsplit(server.url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    conn.request("POST", "/api/files", body=parts + f"--{boundary}--\r\n".encode(), headers={
        "Content-Type": f"multipart/form-data; boundary={boundary}", "Authorization": f"Bearer {server.token}"})
    response = conn.getresponse()
    reply = json.loads(response.read())
    conn.close()
    return response.status, reply


def _field(name: bytes, content: bytes, filename: bytes | None = None, boundary: str = "b0und") -> bytes:
    disposition = b'form-data; name="' + name + b'"' + (b'; filename="' + filename + b'"' if filename else b"")
    return f"--{boundary}\r\n".encode() + b"Content-Disposition: " + disposition + b"\r\n\r\n" + content + b"\r\n"


def test_an_upload_named_in_bytes_that_are_not_utf8_is_kept_and_extra_fields_are_refused(shared_server):
    status, reply = _post_form(shared_server, _field(b"file", b"a,y\n1,0\n", filename=b"\xff.txt"))
    assert status == 201 and reply["name"] == "\ufffd.txt", reply
    status, reply = _post_form(shared_server, _field(b"file", b"x", filename=b"a.txt") + _field(b"note", b"hi"))
    assert status == 400 and reply["error"]["code"] == "unknown_form_field" and reply["error"]["pointer"] == "/note"
    status, reply = _post_form(shared_server, _field(b"note", b"hi") + _field(b"file", b"x", filename=b"a.txt"))
    assert status == 400 and reply["error"]["code"] == "unknown_form_field"


def test_integer_query_parameters_take_ascii_digits_only_and_a_search_takes_text(shared_server):
    for given in ("1_0", "+5", " 5", "\u0665", "\uff15", "5.0", "0x10"):
        status, reply = shared_server.client.request("GET", f"/api/runs?limit={_quote(given)}")
        assert status == 400 and reply["error"]["pointer"] == "?limit", (given, reply)
    assert shared_server.client.request("GET", "/api/runs?limit=5")[0] == 200
    status, reply = shared_server.client.request("GET", "/api/runs?q=%00")
    assert status == 400 and reply["error"]["pointer"] == "?q"  # a NUL once matched every run


def _quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")
