"""Adversarial inputs through the public interfaces: a worker's frames for runs that are
not its own, events refused at the boundary, non-finite numbers, request shapes that once
answered 500."""

from __future__ import annotations

import base64
import http.client
import json
import sys

import aiohttp
import pytest

from tests.helpers import edge, graph, hello, node, run_event, sleeper
from tests.integration.test_workers_functional import hello as agent_hello
from troupe.protocol import worker as wire


def strict(text: str) -> object:
    """JSON as a browser's JSON.parse reads it: NaN and Infinity are not JSON."""
    def refuse(token: str) -> None:
        raise ValueError(f"non-standard JSON token {token}")
    return json.loads(text, parse_constant=refuse)


def raw(server, method: str, path: str, body: bytes | None = None, headers: dict | None = None) -> tuple[int, str]:
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    sent = {"Authorization": f"Bearer {server.token}", "Content-Type": "application/json", **(headers or {})}
    conn.putrequest(method, path)
    for key, value in sent.items():
        conn.putheader(key, value)
    conn.putheader("Content-Length", str(len(body or b"")))
    conn.endheaders(body)
    response = conn.getresponse()
    text = response.read().decode()
    conn.close()
    return response.status, text


async def forger(server, name="forger"):
    """A same-machine agent socket (the session token from loopback), after its welcome."""
    session = aiohttp.ClientSession()
    ws = await session.ws_connect(server.url.replace("http://", "ws://") + "/ws/worker",
                                  headers={"Authorization": f"Bearer {server.token}"})
    await ws.send_str(agent_hello(name=name))
    assert isinstance(wire.parse_frame((await ws.receive(timeout=10)).data), wire.Welcome)
    return session, ws


async def closed_for_breaking_the_protocol(ws) -> None:
    """Reads what the control plane still sends until it closes the socket, as it does
    a worker whose frames break the protocol."""
    closed = await ws.receive(timeout=10)
    while closed.type == aiohttp.WSMsgType.TEXT:
        closed = await ws.receive(timeout=10)
    assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING)
    assert ws.close_code == wire.CLOSE_PROTOCOL


async def test_a_worker_cannot_end_or_touch_runs_that_are_not_its_own(shared_server):
    running = shared_server.submit(sleeper(30))["run_id"]
    shared_server.wait_status(running, "running")
    session, ws = await forger(shared_server)
    try:
        for counter in range(1, 4):
            await ws.send_str(wire.RunEnded(run_id=running, counter=counter, status="succeeded").model_dump_json())
            await ws.send_str(run_event(running, 10 + counter, "artifact", {"kind": "x", "path": "/etc/shadow"}))
        row = shared_server.get(f"/api/runs/{running}")
        assert row["status"] == "running" and row["artifacts"] == []
        for counter in range(100):  # an agent that keeps at it is disconnected
            try:
                await ws.send_str(run_event(running, 20 + counter, "log", {"message": "x"}))
            except ConnectionResetError:
                break  # the control plane closed the socket before the hundredth: what is asserted next
        await closed_for_breaking_the_protocol(ws)
    finally:
        await session.close()
        shared_server.client.request("POST", f"/api/runs/{running}/cancel")
    events = shared_server.get(f"/api/runs/{running}/events")["events"]
    assert not [e for e in events if e["type"] == "log" and e["payload"].get("message") == "x"]


