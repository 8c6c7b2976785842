"""Slow readers (issue 25, point 8): a stream subscriber that stops reading holds a bounded
amount of the server's memory. One too far behind is told where to resume
(``stream_lagged``) and its stream ends; one that takes no bytes at all is disconnected
after ``TROUPE_STREAM_WRITE_TIMEOUT_S``. Resuming from the seq it was told loses nothing."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import urllib.parse
from pathlib import Path

import pytest

from tests.helpers import graph, node

EVENTS = 100_000


def _sockets(pid: int) -> int:
    """How many sockets the process has open."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            count += os.readlink(fd).startswith("socket:")
    return count


def _ticker() -> dict:
    return graph(node("t", "core.Ticker", count=EVENTS, interval=0))


class _SmallWindow(http.client.HTTPConnection):
    """A reader whose socket takes 64 KiB before it reads (the kernel would otherwise take
    up to tcp_rmem's 32 MB for it): what a slow client over a real network looks like."""

    def connect(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)  # before connect: the window stays small
        sock.settimeout(self.timeout)
        sock.connect((self.host, self.port))
        self.sock = sock


def _open(server, path: str) -> http.client.HTTPResponse:
    """A stream whose headers are read and whose body is left unread (until _read_all)."""
    parsed = urllib.parse.urlsplit(server.url)
    conn = _SmallWindow(parsed.hostname, parsed.port, timeout=60)
    conn.request("GET", path, headers={"Accept": "text/event-stream"})
    response = conn.getresponse()
    assert response.status == 200
    return response


def _read_all(response: http.client.HTTPResponse) -> bytes:
    try:
        return response.read()
    except http.client.IncompleteRead as cut:  # the server let this reader go
        return cut.partial
    finally:
        response.close()


def _frames(data: bytes) -> list[tuple[str, dict]]:
    found = []
    for block in data.split(b"\n\n"):
        lines = dict(line.split(b": ", 1) for line in block.split(b"\n") if b": " in line and not line.startswith(b":"))
        if b"event" in lines and b"data" in lines:
            found.append((lines[b"event"].decode(), json.loads(lines[b"data"])))
    return found


@pytest.mark.timeout(180)
def test_readers_that_stop_reading_hold_bounded_memory_and_are_let_go(make_server):
    server = make_server(TROUPE_STREAM_WRITE_TIMEOUT_S="3", TROUPE_RUN_RETENTION_KEEP_LAST="-1")
    # The baseline is a server that has carried such a run once (its caches and queues at
    # their working size): what is measured is what the stalled readers add.
    server.events_until_finished(server.submit(_ticker())["run_id"], timeout=150)
    baseline, sockets = server.rss_mib(), _sockets(server.proc.pid)
    run_id = server.submit(_ticker())["run_id"]
    stalled = [_open(server, f"/api/runs/{run_id}/stream") for _ in range(20)]
    events = server.events_until_finished(run_id, timeout=150)  # a reader that keeps up misses nothing
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1)) and len(events) > EVENTS
    grown = server.rss_mib() - baseline
    assert grown < 100, f"20 stalled readers grew the server by {grown:.0f} MB"
    # Each is let go: the server closes its end once the write deadline passes.
    server.poll_until(lambda: _sockets(server.proc.pid) <= sockets, timeout=30)
    for response in stalled:
        response.close()


@pytest.mark.timeout(180)
def test_a_reader_too_far_behind_is_told_where_to_resume_and_loses_nothing(make_server):
    # A stream that opened before the flood is live when it comes (one that opens late
    # reads the stored events page by page, and is never behind by more than a page).
    server = make_server(TROUPE_STREAM_WRITE_TIMEOUT_S="120", TROUPE_MAX_PARALLEL_NODES="1")
    late_flood = graph(node("z", "core.Sleep", seconds=1.5), node("t", "core.Ticker", count=EVENTS, interval=0))
    run_id = server.submit(late_flood)["run_id"]
    slow = _open(server, f"/api/runs/{run_id}/stream")  # open, and reading nothing while the run goes on
    server.events_until_finished(run_id, timeout=150)
    frames = _frames(_read_all(slow))
    kinds = [kind for kind, _ in frames]
    assert kinds[-1] == "stream_lagged", (kinds[-5:], frames[-2:], len(frames))
    resume = frames[-1][1]["resume_after"]
    seen = [data["seq"] for kind, data in frames if kind == "run_event"]
    assert seen == list(range(1, resume + 1))
    rest = [data for kind, data in server.client.stream(f"/api/runs/{run_id}/stream?after={resume}", read_timeout=60)
            if kind == "run_event"]
    assert next(e["seq"] for e in rest) == resume + 1 and rest[-1]["type"] == "run_finished"
    assert seen + [e["seq"] for e in rest] == list(range(1, rest[-1]["seq"] + 1))
