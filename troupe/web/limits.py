"""Slow and idle connections cannot lock everyone out.

- A connection that has not sent a complete request header within ``HEADER_TIMEOUT_S``
  is closed (aiohttp's keep-alive timer runs from the moment a connection is made).
- ``troupe start`` raises the soft open-file limit to the hard one (``troupe/cli/start_cmd.py``).
- A few descriptors are held in reserve: when ``accept()`` fails for want of them, the
  reserve is let go so the process can still open its database and answer the
  connections it has, and it is taken back once descriptors are free again.
- That failure is logged once per ``FLOOD_LOG_S`` with a count, never once per attempt
  (asyncio would log every retry).
- Every route's body has a cap fitting its purpose (``body_cap``), checked against the
  announced length before a byte is read; a JSON body must arrive whole within
  ``TROUPE_REQUEST_READ_TIMEOUT_S``, a streamed file may not stall longer than that
  between two chunks (``paced``). A refused or late body closes its connection.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from troupe.protocol.errors import InvalidRequest, PayloadTooLarge, RequestTimeout
from troupe.protocol.settings import Settings

log = logging.getLogger("troupe.web")

HEADER_TIMEOUT_S = 10.0
FLOOD_LOG_S = 30.0
RESERVE_FDS = 16
# The credential exchange answers anyone with an enrollment token: a few KB, no more.
CREDENTIAL_BODY_BYTES = 4 * 1024
# A cancel, a card's sharing, a flavor, an enrollment: small JSON.
SMALL_BODY_BYTES = 64 * 1024
# Bodies that carry a graph (or many): TROUPE_MAX_REQUEST_BYTES.
_GRAPH_ROUTES = frozenset({
    ("POST", "/api/runs"), ("POST", "/api/export"), ("POST", "/api/estimates"), ("POST", "/api/sweeps"),
    ("POST", "/api/studies"), ("POST", "/api/plugins/{plugin_id}/jobs")})
# Files streamed to disk as they arrive: TROUPE_UPLOAD_MAX_MB, and an idle deadline.
STREAMED_ROUTES = frozenset({("POST", "/api/files"), ("PUT", "/api/runs/{run_id}/artifacts")})
_CREDENTIAL_ROUTES = frozenset({("POST", "/api/workers/credentials"), ("POST", "/api/login")})


class MalformedRequests(logging.Filter):
    """aiohttp logs a whole traceback for every request it cannot parse: anyone could
    flood the log. Such a record becomes one line, at most once per ``FLOOD_LOG_S``,
    with the count of those left out."""

    def __init__(self) -> None:
        super().__init__()
        self._left_out = 0
        self._last = -FLOOD_LOG_S

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError

        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, HttpProcessingError):
            return True
        now = time.monotonic()
        if now - self._last < FLOOD_LOG_S:
            self._left_out += 1
            return False
        record.msg = "refused a malformed request from %s: %s (%d more since the last such line)"
        remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
        record.args = (remote, " ".join(str(error).split())[:200], self._left_out)
        record.exc_info, record.exc_text, record.levelno, record.levelname = None, None, logging.WARNING, "WARNING"
        self._last, self._left_out = now, 0
        return True


def body_cap(request: web.Request, settings: Settings) -> int:
    """The most the body of this request's route may hold, in bytes."""
    resource_ = request.match_info.route.resource
    route = (request.method, resource_.canonical if resource_ is not None else request.path)
    if route in _GRAPH_ROUTES:
        return settings.max_request_bytes
    if route in STREAMED_ROUTES:
        return settings.upload_max_mb * 1024 * 1024
    if route in _CREDENTIAL_ROUTES:
        return CREDENTIAL_BODY_BYTES
    return SMALL_BODY_BYTES


def refuse_announced(request: web.Request, settings: Settings) -> None:
    """413 before reading a byte when the announced length is over the route's cap."""
    length = request.content_length
    cap = body_cap(request, settings)
    if length is not None and length > cap:
        raise PayloadTooLarge(f"the request body announces {length} bytes; this route takes at most {cap}"
                              + (" (TROUPE_MAX_REQUEST_BYTES)" if cap == settings.max_request_bytes else ""),
                              details={"limit_bytes": cap})


async def read_body(request: web.Request, settings: Settings) -> bytes:
    """The whole body, refused past the route's cap and past the read deadline."""
    cap = body_cap(request, settings)
    content = request.content
    if content.is_eof():  # a small body comes with its headers: nothing to wait for
        whole = content.read_nowait()
        if len(whole) > cap:
            raise _over(cap)
        return whole
    chunks: list[bytes] = []
    total = 0
    try:
        async with asyncio.timeout(settings.request_read_timeout_s):
            async for chunk in request.content.iter_any():
                total += len(chunk)
                if total > cap:
                    raise _over(cap)
                chunks.append(chunk)
    except TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {settings.request_read_timeout_s:g} s "
                             "(TROUPE_REQUEST_READ_TIMEOUT_S)") from None
    except ConnectionError as exc:  # the sender went away: its request, not a fault of ours to log
        raise InvalidRequest(f"the request body was cut short ({exc}); nothing was kept", pointer="") from None
    return b"".join(chunks)


def _over(cap: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"the request body is over {cap} bytes, the most this route takes",
                           details={"limit_bytes": cap})


async def paced(chunks: AsyncIterator[bytes], idle_s: float) -> AsyncIterator[bytes]:
    """A streamed body's chunks; one that keeps the server waiting ``idle_s`` is cut."""
    iterator = aiter(chunks)
    while True:
        try:
            async with asyncio.timeout(idle_s):
                chunk = await anext(iterator)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise RequestTimeout(f"the upload stalled for {idle_s:g} s (TROUPE_REQUEST_READ_TIMEOUT_S)") from None
        yield chunk


class AcceptGuard:
    """The loop's exception handler for ``accept()`` running out of descriptors."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._previous = loop.get_exception_handler()
        self._reserve: list[int] = []
        self._suppressed = 0
        self._last_log = 0.0
        self._refill_handle: asyncio.TimerHandle | None = None
        self._refill()
        loop.set_exception_handler(self._handle)

    def close(self) -> None:
        self._loop.set_exception_handler(self._previous)
        if self._refill_handle is not None:
            self._refill_handle.cancel()
        self._release()

    def _handle(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if not (isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)):
            if self._previous is not None:
                self._previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        self._release()  # room to answer and to open the database
        now = time.monotonic()
        if now - self._last_log >= FLOOD_LOG_S:
            log.error("out of file descriptors: new connections wait (%d more such failures since the last "
                      "line); idle connections close after %ss", self._suppressed, HEADER_TIMEOUT_S)
            self._last_log, self._suppressed = now, 0
        else:
            self._suppressed += 1
        if self._refill_handle is None:
            self._refill_handle = loop.call_later(1.0, self._refill)

    def _release(self) -> None:
        while self._reserve:
            os.close(self._reserve.pop())

    def _refill(self) -> None:
        self._refill_handle = None
        try:
            while len(self._reserve) < RESERVE_FDS:
                self._reserve.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:  # still short: try again later
            self._refill_handle = self._loop.call_later(1.0, self._refill)