async def test_events_refused_at_the_boundary_become_warnings_on_their_run(shared_server):
    session, ws = await forger(shared_server, "bounds")
    try:
        run_id = shared_server.submit(hello(), target={"worker": "bounds"})["run_id"]
        await assigned(ws)
        bad = [("artifact", {"kind": "checkpoint", "path": "/etc/shadow"}),
               ("artifact", {"kind": "checkpoint", "path": "checkpoints/../../escape.pt"}),
               ("metric", {"name": "loss", "step": 2**63, "value": 1.0}),
               ("metric", {"name": "loss", "step": 1, "value": "high"}),
               # A worker's transfer is recorded by the control plane on arrival, never announced.
               ("artifact", {"kind": "checkpoint", "path": "checkpoints/claimed.pt", "backend": "transfer",
                             "size": 3, "sha256": "a" * 64}),
               # Text no column can keep (the JSON escape of a lone surrogate).
               ("metric", {"name": "\ud800", "step": 1, "value": 1.0}),
               ("artifact", {"kind": "checkpoint", "path": "checkpoints/\ud800.pt", "backend": "mount",
                             "label": "data", "size": 3, "sha256": "a" * 64}),
               ("artifact", {"kind": "checkpoint", "path": "checkpoints/last.pt", "backend": "mount",
                             "label": "data", "size": 3, "sha256": "a" * 64}),
               # Console text the run's console could not be read back with (it was a 500 for good).
               ("console", {"stream": "stdout", "text": "ab\ud800c"}), ("console", {"stream": "stdout", "text": 5}),
               ("console", {"stream": "stdin", "text": "x"}), ("console", {"stream": "stdout", "text": "kept\n"})]
        for counter, (kind, payload) in enumerate(bad, start=1):
            await ws.send_str(run_event(run_id, counter, kind, payload))
        await ws.send_str(wire.RunEnded(run_id=run_id, counter=len(bad) + 1, status="succeeded").model_dump_json())
        shared_server.wait_status(run_id, "succeeded")
    finally:
        await session.close()
    events = shared_server.get(f"/api/runs/{run_id}/events")["events"]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    rejected = [e["payload"] for e in events if e["payload"].get("code") == "event_rejected"]
    assert len(rejected) == 10
    artifacts = shared_server.get(f"/api/runs/{run_id}")["artifacts"]
    assert [a["path"] for a in artifacts] == ["checkpoints/last.pt"]
    assert shared_server.get(f"/api/runs/{run_id}/console")["text"] == "kept\n"


async def assigned(ws) -> wire.Assign:
    frame = wire.parse_frame((await ws.receive(timeout=10)).data)
    while not isinstance(frame, wire.Assign):
        frame = wire.parse_frame((await ws.receive(timeout=10)).data)
    return frame


async def test_an_events_frame_is_applied_once_from_its_first_new_event(shared_server):
    session, ws = await forger(shared_server, "batches")

    def events(counter: int, *items: tuple[str, str | None, str]) -> str:
        return wire.RunEvents(run_id=run_id, counter=counter, events=list(items)).model_dump_json()

    def line(i: int) -> tuple[str, None, str]:
        return "log", None, json.dumps({"message": f"line {i}"})

    try:
        run_id = shared_server.submit(hello(), target={"worker": "batches"})["run_id"]
        await assigned(ws)
        await ws.send_str(events(3, line(1), line(2), line(3)))
        await ws.send_str(events(5, line(2), line(3), line(4), line(5)))  # replayed, with two new ones
        await ws.send_str(events(9, ("metric", "m", '{"name": "loss", "step": 1, "value": NaN}'),
                                 ("log", None, "[1, 2]"), ("log", None, "not json"),
                                 ("log", None, "[" * 5000 + "]" * 5000)))  # deeper than a JSON reader goes
        await ws.send_str(wire.RunEnded(run_id=run_id, counter=10, status="succeeded").model_dump_json())
        shared_server.wait_status(run_id, "succeeded")
    finally:
        await session.close()
    logged = shared_server.get(f"/api/runs/{run_id}/events")["events"]
    assert [e["seq"] for e in logged] == list(range(1, len(logged) + 1))
    assert [e["payload"]["message"] for e in logged if e["type"] == "log"] == [f"line {i}" for i in range(1, 6)]
    metric = next(e["payload"] for e in logged if e["type"] == "metric")
    assert metric["value"] is None and metric["non_finite"] == "nan"
    rejected = [e["payload"]["message"] for e in logged if e["payload"].get("code") == "event_rejected"]
    assert rejected == ["a log event was refused: its payload is not a JSON object"] * 3


