"""Logging in: the page (``/?token=``), login links, terminal logins and the sessions
they opened ("who is connected"). See ``troupe/web/login.py`` for the kinds of session."""

from __future__ import annotations

import secrets
from html import escape as html_escape
from pathlib import Path
from typing import Annotated

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from troupe.actors.store.logins import ListLoginLinks, ListSessions
from troupe.protocol.api import PrintableName
from troupe.protocol.errors import InvalidRequest, NotFound, StateConflict, Unauthorized
from troupe.protocol.numbers import INTEGRAL
from troupe.web.context import Services, services
from troupe.web.errors import LOGIN_LINKS_PATH, json_reply
from troupe.web.login import CLASS, LOGOUT_PATH, OWN_NAME_PATH, READ, REQUEST_HEADER, TEACHER
from troupe.web.names import NAME_MAX, check_name
from troupe.web.quotas import quotas_from
from troupe.web.requests import read_model

routes = web.RouteTableDef()
KEPT_LINK = "link-unspent"  # the page's query after a link opened in a browser that has a session
STATIC = Path(__file__).parent / "static"
# The page shows other people's text (a class's run names, logs, labels); it writes it all
# as text, and the policy holds if a later change does not: scripts from this server only,
# never inline, no plugins, no framing (a click on a teacher's page is the teacher's own).
# Inline style attributes stay: the page sets widths and colours with them.
PAGE_HEADERS = {
    "Cache-Control": "no-store", "Referrer-Policy": "no-referrer", "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                               "img-src 'self' data: blob:; object-src 'none'; base-uri 'none'; "
                               "form-action 'self'; frame-ancestors 'none'",
}


class NewLoginLink(BaseModel):
    """Body of ``POST /api/login-links``: no ``uses``: a teacher's one-time link; with
    ``uses``, a class link; ``read_only``: a link for a projector or a guest, which takes
    no limits (``limits_on_read_only``: its sessions submit nothing), as the document says."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, json_schema_extra={
        "if": {"required": ["read_only"], "properties": {"read_only": {"const": True}}},
        "then": {"properties": {name: {"type": "null"} for name in (
            "max_running", "max_waiting", "max_memory_gib", "max_submits_per_minute")}}})

    uses: Annotated[int, Field(ge=1, le=10_000), INTEGRAL] | None = None
    expires_s: float = Field(default=12 * 3600, gt=0, le=365 * 86400)
    read_only: StrictBool = False
    # Limits of the sessions the link opens (troupe/web/quotas.py); a class link without any
    # gets the server's defaults (TROUPE_CLASS_MAX_*), and without a rate the server's
    # (TROUPE_CLASS_MAX_SUBMITS_PER_MINUTE, 30); a rate of 0 is none.
    max_running: Annotated[int, Field(ge=1, le=10_000), INTEGRAL] | None = None
    max_waiting: Annotated[int, Field(ge=0, le=100_000), INTEGRAL] | None = None
    max_memory_gib: float | None = Field(default=None, gt=0, le=65_536)
    max_submits_per_minute: Annotated[int, Field(ge=0, le=100_000), INTEGRAL] | None = None


class Login(BaseModel):
    """Body of ``POST /api/login``: a terminal trades a login link's token for a session;
    ``browser``: the page does, and gets the session as its cookie, never in the body."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    token: str = Field(min_length=1, max_length=200)
    browser: StrictBool = False
    # ``troupe login --name``: the name the session goes by from its start (``troupe/web/names.py``).
    name: PrintableName | None = Field(default=None, min_length=1, max_length=200)


async def index(request: web.Request) -> web.StreamResponse:
    """The page. Opened with ``?token=`` (a login link), it spends no use of the link: the
    page's script does, by ``POST /api/login``, and drops the token from the address bar
    (whatever only fetches the address, such as a chat app's preview, logs nobody in).
    Without a session the page says how to log in. A browser that has a session already
    is sent on to the page without the token, the link unspent: the address bar (on a
    projector, in a screenshot) never keeps a link that still opens a session."""
    login = services(request).login
    kind = login.logged_in(request)
    who = login.who(request) if kind else None
    token = request.query.get("token")
    if kind and token is not None:
        return web.Response(status=303, headers={**PAGE_HEADERS, "Location": f"/?{KEPT_LINK}"})
    state = "in" if kind else ("link" if token else "used" if "used" in request.query else "out")
    html = (STATIC / "index.html").read_text().replace(
        '<meta name="troupe-login" content="">', f'<meta name="troupe-login" content="{html_escape(state)}">'
        f'<meta name="troupe-session" content="{html_escape(kind or "")}">'
        f'<meta name="troupe-name" content="{html_escape(who.label if who else "")}">'
        # Its id, as runs, sweeps and studies record their submitter: the page offers a
        # class session changes only to its own (troupe/web/change_rights.py).
        f'<meta name="troupe-me" content="{html_escape((who.session_id if who else None) or "")}">')
    return web.Response(text=html, content_type="text/html", headers=PAGE_HEADERS)


