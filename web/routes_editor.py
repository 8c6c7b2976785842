"""``/api/editor-sessions/{session}``: the node cache of one editor session.

An editor keeps its session's cached node outputs between two clicks of Run; closing
the editor (``DELETE``) gives their memory back at once instead of waiting for the
budget to push them out. Any session name is accepted: one that never ran simply holds
nothing.
"""

from __future__ import annotations

from aiohttp import web

from protocol.errors import InvalidRequest
from web.context import services
from web.errors import json_reply

routes = web.RouteTableDef()

# As long as ``options.editor_session`` may be.
_MAX_SESSION = 128


def _session(request: web.Request) -> str:
    session = request.match_info["session"]
    if not 1 <= len(session) <= _MAX_SESSION:
        raise InvalidRequest(f"an editor session is 1 to {_MAX_SESSION} characters", pointer="")
    return session


@routes.get("/api/editor-sessions/{session}")
async def session_cache(request: web.Request) -> web.Response:
    svc = services(request)
    session = _session(request)
    stats = svc.node_cache.session_stats(session)
    return json_reply({"editor_session": session, "entries": stats["entries"], "bytes": stats["bytes"],
                              "budget_bytes": svc.node_cache.budget_bytes})


@routes.delete("/api/editor-sessions/{session}")
async def close_session(request: web.Request) -> web.Response:
    session = _session(request)
    dropped = services(request).node_cache.close(session)
    return json_reply({"editor_session": session, "dropped_entries": dropped})
