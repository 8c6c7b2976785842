"""``/api/editor-sessions/{session}``: the node cache of one editor session.

An editor keeps its session's cached node outputs between two clicks of Run; closing
the editor (``DELETE``) gives their memory back at once instead of waiting for the
budget to push them out. Any session name is accepted: one that never ran simply holds
nothing. A name is the asker's own: each submitter's editor sessions are apart, so one
that names another's (every run's options show it) reads and drops nothing of it.
"""

from __future__ import annotations

from aiohttp import web

from troupe.actors.submission import editor_key
from troupe.protocol.errors import InvalidRequest
from troupe.web.context import services
from troupe.web.errors import json_reply
from troupe.web.login import submitter_of

routes = web.RouteTableDef()

# As long as ``options.editor_session`` may be.
_MAX_SESSION = 128


def _session(request: web.Request) -> str:
    session = request.match_info["session"]
    if not 1 <= len(session) <= _MAX_SESSION:
        raise InvalidRequest(f"an editor session is 1 to {_MAX_SESSION} characters", pointer="")
    return session


def _key(request: web.Request, session: str) -> str:
    """The asker's own editor session of that name: another's is not theirs to read or drop."""
    who = services(request).login.who(request)
    return editor_key(submitter_of(who) if who is not None else None, session) or session


@routes.get("/api/editor-sessions/{session}")
async def session_cache(request: web.Request) -> web.Response:
    svc = services(request)
    session = _session(request)
    stats = svc.node_cache.session_stats(_key(request, session))
    return json_reply({"editor_session": session, "entries": stats["entries"], "bytes": stats["bytes"],
                              "budget_bytes": svc.node_cache.budget_bytes})


@routes.delete("/api/editor-sessions/{session}")
async def close_session(request: web.Request) -> web.Response:
    session = _session(request)
    dropped = services(request).node_cache.close(_key(request, session))
    return json_reply({"editor_session": session, "dropped_entries": dropped})
