"""Slow and idle connections cannot lock everyone out.

- A connection that has not sent a complete request header within ``HEADER_TIMEOUT_S``
  is closed (aiohttp's keep-alive timer runs from the moment a connection is made).
- ``troupe start`` raises the soft open-file limit to the hard one (``raise_open_files``).
- A few descriptors are held in reserve: when ``accept()`` fails for want of them, the
  reserve is let go so the process can still open its database and answer the
  connections it has, and it is taken back once descriptors are free again.
- That failure is logged once per ``FLOOD_LOG_S`` with a count, never once per attempt
  (asyncio would log every retry).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import time
from typing import Any

log = logging.getLogger("troupe.web")

HEADER_TIMEOUT_S = 10.0
FLOOD_LOG_S = 30.0
RESERVE_FDS = 16


def raise_open_files() -> tuple[int, int]:
    """Soft limit of open files up to the hard one; returns (soft, hard) now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %s to %s: %s", soft, target, exc)
    return soft, hard


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
