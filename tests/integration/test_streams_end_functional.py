"""A finished run's stream, opened again by a client that has its whole log (an
EventSource reconnecting with ``Last-Event-ID`` at or past the last seq), ends at once
instead of sending keepalives for ever."""

from __future__ import annotations

import http.client
import io
import json
import urllib.parse
from collections.abc import Callable
from typing import Any

from tests.helpers import hello, sleeper


def _reopen(server, run_id: str, last_event_id: int) -> tuple[int, bytes]:
    parts = urllib.parse.urlsplit(server.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)  # keepalives come every 15 s
    conn.request("GET", f"/api/runs/{run_id}/stream", headers={"Accept": "text/event-stream",
                                                                 "Last-Event-ID": str(last_event_id)})
    response = conn.getresponse()
    body = response.read()  # to the end of the stream: a socket timeout here is the defect
    conn.close()
    return response.status, body


def test_a_finished_runs_stream_ends_for_a_reader_that_has_its_whole_log(shared_server):
    run_id = shared_server.submit(hello())["run_id"]
    events = shared_server.events_until_finished(run_id)
    last = events[-1]["seq"]
    for given in (last, last + 5):
        status, body = _reopen(shared_server, run_id, given)
        assert status == 200 and b"event: run_event" not in body, body[:200]
    status, body = _reopen(shared_server, run_id, last - 1)  # one short: that one, then the end
    assert status == 200 and body.count(b"event: run_event") == 1


def _open_stream(server, run_id: str) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    parts = urllib.parse.urlsplit(server.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("GET", f"/api/runs/{run_id}/stream", headers={"Accept": "text/event-stream"})
    return conn, conn.getresponse()


def test_a_finished_runs_stream_is_one_reply_and_a_running_runs_stream_stays_open(shared_server):
    """A run that has ended is sent whole, with its length; one still going is followed
    as it goes, and its stream ends after ``run_finished``. Both open with the retry."""
    done = shared_server.submit(hello())["run_id"]
    shared_server.wait_status(done, "succeeded")
    conn, response = _open_stream(shared_server, done)
    assert response.status == 200 and response.getheader("Content-Type") == "text/event-stream"
    assert response.getheader("Transfer-Encoding") is None
    body = response.read()  # the whole log, to the end of the reply
    conn.close()
    assert len(body) == int(response.getheader("Content-Length") or -1)
    frames = _frames(io.BytesIO(body), lambda f: bool(f) and f[-1].get("data", {}).get("type") == "run_finished")
    assert frames[0] == {"retry": "3000"}
    events = [f["data"] for f in frames[1:]]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1)) == [int(f["id"]) for f in frames[1:]]
    assert events[0]["type"] == "run_queued" and events[-1]["payload"]["status"] == "succeeded"

    going = shared_server.submit(sleeper(30))["run_id"]
    conn, response = _open_stream(shared_server, going)
    assert response.getheader("Transfer-Encoding") == "chunked" and response.getheader("Content-Length") is None
    started = _frames(response, lambda f: any(x.get("data", {}).get("type") == "node_started" for x in f))
    assert started[0] == {"retry": "3000"}
    status, _ = shared_server.client.request("POST", f"/api/runs/{going}/cancel")
    assert status == 200
    rest = _frames(response, lambda f: bool(f) and f[-1].get("data", {}).get("type") == "run_finished")
    assert response.read() == b""  # the stream ended with the run
    conn.close()
    seqs = [f["data"]["seq"] for f in started + rest if "seq" in f.get("data", {})]
    assert seqs == list(range(1, len(seqs) + 1)) and rest[-1]["data"]["payload"]["status"] == "cancelled"


def _frames(response: http.client.HTTPResponse | io.BytesIO, until: Callable[[list[dict]], bool]) -> list[dict]:
    """The stream's frames as {"id", "event", "data", "retry"} until ``until`` holds."""
    frames: list[dict] = []
    frame: dict = {}
    while not until(frames):
        line = response.readline().decode().rstrip("\r\n")
        if line == "":
            if frame:
                frames.append(frame)
            frame = {}
            continue
        field, _, value = line.partition(":")
        if field:  # a line starting with ":" is a comment (a keepalive)
            frame[field] = json.loads(value) if field == "data" else value.strip()
    return frames


def _follow_all(server, last_event_id: str | None = None) -> tuple[http.client.HTTPConnection, Any]:
    parts = urllib.parse.urlsplit(server.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    headers = {"Accept": "text/event-stream", "Authorization": f"Bearer {server.token}"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    conn.request("GET", "/api/stream", headers=headers)
    return conn, conn.getresponse()


def test_the_global_stream_numbers_its_changes_and_a_client_back_with_its_id_gets_what_it_missed(make_server):
    server = make_server()
    conn, response = _follow_all(server)
    first = server.submit(hello())["run_id"]
    seen = _frames(response, lambda f: any(x.get("data", {}).get("run_id") == first and
                                            x["data"].get("status") == "succeeded" for x in f))
    conn.close()
    assert seen[0] == {"retry": "3000"} and seen[1]["event"] == "hello"
    changes = [f for f in seen if f.get("event") == "run"]
    ids = [int(f["id"]) for f in changes]
    assert ids == sorted(ids) and len(set(ids)) == len(ids) and all(int(f["id"]) == f["data"]["change_id"]
                                                                     for f in changes)
    missed = [server.submit(hello())["run_id"] for _ in range(2)]
    for run_id in missed:
        server.wait_status(run_id, "succeeded")
    conn, response = _follow_all(server, str(ids[-1]))
    back = _frames(response, lambda f: sum(x.get("data", {}).get("status") == "succeeded" for x in f) == 2)
    conn.close()
    again = [f["data"] for f in back if f.get("event") == "run"]
    assert {c["run_id"] for c in again} == set(missed) and all(int(f["id"]) > ids[-1] for f in back if "id" in f)
    # created, then succeeded: hello's quick nodes take its row from queued to its end in one write
    assert [c["kind"] for c in again if c["run_id"] == missed[0]] == ["created", "status"]

    conn, response = _follow_all(server, "1")  # an id no longer held (or of another life of the server)
    told = _frames(response, lambda f: any(x.get("event") == "reset" for x in f))
    conn.close()
    assert told[-1]["data"]["reason"] == "missed"


def test_a_running_runs_stream_opened_past_its_last_event_ends_with_the_run(shared_server):
    """A reader that says it is past every event of a run still going (an id from
    another server, a typo) gets nothing old, and the stream ends when the run does."""
    run_id = shared_server.submit(sleeper(seconds=1.5))["run_id"]
    shared_server.wait_status(run_id, "running")
    status, body = _reopen(shared_server, run_id, 10**15)
    assert status == 200 and b"event: run_event" not in body, body[:200]
    assert shared_server.get(f"/api/runs/{run_id}")["status"] == "succeeded"
