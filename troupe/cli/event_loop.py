"""The event loop the server and an agent run on.

uvloop (libuv's loop, written in C) unless ``TROUPE_EVENT_LOOP=asyncio`` or it is not
installed (a platform it is not built for). Every actor message is a hop through the
loop, and every request and stream write a transport call: on this loop a hop between
two actors costs about half what it does on asyncio's own (bench/README.md), and
nothing in troupe depends on which loop runs it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger("troupe.cli")

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T], choice: str) -> T:
    """``asyncio.run(main)`` on the loop ``choice`` names (``uvloop`` or ``asyncio``)."""
    if choice == "uvloop":
        try:
            import uvloop
        except ImportError:
            log.warning("uvloop is not installed: running on asyncio's event loop")
        else:
            log.info("event loop: uvloop %s", uvloop.__version__)
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                return runner.run(main)
    log.info("event loop: asyncio")
    return asyncio.run(main)
