"""No request's content can stop the control plane: a lone surrogate (JSON's ``\\ud800``
escape) in any string a route takes is refused at the edge with a pointer, and a
property test sends hypothesis-made unicode, surrogates included, in every string of
every route's body and in query strings."""

from __future__ import annotations

import copy
import http.client
import json
import urllib.parse
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import graph, node


def _print_graph() -> dict[str, Any]:
    doc = graph(node("a", "core.Constant", value=1), node("p", "core.Print", prefix="x"),
                edges=({"source": "a", "source_port": "value", "target": "p", "target_port": "value"},),
                device="cpu", name="texts")
    return doc


def _core_sweep() -> dict[str, Any]:
    return {"name": "s", "base_graph": _print_graph(),
            "sweep_spec": {"method": "grid", "params": [{"node_id": "a", "param": "value", "values": [1, 2]}]},
            "objective": {"metric": "val_loss", "direction": "minimize"}}


def _core_study() -> dict[str, Any]:
    return {"name": "st", "base_graph": _print_graph(),
            "variants": [{"name": "one", "params": [{"node_id": "a", "param": "value", "value": 1}]}],
            "repeats": 1, "budget": {"max_runs": 1}, "objective": {"metric": "val_loss", "direction": "minimize"}}


# Every route that reads a JSON body, with a body it accepts; the property test swaps one
# of its strings (or an object key) for generated text.
ROUTES: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "/api/runs", {"graph": _print_graph(), "name": "n", "options": {"device": "cpu"}}),
    ("POST", "/api/sweeps", _core_sweep()),
    ("POST", "/api/studies", _core_study()),
    ("POST", "/api/plugins/lab.tool/jobs", {"kind": "study", "spec": _core_study(), "idempotency_key": "k"}),
    ("POST", "/api/export", {"graph": _print_graph()}),
    ("POST", "/api/estimates", {"graph": _print_graph()}),
    ("POST", "/api/flavors", {"name": "small", "cpus": 1}),
    ("POST", "/api/login-links", {"uses": 2}),
    ("POST", "/api/login", {"token": "t"}),
    ("POST", "/api/workers/enrollments", {"name": "w1"}),
    ("POST", "/api/workers/credentials", {"token": "t", "name": "w1", "machine_id": "m"}),
    ("POST", "/api/workers/ssh", {"name": "w2", "host": "example"}),
]


def _strings(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], bool]]:
    """Every string of ``value`` by its path; ``True`` marks an object key."""
    found: list[tuple[tuple[Any, ...], bool]] = []
    if isinstance(value, str):
        found.append((path, False))
    elif isinstance(value, dict):
        for key, item in value.items():
            found.append(((*path, key), True))
            found.extend(_strings(item, (*path, key)))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found.extend(_strings(item, (*path, i)))
    return found


def _replaced(body: dict[str, Any], path: tuple[Any, ...], is_key: bool, text: str) -> dict[str, Any]:
    doc = copy.deepcopy(body)
    parent: Any = doc
    for step in path[:-1]:
        parent = parent[step]
    if is_key:
        parent[text] = parent.pop(path[-1])
    else:
        parent[path[-1]] = text
    return doc


SURROGATE = st.integers(0xD800, 0xDFFF).map(chr)
# Any code point, surrogates included (hypothesis leaves them out unless told), and text
# that surely holds one.
TEXT = st.one_of(
    st.text(st.characters(exclude_categories=()), max_size=12),
    st.tuples(st.text(max_size=4), SURROGATE, st.text(max_size=4)).map("".join),
)


