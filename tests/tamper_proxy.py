"""An HTTP proxy on loopback, between an agent and the control plane, that hands on
every request and the agent's websocket as they are, except a pack's archive, whose
bytes go through ``tamper`` first: what a compromised mirror or a cut transfer would do
to a pack on its way to a worker. Its own event loop runs in a thread, so synchronous
tests drive it directly."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

_HOP = {"host", "connection", "upgrade", "transfer-encoding", "content-length", "content-encoding",
        "sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions", "keep-alive"}


class TamperProxy:
    def __init__(self, upstream: str, tamper: Callable[[bytes], bytes]) -> None:
        self.upstream = upstream.rstrip("/")
        self.tamper = tamper
        self.archives = 0  # pack archives it handed on, tampered
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._runner: web.AppRunner | None = None
        threading.Thread(target=self._serve, name="tamper-proxy", daemon=True).start()
        if not self._started.wait(10):
            raise RuntimeError("the proxy did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        async def stop() -> None:
            if self._runner is not None:
                await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._hand_on)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._started.set()
        self._loop.run_forever()

    async def _hand_on(self, request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with aiohttp.ClientSession() as session:
            if request.headers.get("Upgrade", "").lower() == "websocket":
                return await self._websocket(request, session, headers)
            async with session.request(request.method, self.upstream + request.path_qs, headers=headers,
                                       data=await request.read()) as answer:
                body = await answer.read()
                if request.path.startswith("/api/packs/") and request.path.endswith("/archive") \
                        and answer.status == 200:
                    body = self.tamper(body)
                    self.archives += 1
                kept = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP}
                return web.Response(body=body, status=answer.status, headers=kept)

    async def _websocket(self, request: web.Request, session: aiohttp.ClientSession,
                         headers: dict[str, str]) -> web.WebSocketResponse:
        agent_side = web.WebSocketResponse(autoping=True)
        await agent_side.prepare(request)
        url = self.upstream.replace("http://", "ws://") + request.path_qs
        async with session.ws_connect(url, headers=headers, autoping=True) as plane_side:
            await asyncio.gather(_pump(agent_side, plane_side), _pump(plane_side, agent_side))
        return agent_side


async def _pump(source: Any, target: Any) -> None:
    async for message in source:
        if message.type == aiohttp.WSMsgType.TEXT:
            await target.send_str(message.data)
        elif message.type == aiohttp.WSMsgType.BINARY:
            await target.send_bytes(message.data)
        else:
            break
    await target.close()
