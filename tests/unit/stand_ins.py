"""A stand-in for an actor's peer in unit tests driven by messages."""

from __future__ import annotations

import asyncio
from typing import Any

from troupe.actors.base import Actor
from troupe.actors.store import StoreClient
from troupe.actors.store.runs import InsertRun, UpdateRun
from troupe.protocol.queue_key import QueueKey
from troupe.protocol.run_record import RunRecord


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


def run_record(run_id: str, seq: int = 1, **fields: Any) -> RunRecord:
    """A queued cpu run's record, as the placer would admit it."""
    return RunRecord(**{"id": run_id, "name": None, "queue_key": QueueKey(None, "cpu"), "device": "cpu",
                        "devices": ("cpu",), "lane": "queued", "graph": {}, "options": {}, "created_at": "t",
                        "enqueue_seq": seq, **fields})


def store_run(store: StoreClient, record: RunRecord, status: str = "queued", **later: Any) -> asyncio.Future[Any]:
    """Stores a run as admitted, then as it went on (its status, the columns ``later``
    sets), in one batch; the last write's future."""
    written = store.write(InsertRun(record))
    if status != "queued" or later:
        written = store.write(UpdateRun(record.id, {"status": status, **later}))
    return written