@pytest.mark.timeout(300)
def test_a_lone_surrogate_anywhere_is_refused_with_its_pointer_and_stops_nothing(make_server):
    server = make_server()
    baseline = server.rss_mib()
    bodies = [{"graph": {**_print_graph(), "name": "\ud800"}},
              {"graph": _print_graph(), "name": "ok\udfff"},
              {"graph": {**_print_graph(), "settings": {"device": "cpu", "note": "\ud800"}}}]
    doc = _print_graph()
    doc["nodes"][1]["params"]["prefix"] = "\ud800"
    bodies.append({"graph": doc})
    pointers = ["/graph/name", "/name", "/graph/settings/note", "/graph/nodes/1/params/prefix"]
    for _ in range(3):  # twelve requests: twice past the restart intensity that once stopped it
        for body, pointer in zip(bodies, pointers, strict=True):
            status, reply = server.client.request("POST", "/api/runs", body)
            assert status == 400, reply
            assert reply["error"]["code"] == "invalid_text" and reply["error"]["pointer"] == pointer
    status, reply = server.client.request("GET", "/api/runs?q=%ED%A0%80")  # not UTF-8: read as U+FFFD
    assert status == 200
    run = server.submit(_print_graph())["run_id"]
    assert server.wait_status(run, "succeeded")["status"] == "succeeded"
    assert server.proc.poll() is None and "crashed" not in "".join(server.output)
    assert server.rss_mib() - baseline < 100


@pytest.mark.timeout(600)
def test_generated_unicode_in_every_string_of_every_route_never_answers_5xx(make_server):
    server = make_server()
    baseline = server.rss_mib()
    cases = [(method, path, body, where, is_key)
             for method, path, body in ROUTES for where, is_key in _strings(body)]

    @settings(max_examples=150, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(case=st.sampled_from(cases), text=TEXT)
    def probe(case: tuple[str, str, dict[str, Any], tuple[Any, ...], bool], text: str) -> None:
        method, path, body, where, is_key = case
        status, reply = server.client.request(method, path, _replaced(body, where, is_key, text))
        assert status < 500, (path, where, status, reply)
        if any(0xD800 <= ord(c) <= 0xDFFF for c in text):
            assert status == 400 and reply["error"]["code"] == "invalid_text", (path, where, reply)
        quoted = json.dumps(text)[1:-1]
        status, reply = server.client.request("GET", f"/api/runs?q={_quote(quoted)}&tag={_quote(quoted)}")
        assert status < 500, reply

    probe()
    assert server.proc.poll() is None and "crashed" not in "".join(server.output)
    run = server.submit(_print_graph())["run_id"]
    assert server.wait_status(run, "succeeded")["status"] == "succeeded"
    assert server.rss_mib() - baseline < 100


def _quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text.encode("utf-8", "surrogatepass"), safe="")


def _post_raw(server: Any, raw: bytes) -> tuple[int, dict[str, Any]]:
    """A body sent as these bytes (the client's own JSON encoder would escape them)."""
    address = urllib.parse.urlsplit(server.url)
    conn = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    try:
        conn.request("POST", "/api/runs", body=raw, headers={"Content-Type": "application/json",
                                                             "Authorization": f"Bearer {server.token}"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


@pytest.mark.timeout(120)
def test_a_surrogate_sent_as_raw_bytes_and_a_body_nested_too_deep_are_refused_with_their_pointers(make_server):
    server = make_server()
    # UTF-8's bytes of U+D800, which Python's JSON reader lets through: no escape in the body.
    doc = _print_graph()
    doc["nodes"][1]["params"]["prefix"] = "@"
    raw = json.dumps({"graph": doc}).encode().replace(b'"@"', b'"\xed\xa0\x80"')
    status, reply = _post_raw(server, raw)
    assert status == 400 and reply["error"]["code"] == "invalid_text", reply
    assert reply["error"]["pointer"] == "/graph/nodes/1/params/prefix"
    # 65 levels of objects below "graph"'s settings: each level one bracket.
    nested: dict[str, Any] = {}
    for _ in range(64):
        nested = {"n": nested}
    status, reply = _post_raw(server, json.dumps({"graph": {**_print_graph(), "settings": nested}}).encode())
    assert status == 400 and reply["error"]["code"] == "too_deep", reply
    assert reply["error"]["pointer"].startswith("/graph/settings/n/n/")
    assert server.wait_status(server.submit(_print_graph())["run_id"], "succeeded")["status"] == "succeeded"