async def test_an_ended_frame_with_a_size_past_any_column_closes_the_socket(shared_server):
    session, ws = await forger(shared_server, "sizes")
    try:
        run_id = shared_server.submit(hello(), target={"worker": "sizes"})["run_id"]
        await assigned(ws)
        frame = json.loads(wire.RunEnded(run_id=run_id, counter=1, status="succeeded").model_dump_json())
        await ws.send_str(json.dumps({**frame, "peak_memory_mib": 10**30}))  # once stored, then the row stuck
        await closed_for_breaking_the_protocol(ws)
    finally:
        await session.close()
        shared_server.client.request("POST", f"/api/runs/{run_id}/cancel")


async def test_an_events_frame_with_a_lifecycle_event_closes_the_socket(shared_server):
    session, ws = await forger(shared_server, "lifecycle")
    try:
        run_id = shared_server.submit(sleeper(30), target={"worker": "lifecycle"})["run_id"]
        await assigned(ws)
        await ws.send_str(wire.RunEvents(run_id=run_id, counter=2, events=[
            ("log", None, '{"message": "fine"}'), ("run_finished", None, '{"status": "succeeded"}')]).model_dump_json())
        await closed_for_breaking_the_protocol(ws)
    finally:
        await session.close()
        shared_server.client.request("POST", f"/api/runs/{run_id}/cancel")
    assert shared_server.get(f"/api/runs/{run_id}")["status"] != "succeeded"


def diverging() -> dict:
    """inf from 1e308 * 1e308 as val_loss, then nan from inf * 0 as train_loss."""
    return graph(node("a", "core.Constant", value=1e308), node("b", "core.Constant", value=1e308),
                 node("z", "core.Constant", value=0), node("p", "core.Multiply"), node("q", "core.Multiply"),
                 node("v", "core.LogMetric", name="val_loss"), node("t", "core.LogMetric", name="train_loss"),
                 edges=(edge("a", "value", "p", "a"), edge("b", "value", "p", "b"), edge("p", "product", "v", "value"),
                        edge("p", "product", "q", "a"), edge("z", "value", "q", "b"),
                        edge("q", "product", "t", "value")), name="diverging")


def test_non_finite_numbers_are_data_and_every_reply_is_valid_json(shared_server):
    run_id = shared_server.submit(diverging())["run_id"]
    shared_server.wait_status(run_id, "succeeded")
    status, text = raw(shared_server, "GET", f"/api/runs/{run_id}/metrics")
    series = strict(text)["series"]  # type: ignore[index]  # the reply is a JSON object
    assert series["val_loss"][0]["value"] is None and series["val_loss"][0]["non_finite"] == "inf"
    assert series["train_loss"][0]["value"] is None and series["train_loss"][0]["non_finite"] == "nan"
    _, csv_text = raw(shared_server, "GET", f"/api/runs/{run_id}/metrics?format=csv")
    assert ",inf," in csv_text and ",nan," in csv_text
    for path in (f"/api/runs/{run_id}/events", f"/api/runs/{run_id}", "/api/runs?limit=5"):
        status, text = raw(shared_server, "GET", path)
        assert status == 200
        strict(text)
    row = shared_server.get(f"/api/runs/{run_id}")
    assert row["final_loss"] is None and row["final_loss_non_finite"] == "inf"
    for kind, data in shared_server.client.stream(f"/api/runs/{run_id}/stream", read_timeout=30):
        if kind == "run_event":
            strict(json.dumps(data))
            if data["type"] == "run_finished":
                break


DEEP = b'{"graph": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
HUGE_INT = b'{"graph": {"version": ' + b"9" * 5000 + b', "nodes": [], "edges": []}}'


def nested_params(depth: int) -> bytes:
    value = "1"
    for _ in range(depth):
        value = '{"a": ' + value + "}"
    return ('{"graph": {"version": 1, "nodes": [{"id": "a", "type": "core.Constant", "params": {"value": '
            + value + '}}], "edges": []}}').encode()


