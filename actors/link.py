"""Link (agent side): the agent's one outbound socket to ``/ws/worker``. It never
listens. It says hello, sends heartbeats, and reconnects with backoff while the control
plane is unreachable; a final refusal (wrong version, revoked credential) ends the agent
with exit 1, since no retry can fix it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from actors.base import Actor
from protocol import worker as wire

log = logging.getLogger("troupe.agent")

BACKOFF_S = (0.5, 1, 2, 4, 8, 15, 30)


@dataclass(frozen=True)
class LinkConfig:
    url: str
    credential: str
    hello: Callable[[], Any]  # an awaitable factory of the Hello frame (inventory is read each time)
    on_final: Callable[[int, str], None]  # exit code, reason
    on_frame: Callable[[Any], None] = lambda frame: None  # assign and cancel frames go here


@dataclass(frozen=True)
class Send:
    """A frame for the control plane; frames sent while disconnected wait for the next
    connection."""

    frame: Any


class Link(Actor):
    def __init__(self, config: LinkConfig) -> None:
        super().__init__("link")
        self._config = config
        self._task: asyncio.Task[None] | None = None
        self._outbox: asyncio.Queue[Any] = asyncio.Queue()

    async def on_start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="link")

    async def on_stop(self, reason: str) -> None:
        if self._task is not None:
            self._task.cancel()

    async def receive(self, message: Any) -> Any:
        if isinstance(message, Send):
            self._outbox.put_nowait(message.frame)
            return None
        raise TypeError(f"link got an unknown message {message!r}")

    async def _run(self) -> None:
        attempt = 0
        ws_url = self._config.url.rstrip("/").replace("http://", "ws://").replace("https://", "wss://") + "/ws/worker"
        headers = {"Authorization": f"Bearer {self._config.credential}"}
        async with aiohttp.ClientSession() as session:
            while True:
                try:
                    async with session.ws_connect(ws_url, headers=headers, heartbeat=None) as ws:
                        attempt = 0
                        if await self._session(ws):
                            return
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    log.warning("control plane unreachable at %s: %s", ws_url, exc)
                delay = BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]
                attempt += 1
                await asyncio.sleep(delay)

    async def _session(self, ws: aiohttp.ClientWebSocketResponse) -> bool:
        """One connection; True when the agent must stop."""
        numbers = wire.Numbering()
        hello = await self._config.hello()
        await ws.send_str(wire.dump_frame(hello, numbers.next()))
        first = await ws.receive(timeout=30)
        if first.type != aiohttp.WSMsgType.TEXT:
            return False
        answer = wire.parse_frame(first.data)
        numbers.is_new(answer)
        if isinstance(answer, wire.Refused):
            self._config.on_final(1, f"refused by the control plane: {answer.reason}")
            return True
        if not isinstance(answer, wire.Welcome):
            return False
        log.info("connected as %s%s", answer.name, " (degraded)" if answer.degraded else "")
        beats = asyncio.ensure_future(self._beat(ws, answer.heartbeat_s, numbers))
        sending = asyncio.ensure_future(self._drain_outbox(ws, numbers))
        acked = 0
        try:
            async for message in ws:
                if message.type != aiohttp.WSMsgType.TEXT:
                    continue
                frame = wire.parse_frame(message.data)
                if not numbers.is_new(frame):
                    log.warning("the control plane sent frame %s twice: dropped", frame.frame_no)
                    continue
                if isinstance(frame, wire.Ack):
                    acked = max(acked, frame.upto)
                if isinstance(frame, wire.Refused):
                    self._config.on_final(1, f"refused by the control plane: {frame.reason}")
                    return True
                if isinstance(frame, wire.Drain):
                    log.info("asked to drain: no new runs will come")
                if isinstance(frame, wire.Assign | wire.CancelRun | wire.KillRun):
                    self._config.on_frame(frame)
        finally:
            beats.cancel()
            sending.cancel()
            if numbers.sent > acked:
                log.warning("connection lost with frames after %s unacknowledged (%s sent)", acked, numbers.sent)
        return False

    async def _drain_outbox(self, ws: aiohttp.ClientWebSocketResponse, numbers: wire.Numbering) -> None:
        while not ws.closed:
            frame = await self._outbox.get()
            try:
                await ws.send_str(wire.dump_frame(frame, numbers.next()))
            except (ConnectionResetError, aiohttp.ClientError):
                self._outbox.put_nowait(frame)  # sent again on the next connection
                return

    async def _beat(self, ws: aiohttp.ClientWebSocketResponse, every: float, numbers: wire.Numbering) -> None:
        while not ws.closed:
            await asyncio.sleep(every)
            await ws.send_str(wire.dump_frame(wire.Heartbeat(), numbers.next()))