@routes.post(LOGIN_LINKS_PATH)
async def new_login_link(request: web.Request) -> web.Response:
    """A fresh login link (a teacher's session only: the guard refuses the others)."""
    svc = services(request)
    body = await read_model(request, NewLoginLink) if request.can_read_body else NewLoginLink()
    kind = READ if body.read_only else (CLASS if body.uses is not None else TEACHER)
    base = svc.public_url or f"{request.scheme}://{request.host}"
    quotas = quotas_from(body.max_running, body.max_waiting, body.max_memory_gib)
    if kind == READ and (quotas or body.max_submits_per_minute is not None):
        raise InvalidRequest("a read-only link opens sessions that submit nothing: give it no limits",
                             pointer="/read_only", code="limits_on_read_only")
    if kind == CLASS and not quotas:
        quotas = dict(svc.settings.class_quotas)
    rate = body.max_submits_per_minute
    if kind == CLASS and rate is None:
        rate = svc.settings.class_max_submits_per_minute
    quotas = {**quotas, **quotas_from(None, None, None, rate)}
    link = await svc.login.new_link(base, kind, body.uses or 1, body.expires_s, quotas)
    return json_reply({"login_url": link, "kind": kind, "uses": body.uses or 1, "expires_s": body.expires_s,
                       "quotas": quotas}, status=201)


@routes.post("/api/login")
async def login_terminal(request: web.Request) -> web.Response:
    """``troupe login``: a link's token (one of its uses) for a session secret, which the
    terminal sends as its bearer token from then on. The page logs in the same way with
    ``browser``, and gets a cookie (only with the page's request header, which a form of
    another site cannot send: no site logs a browser in to a session of its choosing)."""
    svc = services(request)
    body = await read_model(request, Login)
    if body.browser and not request.headers.get(REQUEST_HEADER):
        raise Unauthorized(f"a browser logs in from this server's page (it sends {REQUEST_HEADER})")
    # A browser goes by a name in "who is connected": its own once it gives one (PUT
    # /api/sessions/me), a guest's until then; a terminal by where it is.
    label = f"guest {secrets.token_hex(2)}" if body.browser else _label("terminal", request)
    if body.name is not None:  # checked before the link is spent; the teacher's words are refused on any link
        label = check_name(body.name, False, svc.login.labels())
    made = await svc.login.redeem(body.token, label, named=body.name is not None)
    if made is None:
        raise Unauthorized("this login link is unknown, used up, expired or revoked; ask for a new one",
                           code="link_not_valid")
    secret, row = made
    if body.browser:
        response = json_reply({"kind": row["kind"], "id": row["id"]}, status=201)
        svc.login.set_cookie(response, secret, float(row["expires_at"]), secure=request.secure)
        return response
    return json_reply({"session": secret, "kind": row["kind"], "id": row["id"], "expires_at": row["expires_at"]},
                      status=201)


@routes.post(LOGOUT_PATH)
async def logout(request: web.Request) -> web.Response:
    """Ends the session the request comes with, on the server: its secret opens nothing
    from now on (the server's own token is not a session and ends with the server)."""
    svc = services(request)
    who = svc.login.who(request)
    if who is None or who.session_id is None:
        raise StateConflict("the server's own token is not a session: it ends when the server stops",
                            code="not_a_session")
    await svc.login.revoke(who.session_id)
    response = json_reply({"id": who.session_id, "revoked": True})
    if who.by_cookie:
        svc.login.clear_cookie(response)
    return response