def cursor(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def ticker_sweep(param: str, span: dict) -> bytes:
    base = graph(node("t", "core.Ticker", count=1, interval=0, name="val_loss"), device="cpu")
    return json.dumps({"name": "s", "base_graph": base, "objective": {"metric": "val_loss", "direction": "minimize"},
                       "sweep_spec": {"method": "grid", "params": [{"node_id": "t", "param": param, "range": span}]}
                       }).encode()


# A name that is a lone surrogate, sent as UTF-16 JSON: ASCII bytes with NULs between.
UTF16_SURROGATE = json.dumps({"graph": {"version": 1, "name": "@", "nodes": [], "edges": []}}).replace(
    '"@"', '"\\ud800"').encode("utf-16-le")


@pytest.mark.parametrize("method, path, body", [
    ("POST", "/api/runs", DEEP),
    ("POST", "/api/export", DEEP),
    ("POST", "/api/sweeps", DEEP),
    ("POST", "/api/workers/credentials", DEEP),
    ("POST", "/api/runs", nested_params(900)),
    ("POST", "/api/runs", HUGE_INT),
    ("POST", "/api/runs", b'{"graph": {"version": 1, "nodes": [{"id": "a", "type": "core.Constant", "params": '
                          b'{"value": 1' + b"0" * 400 + b'}}], "edges": []}}'),
    ("GET", f"/api/runs/{'a' * 32}/events?after={2**63}", None),
    ("GET", f"/api/runs/{'a' * 32}/events?tail={2**63}", None),
    ("GET", f"/api/runs?cursor={cursor('runs:' + str(2**64))}", None),
    # These once crashed the placer (a 503 for every ask in its mailbox) or answered 500.
    ("POST", "/api/runs", json.dumps({"graph": graph(node("a", "core.Constant", value=1) | {
        "resources": {"ram": "2000000T"}})}).encode()),
    ("POST", "/api/flavors", b'{"name": "huge", "ram": "2000000T"}'),
    ("POST", "/api/runs", UTF16_SURROGATE),
    ("POST", "/api/sweeps", ticker_sweep("count", {"min": -1e308, "max": 1e308, "count": 2, "type": "int"})),
    ("POST", "/api/sweeps", ticker_sweep("interval", {"min": 1e300, "max": sys.float_info.max, "count": 3,
                                                      "scale": "log"})),
])
def test_no_request_shape_gives_a_500(shared_server, method, path, body):
    status, text = raw(shared_server, method, path, body)
    assert 400 <= status < 500, (status, text[:300])
    assert strict(text)["error"]["code"]  # type: ignore[index]  # the reply is a JSON object


def test_a_non_utf8_authorization_header_is_a_401(shared_server):
    host, port = shared_server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.putrequest("POST", "/api/runs")
    conn.putheader("Authorization", b"Bearer \xff\xfe\xfa")
    conn.putheader("Content-Length", "2")
    conn.endheaders(b"{}")
    response = conn.getresponse()
    assert response.status == 401 and strict(response.read().decode())["error"]["code"] == "unauthorized"


def test_a_stream_after_a_huge_seq_is_refused_cleanly(shared_server):
    run_id = shared_server.submit(hello())["run_id"]
    shared_server.wait_status(run_id, "succeeded")
    status, text = raw(shared_server, "GET", f"/api/runs/{run_id}/stream?after={2**63}")
    assert status == 400 and strict(text)["error"]["pointer"] == "?after"


@pytest.mark.parametrize("name", ["any", "local", "../evil/x", "a/cuda:0", "credentials"])
async def test_an_agent_with_the_session_token_needs_a_valid_worker_name(shared_server, name):
    async with aiohttp.ClientSession() as session, session.ws_connect(
            shared_server.url.replace("http://", "ws://") + "/ws/worker",
            headers={"Authorization": f"Bearer {shared_server.token}"}) as ws:
        await ws.send_str(agent_hello(name=name))
        refused = wire.parse_frame((await ws.receive(timeout=10)).data)
    assert isinstance(refused, wire.Refused) and refused.code == "unauthorized"
    assert "worker name" in refused.reason


async def test_the_session_token_from_a_peer_that_is_not_loopback_is_refused_saying_why(shared_server):
    # 127.0.0.2 reaches the server but is not one of the loopback peers it trusts.
    connector = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
    async with aiohttp.ClientSession(connector=connector) as session, session.ws_connect(
            shared_server.url.replace("http://", "ws://") + "/ws/worker",
            headers={"Authorization": f"Bearer {shared_server.token}"}) as ws:
        await ws.send_str(agent_hello(name="remote"))
        refused = wire.parse_frame((await ws.receive(timeout=10)).data)
    assert isinstance(refused, wire.Refused) and "only from this machine" in refused.reason


async def test_the_subscriber_gauge_counts_only_connected_clients(shared_server):
    def gauge() -> float:
        _, text = raw(shared_server, "GET", "/metrics")
        return float(next(line.split()[-1] for line in text.splitlines()
                          if line.startswith("troupe_stream_subscribers")))

    before = gauge()
    async with aiohttp.ClientSession() as session:
        response = await session.get(shared_server.url + "/api/stream")
        await response.content.readline()  # the stream is open
        assert gauge() == before + 1
        response.close()  # the client leaves without a word
    assert gauge() == before  # exact at once, not after the next keepalive


def _few_files() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (160, 160))  # soft = hard: start cannot raise it


