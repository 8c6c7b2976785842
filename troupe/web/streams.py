"""Server-sent event streams: one run's events, and every run's changes.

A run's stream reads its log first: a finished run's log is all there is, sent in one
reply without a subscription. Otherwise it subscribes, reads on from the last seq read,
then goes live, skipping seqs already sent: the hand-over has no gap and no duplicate.
A ``RESET`` from the hub (it restarted) is answered by subscribing and replaying again
from the last seq sent. A reader too far behind (``LAGGED``) is told where to resume
(``stream_lagged``) and the stream ends; one that takes no bytes for
``TROUPE_STREAM_WRITE_TIMEOUT_S`` is disconnected. A run stream resumes from ``?after=``
or from the ``Last-Event-ID`` a reconnecting EventSource sends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web

from troupe.actors.events import BURST_BYTES, CLOSING, LAGGED, MISSED, RESET, Feed, Subscribe, Unsubscribe
from troupe.actors.store.client import LOOP_PAGE_BYTES
from troupe.actors.store.events import EventRow
from troupe.actors.store.runs import QueuePosition, ReadStream
from troupe.protocol import events as ev
from troupe.protocol import jsonsafe
from troupe.protocol.errors import NotFound
from troupe.web.context import Services, services
from troupe.web.queue_state import in_line
from troupe.web.requests import int_query, run_id_from

routes = web.RouteTableDef()

KEEPALIVE_S = 15.0
# How long an EventSource waits before it reconnects (with its Last-Event-ID): said
# first on every stream, so each client library waits the same.
RETRY_MS = 3000


_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_RETRY = f"retry: {RETRY_MS}\n\n".encode()  # the first bytes of every stream


async def _open_sse(request: web.Request) -> web.StreamResponse:
    """A stream whose first write starts with ``_RETRY``: one write, one send, not two."""
    response = web.StreamResponse(headers=_SSE_HEADERS)
    response.force_close()  # a stream that ends ends its connection: a reader waiting on it learns at once
    await response.prepare(request)
    return response


def _whole(data: bytes) -> web.Response:
    """A stream that has ended before it was opened (a finished run's log, read in one
    page) as one reply: its headers and its events leave in one send, not four (the
    headers, the retry line, the events, the chunked end), each a system call that, on
    loopback, does the reader's side of TCP too."""
    response = web.Response(body=_RETRY + data, headers=_SSE_HEADERS)
    response.force_close()
    return response


def _last_event_id(request: web.Request) -> int | None:
    """The id an EventSource that reconnects says it had (ASCII digits), else None."""
    said = request.headers.get("Last-Event-ID", "")
    return int(said) if said.isascii() and said.isdigit() and len(said) < 19 else None


def _connected(request: web.Request) -> Callable[[], bool]:
    """Whether the client of this request is still there (read by the subscriber gauge)."""

    def alive() -> bool:
        transport = request.transport
        return transport is not None and not transport.is_closing()

    return alive


def _frame(kind: str, data: Any) -> bytes:
    return f"event: {kind}\ndata: {jsonsafe.dumps(data)}\n\n".encode()


def _event_frame(seq: int, kind: str, ts: str, node_id: str | None, payload: str) -> bytes:
    return f"id: {seq}\nevent: run_event\ndata: {ev.event_json(seq, kind, ts, node_id, payload)}\n\n".encode()


async def _send(request: web.Request, response: web.StreamResponse, data: bytes, eof: bool = False) -> None:
    """Writes (or ends the stream) within the deadline, or drops the connection: a reader
    that stopped reading must not keep what is written to it."""
    try:
        async with asyncio.timeout(services(request).settings.stream_write_timeout_s):
            if eof:
                await response.write_eof()
            else:
                await response.write(data)
    except TimeoutError:
        if request.transport is not None:
            request.transport.abort()
        raise ConnectionResetError("the client took nothing for the write deadline") from None


def _let_go(request: web.Request) -> None:
    """After a stream ended: a connection whose reader still has not taken what was
    written is dropped once the write deadline passes, with what it holds."""
    transport = request.transport
    if transport is None:
        return

    def drop() -> None:
        if transport.get_write_buffer_size() > 0:
            transport.abort()

    asyncio.get_running_loop().call_later(services(request).settings.stream_write_timeout_s, drop)


