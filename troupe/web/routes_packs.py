"""``/api/packs``: the packs this control plane loaded, and the archive of each pack it
loaded from a folder, which agents started with ``--accept-packs`` fetch (their
credential reads it, as it reads a run's uploads) and check by digest."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from troupe.subprocess_runner.catalog import Catalog, pack_of
from troupe.subprocess_runner.errors import PackChanged, PackNotFound
from troupe.subprocess_runner.pack_files import archive, digest_of, sendable
from troupe.web.context import services
from troupe.web.errors import json_reply

routes = web.RouteTableDef()
DIGEST_HEADER = "X-Troupe-Pack-Digest"


def pack_list(catalog: Catalog) -> dict[str, Any]:
    """Each pack with its version, its node types and, for a folder pack, its digest and
    where it was found; then the packs that failed, with why."""
    sources = catalog.pack_sources
    packs = []
    for name in catalog.packs:
        folder = catalog.folder_packs.get(name)
        row: dict[str, Any] = {"name": name, "node_types": sorted(t for t in catalog.types if pack_of(t) == name)}
        if folder is not None:
            row.update(folder.to_json(), path=str(folder.path))
        else:
            row.update(version=sources.get(name, ("1", ()))[0], digest=None, source="installed")
        packs.append(row)
    broken = [{"name": name, "error": error} for name, error in sorted(catalog.broken_packs.items())]
    return {"packs": packs, "broken": broken}


@routes.get("/api/packs")
async def list_packs(request: web.Request) -> web.Response:
    return json_reply(pack_list(services(request).catalog))


@routes.get(r"/api/packs/{name:[^/]+}/archive")
async def pack_archive(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    folder = services(request).catalog.folder_packs.get(name)
    if folder is None:
        raise PackNotFound(f"this control plane offers no pack named {name!r} (only packs it loaded from a folder "
                           "are sent to workers; GET /api/packs lists them)")

    changed = PackChanged(f"pack {name}'s files changed after this server loaded them; restart it to offer the "
                          "new version")

    def read() -> bytes:
        try:
            sendable(folder.path)  # from sizes alone, before reading what would be refused
            if digest_of(folder.path) != folder.digest:
                raise changed
            return archive(folder.path)
        except OSError:  # a file removed or cut short while it was read
            raise changed from None

    data = await asyncio.to_thread(read)
    return web.Response(body=data, content_type="application/gzip", headers={DIGEST_HEADER: folder.digest})
