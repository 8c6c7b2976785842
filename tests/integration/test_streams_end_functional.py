"""A finished run's stream, opened again by a client that has its whole log (an
EventSource reconnecting with ``Last-Event-ID`` at or past the last seq), ends at once
instead of sending keepalives for ever."""

from __future__ import annotations

import http.client
import urllib.parse

from tests.helpers import hello


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
