"""Server-sent event streams: one run's events, and every run's changes.

Subscribe first, replay from the store second, live third, skipping seqs already sent:
the hand-over has no gap and no duplicate. A ``RESET`` from the hub (it restarted, or we
fell behind) is answered by subscribing and replaying again from the last seq sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web

from actors.events import RESET, Subscribe, Unsubscribe
from actors.store.runs import QueuePosition, ReadStream
from protocol import events as ev
from protocol import jsonsafe
from protocol.errors import NotFound
from web.context import Services, services
from web.requests import int_query, run_id_from

routes = web.RouteTableDef()

KEEPALIVE_S = 15.0


async def _open_sse(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )
    await response.prepare(request)
    return response


def _connected(request: web.Request) -> Callable[[], bool]:
    """Whether the client of this request is still there (read by the subscriber gauge)."""

    def alive() -> bool:
        transport = request.transport
        return transport is not None and not transport.is_closing()

    return alive


def _frame(kind: str, data: Any) -> bytes:
    return f"event: {kind}\ndata: {jsonsafe.dumps(data)}\n\n".encode()


def _event_frame(event: dict[str, Any]) -> bytes:
    return f"id: {event['seq']}\nevent: run_event\ndata: {ev.event_json(event)}\n\n".encode()


async def _burst(queue: asyncio.Queue[Any]) -> list[Any]:
    """The next item and every item already behind it: a burst is written as one chunk,
    one socket write, however many events it holds. Waits up to ``KEEPALIVE_S`` for the
    first; an empty list means none came."""
    try:
        items = [await asyncio.wait_for(queue.get(), KEEPALIVE_S)]
    except TimeoutError:
        return []
    while not queue.empty():
        items.append(queue.get_nowait())
    return items


class _RunStream:
    def __init__(self, svc: Services, request: web.Request, run_id: str, after: int) -> None:
        self.svc, self.request, self.run_id = svc, request, run_id
        self.response: web.StreamResponse | None = None  # opened once the run is known
        self.last = after
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.finished = False
        self.position: int | None = None

    async def subscribe(self) -> None:
        hub = self.svc.actor("events")
        # Row changes of every run move this run's queue position.
        await hub.ask(Subscribe(self.queue, (self.run_id, None), _connected(self.request)))

    async def replay(self) -> None:
        """Sends the stored events after the last one sent, then the queue position; a
        run that is not there (any more) is a 404 before the stream opens."""
        cap = self.svc.settings.run_events_response_cap_bytes
        while True:
            found = await self.svc.store.read(ReadStream(self.run_id, after=self.last, cap_bytes=cap))
            if found is None and self.response is None:
                raise NotFound(f"no run {self.run_id}", code="run_not_found")
            if found is None:  # deleted while followed: nothing more will come
                self.finished = True
                return
            events, next_after, position = found
            chunks = [self.event_frame(event) for event in events]
            if next_after is None:
                if not self.finished:
                    chunks.append(self.position_frame(position))
                await self._write(chunks)
                return
            await self._write(chunks)

    def event_frame(self, event: dict[str, Any]) -> bytes:
        """The event's SSE frame, or nothing for a seq already sent."""
        if event["seq"] <= self.last or self.finished:
            return b""
        self.last = event["seq"]
        if event["type"] == ev.RUN_FINISHED:
            self.finished = True
        return _event_frame(event)

    def position_frame(self, position: int | None) -> bytes:
        if position == self.position:
            return b""
        self.position = position
        return _frame("queue_position", {"run_id": self.run_id, "queue_position": position})

    async def open(self) -> web.StreamResponse:
        if self.response is None:
            self.response = await _open_sse(self.request)
        return self.response

    async def _write(self, chunks: list[bytes]) -> None:
        data = b"".join(chunks)
        if data:
            await (await self.open()).write(data)

    async def live(self) -> None:
        while not self.finished:
            items = await _burst(self.queue)
            if not items:
                await self._write([b": keepalive\n\n"])
                continue
            chunks: list[bytes] = []
            moved = False  # a row changed: this run's queue position may have moved
            for item in items:
                if item is RESET:
                    await self._write(chunks)
                    chunks, moved = [], False
                    await self.subscribe()
                    await self.replay()
                elif "seq" in item:
                    chunks.append(self.event_frame(item))
                else:
                    moved = True
            if moved and self.position is not None and not self.finished:
                chunks.append(self.position_frame(await self.svc.store.read(QueuePosition(self.run_id))))
            await self._write(chunks)

    async def close(self) -> None:
        hub = self.svc.registry.lookup("events")
        if hub is not None:
            hub.tell(Unsubscribe(self.queue))


@routes.get("/api/runs/{run_id}/stream")
async def run_stream(request: web.Request) -> web.StreamResponse:
    svc = services(request)
    stream = _RunStream(svc, request, run_id_from(request), int_query(request, "after", default=0) or 0)
    try:
        await stream.subscribe()
        await stream.replay()  # a 404 when there is no such run
        response = await stream.open()
        await stream.live()
        await response.write_eof()
    except (ConnectionError, asyncio.CancelledError):
        pass  # the client left: nothing to say about it
    finally:
        await stream.close()
    # A client that left before the stream opened gets nothing (aiohttp drops it).
    return stream.response if stream.response is not None else web.Response(status=204)


@routes.get("/api/stream")
async def all_runs_stream(request: web.Request) -> web.StreamResponse:
    svc = services(request)
    queue: asyncio.Queue[Any] = asyncio.Queue()
    response = await _open_sse(request)
    hub = svc.actor("events")
    try:
        await hub.ask(Subscribe(queue, (None,), _connected(request)))
        await response.write(_frame("hello", {"server_started_at": svc.started_at}))
        while True:
            items = await _burst(queue)
            if not items:
                await response.write(b": keepalive\n\n")
                continue
            chunks: list[bytes] = []
            for item in items:
                if item is RESET:
                    # The hub restarted: the client refetches the list, then follows again.
                    chunks.append(_frame("reset", {}))
                    await svc.actor("events").ask(Subscribe(queue, (None,), _connected(request)))
                    continue
                chunks.append(_frame("run", item))
            await response.write(b"".join(chunks))
    except (ConnectionError, asyncio.CancelledError):
        pass  # the client left
    finally:
        live_hub = svc.registry.lookup("events")
        if live_hub is not None:
            live_hub.tell(Unsubscribe(queue))
    return response