def _lagged(resume_after: int | None) -> bytes:
    return _frame("stream_lagged", {
        "resume_after": resume_after,
        "message": "this reader fell too far behind the events; open the stream again"
                   + (f" with ?after={resume_after}" if resume_after is not None else "")})


def _still_allowed(svc: Services, request: web.Request) -> Callable[[], bool]:
    """Whether the session a stream was opened with still opens anything: one revoked,
    logged out or past its time gets nothing more, whatever it had open."""
    who = svc.login.who(request)
    if who is None or who.session_id is None:  # the session token, or a server that asks for none
        return lambda: True
    return lambda: svc.login.who(request) is not None


class _RunStream:
    def __init__(self, svc: Services, request: web.Request, run_id: str, after: int) -> None:
        self.svc, self.request, self.run_id = svc, request, run_id
        self.allowed = _still_allowed(svc, request)
        self.response: web.StreamResponse | None = None  # opened once the run is known
        self.held: list[bytes] = []  # frames not sent yet: the stream may end with them, in one reply
        self.last = after
        self.queue = Feed()
        self.subscribed = False
        self.finished = False
        self.position: int | None = None

    async def subscribe(self) -> None:
        hub = self.svc.actor("events")
        # Row changes of every run move this run's queue position.
        self.subscribed = True  # before the ask: one cut short may still have subscribed
        await hub.ask(Subscribe(self.queue, (self.run_id, None), _connected(self.request)))

    async def replay(self) -> None:
        """Sends the stored events after the last one sent, then the queue position; a
        run that is not there (any more) is a 404 before the stream opens."""
        # Small pages: a page waits in memory while a slow reader takes it. The first is
        # smaller still, read on the loop (most runs' logs fit in it whole).
        cap = min(self.svc.settings.run_events_response_cap_bytes, BURST_BYTES) or BURST_BYTES
        page = min(cap, LOOP_PAGE_BYTES)
        while True:
            found = await self.svc.store.read(ReadStream(self.run_id, after=self.last, cap_bytes=page))
            page = cap
            if found is None and self.response is None:
                raise NotFound(f"no run {self.run_id}", code="run_not_found")
            if found is None:  # deleted while followed: nothing more will come
                self.finished = True
                return
            rows, next_after, position, ended = found
            self.finished = self.finished or ended  # the reader has the whole log already
            chunks = [self.row_frame(row) for row in rows]
            del rows, found  # only the frames wait for the reader
            if next_after is None:
                if not self.finished:
                    chunks.append(self.position_frame(position))
                if self.response is None:
                    self.held.extend(chunks)  # sent with what follows, or alone if it ends here
                else:
                    await self._write(chunks)
                return
            await self._write(chunks)

    def event_frame(self, event: dict[str, Any]) -> bytes:
        """A published event's SSE frame, or nothing for a seq already sent."""
        if not self._fresh(event["seq"], event["type"]):
            return b""
        return _event_frame(event["seq"], event["type"], event["ts"], event["node_id"], ev.payload_json(event))

    def row_frame(self, row: EventRow) -> bytes:
        """A stored event's SSE frame (its payload as stored, not parsed), or nothing for
        a seq already sent."""
        return _event_frame(*row) if self._fresh(row[0], row[1]) else b""

    def _fresh(self, seq: int, kind: str) -> bool:
        if self.finished:
            return False
        if kind == ev.RUN_FINISHED:
            # Its end ends the stream even when the reader said it was past it (an
            # ``after`` beyond the last event): the stream is not held open for ever.
            self.finished = True
        if seq <= self.last:
            return False
        self.last = seq
        return True

    def position_frame(self, stored: int | None) -> bytes:
        position = in_line(self.svc, self.run_id, stored)
        if position == self.position:
            return b""
        self.position = position
        return _frame("queue_position", {"run_id": self.run_id, "queue_position": position})

    async def open(self) -> web.StreamResponse:
        """The stream, opened with what was held, in one write."""
        if self.response is None:
            self.response = await _open_sse(self.request)
            held, self.held = self.held, []
            await _send(self.request, self.response, _RETRY + b"".join(held))
        return self.response

    async def _write(self, chunks: list[bytes]) -> None:
        data = b"".join(chunks)
        if data:
            await _send(self.request, await self.open(), data)

    async def live(self) -> None:
        while not self.finished:
            items = await self.queue.burst(KEEPALIVE_S)
            if not self.allowed():
                return
            if not items:
                await self._write([b": keepalive\n\n"])
                continue
            chunks: list[bytes] = []
            moved = False  # a row changed: this run's queue position may have moved
            for item in items:
                if item is LAGGED:
                    await self._write([*chunks, _lagged(self.last)])
                    return
                if item is CLOSING:  # the server stops: the client reconnects to the next one
                    await self._write(chunks)
                    return
                if item is RESET:
                    await self._write(chunks)
                    chunks, moved = [], False
                    await self.subscribe()
                    await self.replay()
                elif "seq" in item:
                    chunks.append(self.event_frame(item))
                elif item.get("kind") == "deleted" and item.get("run_id") == self.run_id:
                    self.finished = True  # nothing more will come
                else:
                    moved = True
            if moved and self.position is not None and not self.finished:
                chunks.append(self.position_frame(await self.svc.store.read(QueuePosition(self.run_id))))
            await self._write(chunks)

    async def close(self) -> None:
        hub = self.svc.registry.lookup("events")
        if hub is not None and self.subscribed:
            hub.tell(Unsubscribe(self.queue))


