"""A stand-in for an actor's peer in unit tests driven by messages."""

from __future__ import annotations

import asyncio
from typing import Any

from actors.base import Actor


class Inbox(Actor):
    """Keeps what it was told, in order. ``settled()`` returns once every message told
    to it before has been received (an ask behind them in the mailbox)."""

    _PING = object()

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.got: list[Any] = []
        self.arrived = asyncio.Event()

    async def receive(self, message: Any) -> None:
        if message is Inbox._PING:
            return
        self.got.append(message)
        self.arrived.set()

    async def settled(self) -> list[Any]:
        await self.ref.ask(Inbox._PING)
        return self.got