@routes.get(LOGIN_LINKS_PATH)
async def list_login_links(request: web.Request) -> web.Response:
    """Every login link: its kind, uses left, when it expires, whether it was revoked and
    how many sessions it opened (never its token) (teacher)."""
    svc = services(request)
    _teacher_only(svc, request, "the login links are the teacher's to see")
    return json_reply({"links": await svc.store.read(ListLoginLinks())})


@routes.delete(LOGIN_LINKS_PATH + "/{link_id}")
async def revoke_login_link(request: web.Request) -> web.Response:
    """No one logs in with the link any more, and the sessions it opened end."""
    svc = services(request)
    link_id = request.match_info["link_id"][:64]
    ended = await svc.login.revoke_link(link_id)
    if ended is None:
        raise NotFound(f"no login link {link_id!r}", code="link_not_found")
    return json_reply({"id": link_id, "revoked": True, "sessions_ended": ended})


def _teacher_only(svc: Services, request: web.Request, message: str) -> None:
    who = svc.login.who(request)
    if who is None or who.kind != TEACHER:
        raise Unauthorized(message, code="teacher_only")


_BROWSERS = (("Edg/", "Edge"), ("OPR/", "Opera"), ("Firefox/", "Firefox"), ("Chrome/", "Chrome"),
             ("Safari/", "Safari"))
_SYSTEMS = (("Android", "Android"), ("iPhone", "iPhone"), ("iPad", "iPad"), ("Windows", "Windows"),
            ("Mac OS X", "macOS"), ("CrOS", "ChromeOS"), ("Linux", "Linux"))


def _label(what: str, request: web.Request) -> str:
    """How "who is connected" names a session: what, from where, in which browser
    ("browser 10.0.0.7 · Firefox on Windows"). A header is any bytes (aiohttp keeps
    those that are not UTF-8 as lone surrogates): the label keeps printable text only."""
    sent = request.headers.get("User-Agent", "")[:400].encode("utf-8", "replace").decode()
    agent = "".join(c if c.isprintable() else "?" for c in sent)
    browser = next((name for mark, name in _BROWSERS if mark in agent), "")
    system = next((name for mark, name in _SYSTEMS if mark in agent), "")
    kind = f"{browser} on {system}" if browser and system else browser or system or agent[:40]
    return " · ".join(part for part in (f"{what} {request.remote or ''}".strip(), kind) if part)[:200]


class SessionName(BaseModel):
    """Body of ``PUT /api/sessions/me``: the name this session goes by."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: PrintableName = Field(min_length=1, max_length=200, description=f"at most {NAME_MAX} characters once "
                                "trimmed; see troupe/web/names.py for the rest of the rules")


@routes.put(OWN_NAME_PATH)
async def name_session(request: web.Request) -> web.Response:
    """A session names itself (a student, as the teacher will see it). The server's own
    token is no session and has no name to set."""
    svc = services(request)
    who = svc.login.who(request)
    body = await read_model(request, SessionName)
    if who is None or who.session_id is None:
        raise StateConflict("only a session opened with a login link has a name; the server's token has none",
                            code="no_session")
    name = check_name(body.name, who.kind == TEACHER, svc.login.labels(but=who.session_id))
    await svc.login.name(who.session_id, name)
    return json_reply({"id": who.session_id, "label": name})


@routes.get("/api/sessions")
async def list_sessions(request: web.Request) -> web.Response:
    """Who is connected: every session, its kind and when it was last seen (teacher)."""
    svc = services(request)
    _teacher_only(svc, request, "the sessions are the teacher's to see")
    rows = await svc.store.read(ListSessions())
    return json_reply({"sessions": [{k: r[k] for k in ("id", "kind", "label", "created_at", "last_seen_at",
                                                         "revoked", "expires_at", "link_id", "quotas")} for r in rows]})


# Any id but ``me``: that path is a session's own name (PUT), and an OPTIONS or a 405 there
# must not offer DELETE, which would only ever answer 404 for it.
@routes.delete("/api/sessions/{session_id:(?!me$)[^/]+}")
async def revoke_session(request: web.Request) -> web.Response:
    svc = services(request)
    session_id = request.match_info["session_id"]
    if not await svc.login.revoke(session_id[:64]):
        raise NotFound(f"no session {session_id[:64]!r}", code="session_not_found")
    return json_reply({"id": session_id, "revoked": True})