@routes.get("/api/runs/{run_id}/stream")
async def run_stream(request: web.Request) -> web.StreamResponse:
    svc = services(request)
    after = int_query(request, "after", default=0) or 0
    resumed = _last_event_id(request)
    if resumed is not None:  # an EventSource reconnecting says where it was
        after = max(after, resumed)
    stream = _RunStream(svc, request, run_id_from(request), after)
    try:
        await stream.replay()  # a 404 when there is no such run
        if not stream.finished:  # subscribed, then read again: nothing written meanwhile is missed
            await stream.subscribe()
            await stream.replay()
        if stream.finished and stream.response is None:
            return _whole(b"".join(stream.held))
        response = await stream.open()
        await stream.live()
        await _send(request, response, b"", eof=True)
    except (ConnectionError, asyncio.CancelledError):
        pass  # the client left: nothing to say about it
    finally:
        await stream.close()
        _let_go(request)
    # A client that left before the stream opened gets nothing (aiohttp drops it).
    return stream.response if stream.response is not None else web.Response(status=204)


@routes.get("/api/stream")
async def all_runs_stream(request: web.Request) -> web.StreamResponse:
    svc = services(request)
    queue = Feed()
    response = await _open_sse(request)
    hub = svc.actor("events")
    allowed = _still_allowed(svc, request)
    try:
        # A client back with its Last-Event-ID gets the changes it missed, or one reset.
        await hub.ask(Subscribe(queue, (None,), _connected(request), _last_event_id(request)))
        await _send(request, response, _RETRY + _frame("hello", {"server_started_at": svc.started_at}))
        while True:
            items = await queue.burst(KEEPALIVE_S)
            if not allowed():
                await _send(request, response, b"", eof=True)
                break
            if not items:
                await _send(request, response, b": keepalive\n\n")
                continue
            chunks: list[bytes] = []
            for item in items:
                if item is LAGGED:  # the client refetches the list, then follows again
                    chunks.append(_lagged(None))
                    break
                if item is CLOSING:  # the server stops: the client reconnects to the next one
                    break
                if item is RESET:
                    # The hub restarted: the client refetches the list, then follows again.
                    chunks.append(_frame("reset", {}))
                    await svc.actor("events").ask(Subscribe(queue, (None,), _connected(request)))
                    continue
                if item is MISSED:
                    chunks.append(_frame("reset", {"reason": "missed", "message": (
                        "the changes after your Last-Event-ID are no longer held: read the list again")}))
                    continue
                chunks.append(f"id: {item['change_id']}\n".encode() + _frame("run", item))
            await _send(request, response, b"".join(chunks))
            if CLOSING in items:
                await _send(request, response, b"", eof=True)
                break
            if chunks and chunks[-1].startswith(b"event: stream_lagged"):
                break
    except (ConnectionError, asyncio.CancelledError):
        pass  # the client left
    finally:
        live_hub = svc.registry.lookup("events")
        if live_hub is not None:
            live_hub.tell(Unsubscribe(queue))
        _let_go(request)
    return response