def test_a_flood_of_half_sent_headers_is_closed_and_logged_once(tmp_path):
    import socket
    import time

    from tests.helpers import Server

    server = Server(tmp_path / "flood", preexec=_few_files).start()
    host, port = server.url.removeprefix("http://").split(":")
    sockets = []
    try:
        for _ in range(250):  # more than the server has descriptors for
            sock = socket.create_connection((host, int(port)), timeout=5)
            sock.sendall(b"GET /api/info HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the blank line
            sockets.append(sock)
        closed = 0
        deadline = time.monotonic() + 40
        for sock in sockets:  # each is closed by the server once its header time is up
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                closed += sock.recv(1) == b""
            except (TimeoutError, ConnectionResetError):
                closed += isinstance(sys.exc_info()[1], ConnectionResetError)
        assert closed == len(sockets)
        status, _ = raw(server, "GET", "/api/info")
        assert status == 200  # and the API answers again
        assert server.proc.poll() is None
    finally:
        for sock in sockets:
            sock.close()
        server.kill()
    flood = [line for line in server.output if "out of file descriptors" in line or "Too many open files" in line]
    assert len(flood) <= 3, flood  # once per interval, never once per connection


async def test_the_session_token_from_loopback_needs_this_machines_id(shared_server):
    async with aiohttp.ClientSession() as session, session.ws_connect(
            shared_server.url.replace("http://", "ws://") + "/ws/worker",
            headers={"Authorization": f"Bearer {shared_server.token}"}) as ws:
        await ws.send_str(agent_hello(name="tunnelled", machine_id="another-machine"))
        refused = wire.parse_frame((await ws.receive(timeout=10)).data)
    assert isinstance(refused, wire.Refused) and "machine id" in refused.reason


def test_a_rerun_refuses_what_its_run_could_not_keep_and_stays_rerunnable(shared_server):
    ticker = graph(node("t", "core.Ticker", count=1, interval=0, name="val_loss"), device="cpu")
    full = {f"t.k{i}": 1 for i in range(100)}  # what --set recorded: as many as a run keeps
    run_id = shared_server.submit(ticker, params_set=full)["run_id"]
    shared_server.wait_status(run_id, "succeeded")
    # A name in a param that holds one value, not a mapping of names.
    status, text = raw(shared_server, "POST", f"/api/runs/{run_id}/rerun", b'{"params_set": {"t.count.x": 2}}')
    assert status == 400 and strict(text)["error"]["pointer"] == "/params_set/t.count.x", text  # type: ignore[index]
    # One more set than a run keeps: refused, where it once made a run no rerun could copy.
    status, text = raw(shared_server, "POST", f"/api/runs/{run_id}/rerun", b'{"params_set": {"t.count": 2}}')
    assert status == 400 and strict(text)["error"]["pointer"] == "/params_set", text  # type: ignore[index]
    status, text = raw(shared_server, "POST", f"/api/runs/{run_id}/rerun", b"{}")
    assert status == 201, text


def test_a_login_from_a_user_agent_that_is_not_text_is_named_in_text(shared_server):
    status, made = shared_server.client.request("POST", "/api/login-links", {"uses": 1})
    assert status == 201, made
    token = made["login_url"].split("token=", 1)[1]
    host, port = shared_server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    body = json.dumps({"token": token}).encode()
    conn.putrequest("POST", "/api/login")
    conn.putheader("User-Agent", b"curl\xff\xfe\tx")  # not UTF-8, and a tab
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body)
    response = conn.getresponse()
    reply = strict(response.read().decode())
    assert response.status == 201, reply
    sessions = shared_server.get("/api/sessions")["sessions"]
    label = next(s["label"] for s in sessions if s["id"] == reply["id"])  # type: ignore[index]
    assert label.endswith("curl???x"), label


