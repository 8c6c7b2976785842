"""Maps every error to the JSON error shape, and guards Host and auth.

Nothing a client sends can reach a 500 by its shape alone: shape problems are
``TroupeError``s (4xx) raised before any work starts. A 500 here means a bug, and it is
logged with its traceback.
"""

from __future__ import annotations

import errno
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from troupe.protocol import jsonsafe
from troupe.protocol.errors import (
    DiskFull,
    Forbidden,
    HostNotAllowed,
    InvalidRequest,
    PayloadTooLarge,
    TroupeError,
    Unauthorized,
)
from troupe.web.context import services
from troupe.web.limits import refuse_announced
from troupe.web.login import REQUEST_HEADER
from troupe.web.requests import refuse_unencodable

log = logging.getLogger("troupe.web")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
_SELF_AUTHENTICATED = frozenset({"/api/workers/credentials", "/api/login"})  # proved by their body
_WORKER_ARTIFACT = re.compile(r"/api/runs/[0-9a-f]{32}/artifacts")
LOGIN_LINKS_PATH = "/api/login-links"  # a teacher's session only


def _self_authenticated(request: web.Request) -> bool:
    """The credential exchange proves itself with the enrollment token, and a worker's
    artifact transfer with the worker's credential (their handlers check)."""
    return request.path in _SELF_AUTHENTICATED or (
        request.method == "PUT" and _WORKER_ARTIFACT.fullmatch(request.path) is not None)


def json_reply(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """Every JSON reply: no ``NaN``/``Infinity`` tokens, which a browser cannot parse."""
    return web.json_response(data, status=status, headers=headers, dumps=jsonsafe.dumps)


def error_response(error: TroupeError) -> web.Response:
    retry = {"Retry-After": str(error.retry_after_s)} if error.retry_after_s is not None else None
    return json_reply(error.to_json(), status=error.http_status, headers=retry)


def _host_name(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Host check (DNS-rebinding guard), then the token for every mutation, then the
    handler with its errors turned into replies."""
    svc = services(request)
    try:
        response = await _guarded(request, handler, svc)
    except (TroupeError, OSError) as exc:
        response = _error_reply(exc, svc)
    if response.status >= 400 and request.body_exists and not request.content.is_eof():
        response.force_close()  # a body left unread is never drained: the connection goes
    return response


async def _guarded(request: web.Request, handler: Handler, svc: Any) -> web.StreamResponse:
    try:
        allowed = _LOOPBACK | {svc.settings.host.lower()} | set(svc.settings.allowed_hosts) | set(svc.lan_hosts)
        if _host_name(request.host) not in allowed:
            raise HostNotAllowed(
                f"Host {request.host!r} is not allowed; add it to TROUPE_ALLOWED_HOSTS "
                "to reach this server by that name"
            )
        refuse_announced(request, svc.settings)  # before a byte of it is read
        _refuse_unencodable_query(request)
        await _authorize(request, svc)
        return await handler(request)
    except HttpProcessingError as exc:  # a body aiohttp could not parse (a broken multipart form)
        raise InvalidRequest(f"the request body is malformed: {' '.join(str(exc.message).split())[:200]}",
                             pointer="") from None
    except RequestPayloadError as exc:  # a body that does not decode under its Content-Encoding
        raise InvalidRequest(f"the request body could not be read: {' '.join(str(exc).split())[:200]}",
                             pointer="") from None
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge(
            f"the request body is over {svc.settings.max_request_bytes} bytes (TROUPE_MAX_REQUEST_BYTES)") from None
    except web.HTTPException as exc:
        if exc.status >= 400 and exc.content_type != "application/json":
            code = "not_found" if exc.status == 404 else "method_not_allowed" if exc.status == 405 else "http_error"
            return json_reply({"error": {"code": code, "message": exc.reason}}, status=exc.status, headers=_allow(exc))
        raise


def _refuse_unencodable_query(request: web.Request) -> None:
    if request.path.isascii() and request.query_string.isascii():
        return
    refuse_unencodable(request.path, "", "the path")
    for name, value in request.query.items():
        refuse_unencodable(name, "?", "a query parameter's name")
        refuse_unencodable(value, f"?{name}", "a query parameter")


async def _authorize(request: web.Request, svc: Any) -> None:
    """A mutation needs a session that may make it; bound beyond loopback, a read needs a
    session too (or a worker's credential, for the files its runs fetch)."""
    who = svc.login.who(request)
    if request.method not in _SAFE_METHODS:
        if _self_authenticated(request):
            return
        if who is None or (who.by_cookie and not request.headers.get(REQUEST_HEADER)):
            raise Unauthorized(
                "this request changes state and needs 'Authorization: Bearer <token>' (the token is in "
                "$TROUPE_HOME/session.json, or `troupe login` keeps one), or a browser logged in with the link "
                "`troupe start` printed (`troupe open` makes a new one)")
        if not who.may_change(request.path):
            raise Forbidden(f"a {who.kind} session may not do this ({request.method} {request.path}); "
                            + ("it only reads" if who.kind == "read" else "the teacher manages workers, flavors, "
                                                                          "plugins and login links"))
        return
    if who is not None or not svc.lan_hosts or _public(request.path):
        return
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and secret.strip():
        from troupe.web.ws_worker import credential_owner

        owner, _ = await credential_owner(svc, secret.strip()) if _WORKER_READS.match(request.path) else (None, "")
        if owner is not None:
            return  # a worker fetching an upload, a checkpoint or a pack for its run: nothing else
    raise Unauthorized("this server is reached over the network: reading it needs a session. Open the login link "
                       "you were given, or run `troupe login URL` in a terminal", code="login_required")


# What an agent reads with its worker credential: its socket (which checks the credential
# itself, in the hello), an upload, a checkpoint to resume from, a pack.
_WORKER_READS = re.compile(r"^/(ws/worker|api/(files/[^/]+/content|runs/[^/]+/artifacts/[^/]+|packs/[^/]+/archive))$")


def _public(path: str) -> bool:
    """What anyone may read: the page itself (it says how to log in) and what it needs
    to say so."""
    return path in ("/", "/api/info") or path.startswith("/static/")


def _error_reply(exc: Exception, svc: Any) -> web.Response:
    if isinstance(exc, TroupeError):
        return error_response(exc)
    assert isinstance(exc, OSError)
    if exc.errno == errno.EFBIG:  # past the largest file this server may write (its file system, a ulimit)
        return error_response(too_large_a_file(exc))
    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        raise exc
    return error_response(disk_full(exc))


def too_large_a_file(exc: OSError) -> PayloadTooLarge:
    return PayloadTooLarge(f"the file is larger than this server may write ({exc.strerror}: its file system or its "
                           "file size limit); nothing of it was kept")


def disk_full(exc: OSError) -> DiskFull:
    return DiskFull(f"the disk under this server's files is full ({exc.strerror}); nothing of this request was "
                    "kept. Free some space (delete finished runs, or files in TROUPE_HOME) and send it again")


def _allow(exc: web.HTTPException) -> dict[str, str]:
    allow = exc.headers.get("Allow")
    return {"Allow": allow} if allow else {}
