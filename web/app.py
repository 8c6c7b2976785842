"""Builds the aiohttp application and runs it as a child service of the root."""

from __future__ import annotations

import asyncio
import logging
from html import escape as html_escape
from pathlib import Path
from typing import Any

from aiohttp import web

from actors.base import Exit
from web import (
    routes_artifacts,
    routes_editor,
    routes_export,
    routes_files,
    routes_flavors,
    routes_meta,
    routes_plugins,
    routes_rerun,
    routes_runs,
    routes_studies,
    routes_sweeps,
    routes_workers,
    streams,
    ws_worker,
)
from web.context import SERVICES, Services
from web.errors import LOGIN_LINKS_PATH, guard, json_reply
from web.limits import HEADER_TIMEOUT_S, AcceptGuard, MalformedRequests

STATIC = Path(__file__).parent / "static"


async def _index(request: web.Request) -> web.StreamResponse:
    """The page. ``?token=`` (a login link) logs the browser in with a cookie and drops
    the token from the address bar; without the cookie the page is read-only and says
    how to log in. The session token never goes into the page."""
    login = request.app[SERVICES].login
    token = request.query.get("token")
    if token is not None:
        cookie = login.redeem(token)
        if cookie is not None:
            response = web.Response(status=303, headers={"Location": "/", "Cache-Control": "no-store"})
            login.set_cookie(response, cookie)
            return response
    state = "in" if login.logged_in(request) else ("used" if token is not None else "out")
    html = (STATIC / "index.html").read_text().replace(
        '<meta name="troupe-login" content="">', f'<meta name="troupe-login" content="{html_escape(state)}">')
    return web.Response(text=html, content_type="text/html", headers={"Cache-Control": "no-store"})


async def _login_link(request: web.Request) -> web.Response:
    """A fresh one-time login link (session token only: the guard refuses a cookie here)."""
    svc = request.app[SERVICES]
    return json_reply({"login_url": svc.login.new_link(f"{request.scheme}://{request.host}")}, status=201)


def build_app(svc: Services) -> web.Application:
    app = web.Application(middlewares=[guard], client_max_size=svc.settings.max_request_bytes)
    app[SERVICES] = svc
    app.add_routes(routes_runs.routes)
    app.add_routes(routes_rerun.routes)
    app.add_routes(streams.routes)
    app.add_routes(routes_meta.routes)
    app.add_routes(routes_export.routes)
    app.add_routes(routes_editor.routes)
    app.add_routes(routes_sweeps.routes)
    app.add_routes(routes_studies.routes)
    app.add_routes(routes_plugins.routes)
    app.add_routes(routes_workers.routes)
    app.add_routes(routes_flavors.routes)
    app.add_routes(routes_files.routes)
    app.add_routes(routes_artifacts.routes)
    app.add_routes(ws_worker.routes)
    app.router.add_post(LOGIN_LINKS_PATH, _login_link)
    if (STATIC / "index.html").exists():
        app.router.add_get("/", _index)
        app.router.add_static("/static/", STATIC)
    return app


class WebService:
    """The HTTP server as a supervised child: ``stop`` closes the site and waits for
    open streams to end with the server's shutdown timeout."""

    def __init__(self, svc: Services) -> None:
        self.name = "web"
        self._svc = svc
        self._runner: web.AppRunner | None = None
        self._accept_guard: AcceptGuard | None = None
        self._exited: asyncio.Future[Exit] = asyncio.get_running_loop().create_future()
        self.port: int | None = None

    @property
    def is_alive(self) -> bool:
        return self._runner is not None and not self._exited.done()

    async def start(self) -> int:
        app = build_app(self._svc)
        server_log = logging.getLogger("aiohttp.server")
        if not any(isinstance(f, MalformedRequests) for f in server_log.filters):
            server_log.addFilter(MalformedRequests())
        # Short shutdown timeout: SSE handlers end when the hub resets them.
        # keepalive_timeout runs from the connection's start: one that sends no complete
        # request header within it is closed (web/limits.py).
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=2.0, access_log=None,
                                     keepalive_timeout=HEADER_TIMEOUT_S)
        self._accept_guard = AcceptGuard(asyncio.get_running_loop())
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._svc.settings.host, self._svc.settings.port, reuse_address=True)
        await site.start()
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else self._svc.settings.port
        self._svc.login.port = self.port
        settings = self._svc.settings
        host = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
        host = f"[{host}]" if ":" in host else host
        self._svc.public_url = settings.public_url or f"http://{host}:{self.port}"
        return self.port

    async def stop(self, *args: Any) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._accept_guard is not None:
            self._accept_guard.close()
        if not self._exited.done():
            self._exited.set_result(Exit(self.name, "normal"))

    async def wait(self) -> Exit:
        return await asyncio.shield(self._exited)