@pytest.mark.parametrize(("machine_id", "expected"), [("abcdef0123", "worker-abcdef01"), ("x/cpu", None),
                                                      ("ÄB#\u0001", None)])
def test_a_worker_enrolled_without_a_name_gets_a_worker_name_whatever_its_machine_id(make_server, machine_id,
                                                                                      expected):
    server = make_server()
    token = server.client.request("POST", "/api/workers/enrollments", {})[1]["token"]
    status, reply = server.anonymous.request("POST", "/api/workers/credentials",
                                             {"token": token, "machine_id": machine_id})
    assert status == 201, reply
    name = reply["name"]
    if expected is not None:
        assert name == expected
    else:  # a digest of it: a name queue keys and file names can hold
        assert len(name) == len("worker-") + 8 and name.startswith("worker-") and name[7:].isalnum(), name
        assert name == name.lower() and "/" not in name


def test_a_console_page_starts_where_a_character_does_and_a_choice_is_given_once(shared_server):
    printed = graph(node("k", "core.Constant", value=1),
                    node("p", "core.Print", prefix="h\u00e9llo\u20ac ", stream="stdout"),
                    edges=(edge("k", "value", "p", "value"),))
    run_id = shared_server.submit(printed)["run_id"]
    shared_server.wait_status(run_id, "succeeded")
    assert shared_server.get(f"/api/runs/{run_id}/console?offset=6")["text"].startswith("\u20ac")  # € is bytes 6-8
    status, reply = shared_server.client.request("GET", f"/api/runs/{run_id}/console?offset=7")
    assert (status, reply["error"]["pointer"]) == (400, "?offset"), reply  # it answered 200 with U+FFFD
    for query, pointer in (("console?nodes=true&nodes=false", "?nodes"), ("metrics?format=csv&format=json", "?format"),
                           ("metrics?lineage=true&lineage=false", "?lineage"), ("metrics?lineage=", "?lineage"),
                           ("metrics?format=", "?format")):  # empty is no choice either
        status, reply = shared_server.client.request("GET", f"/api/runs/{run_id}/{query}")
        assert (status, reply["error"]["pointer"]) == (400, pointer), (query, reply)
    assert shared_server.get(f"/api/runs/{run_id}/metrics?lineage=true")["series"] == {}
    # The document says what these reads answer while a run's worker is away.
    paths = shared_server.get("/api/openapi.json")["paths"]
    for path in ("/api/runs/{run_id}/outputs", "/api/runs/{run_id}/outputs/{node_id}"):
        assert "503" in paths[path]["get"]["responses"], path
