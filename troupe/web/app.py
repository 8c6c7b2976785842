"""Builds the aiohttp application and runs it as a child service of the root."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from troupe.actors.base import Exit
from troupe.actors.events import CloseStreams
from troupe.protocol.errors import NotFound
from troupe.protocol.tls import server_context
from troupe.web import (
    routes_artifacts,
    routes_editor,
    routes_export,
    routes_files,
    routes_find,
    routes_flavors,
    routes_login,
    routes_meta,
    routes_metrics,
    routes_packs,
    routes_plugins,
    routes_rerun,
    routes_runs,
    routes_studies,
    routes_sweeps,
    routes_tables,
    routes_workers,
    streams,
    ws_worker,
)
from troupe.web.context import SERVICES, Services
from troupe.web.errors import guard
from troupe.web.limits import HEADER_TIMEOUT_S, AcceptGuard, MalformedRequests

STATIC = Path(__file__).parent / "static"
# Connections waiting for accept(); the kernel caps it at net.core.somaxconn (4096 on
# current kernels).
LISTEN_BACKLOG = 1024
_STATIC_ROOT = STATIC.resolve()
# Every route table, in the order they are added (the OpenAPI test reads them too).
# aiohttp tries the routes under a path's fixed prefix in the order they were added: a
# run's stream, which every script follows, comes before the ten other routes under
# /api/runs/{run_id} (1.9 us against 10.8 us to resolve). No two patterns match one path.
ROUTE_TABLES = (streams.routes, routes_find.routes, routes_runs.routes, routes_rerun.routes, routes_meta.routes,
                routes_export.routes, routes_editor.routes, routes_sweeps.routes, routes_studies.routes,
                routes_plugins.routes, routes_workers.routes, routes_flavors.routes, routes_packs.routes,
                routes_metrics.routes, routes_files.routes, routes_artifacts.routes, ws_worker.routes,
                routes_login.routes, routes_tables.routes)


def build_app(svc: Services) -> web.Application:
    app = web.Application(middlewares=[guard], client_max_size=svc.settings.max_request_bytes)
    app[SERVICES] = svc
    app.on_shutdown.append(_close_streams)
    for table in ROUTE_TABLES:
        app.add_routes(table)
    if (STATIC / "index.html").exists():
        app.router.add_get("/", routes_login.index)
        app.router.add_get("/static/{name:.+}", _static)
    return app


async def _close_streams(app: web.Application) -> None:
    """Before the server waits on its handlers: every stream ends now, which otherwise
    held the stop for the shutdown timeout twice over (aiohttp waits for a handler, then
    for its cancel)."""
    hub = app[SERVICES].registry.lookup("events")
    if hub is not None:
        with contextlib.suppress(Exception):  # a hub already gone has no streams to end
            await asyncio.wait_for(hub.ask(CloseStreams()), 1.0)


async def _static(request: web.Request) -> web.StreamResponse:
    """A file of the page. Anything else (a name no file system takes, a path out of the
    folder) is the same JSON 404 as any unknown route, never a 500 or an empty body."""
    name = request.match_info["name"]
    try:
        found = (STATIC / name).resolve()
        served = found.is_relative_to(_STATIC_ROOT) and found.is_file()
    except (OSError, ValueError):  # too long a name, a NUL, a loop of links
        served = False
    if not served:
        raise NotFound(f"the page has no file {name[:80]!r}")
    return web.FileResponse(found)


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
        # Where an ``ssh -R`` forward reaches this server: its port, or with TLS on a
        # plain-HTTP Unix socket of its own (the SSH session already encrypts, and an
        # agent behind a forward speaks plain HTTP).
        self.forward_target: str | None = None
        self._socket_dir: Path | None = None

    @property
    def is_alive(self) -> bool:
        return self._runner is not None and not self._exited.done()

    async def start(self) -> int:
        app = build_app(self._svc)
        server_log = logging.getLogger("aiohttp.server")
        if not any(isinstance(f, MalformedRequests) for f in server_log.filters):
            server_log.addFilter(MalformedRequests())
        # Short shutdown timeout: SSE handlers end at its start (_close_streams).
        # keepalive_timeout runs from the connection's start: one that sends no complete
        # request header within it is closed (troupe/web/limits.py).
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=2.0, access_log=None,
                                     keepalive_timeout=HEADER_TIMEOUT_S)
        self._accept_guard = AcceptGuard(asyncio.get_running_loop())
        await self._runner.setup()
        settings = self._svc.settings
        tls = server_context(str(settings.tls_cert), str(settings.tls_key)) if settings.tls_cert else None
        # The workers of a restarted server all dial within a quarter second: past the
        # listen queue (aiohttp's default holds 128), a dial's SYN is dropped and the kernel
        # sends it again a second later.
        site = web.TCPSite(self._runner, settings.host, settings.port, reuse_address=True, ssl_context=tls,
                           backlog=LISTEN_BACKLOG)
        await site.start()
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else self._svc.settings.port
        self._svc.login.port = self.port
        self.forward_target = f"127.0.0.1:{self.port}"
        if tls is not None:
            self._socket_dir = Path(tempfile.mkdtemp(prefix="troupe-plane-"))  # mode 0700
            path = str(self._socket_dir / "http.sock")
            await web.UnixSite(self._runner, path).start()
            self.forward_target = path
        host = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
        host = self._svc.lan_hosts[0] if self._svc.lan_hosts else host  # the address a class reaches it by
        host = f"[{host}]" if ":" in host else host
        self._svc.public_url = settings.public_url or f"{settings.scheme}://{host}:{self.port}"
        return self.port

    async def stop(self, *args: Any) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
        if self._accept_guard is not None:
            self._accept_guard.close()
        if not self._exited.done():
            self._exited.set_result(Exit(self.name, "normal"))

    async def wait(self) -> Exit:
        return await asyncio.shield(self._exited)

    def on_exit(self, callback: Callable[[Exit], None]) -> None:
        """``callback(exit)`` once the web service has stopped."""
        self._exited.add_done_callback(lambda exited: callback(exited.result()))
