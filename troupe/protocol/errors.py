"""The error classes every troupe package raises at its boundary, with stable codes.

An error carries what the HTTP layer needs to answer for it: a snake_case ``code`` that
clients can branch on, the HTTP status, and where it applies, an RFC 6901 ``pointer``
into the request body and the ``node_id`` at fault. Other packages subclass these in
their own ``errors.py``.
"""

from __future__ import annotations

from typing import Any


class TroupeError(Exception):
    """Base of every error troupe reports to a user; never raised itself."""

    code = "troupe_error"
    http_status = 400
    retry_after_s: int | None = None  # when the same request may pass: the reply's Retry-After header

    def __init__(
        self,
        message: str,
        *,
        pointer: str | None = None,
        node_id: str | None = None,
        code: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.pointer = pointer
        self.node_id = node_id
        self.details = details  # the numbers behind a refusal, for a client to show
        if code is not None:
            self.code = code

    def to_json(self) -> dict[str, Any]:
        """The ``{"error": {...}}`` body of DESIGN section 4."""
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.pointer is not None:
            body["pointer"] = self.pointer
        if self.node_id is not None:
            body["node_id"] = self.node_id
        if self.details is not None:
            body["details"] = self.details
        return {"error": body}


class InvalidRequest(TroupeError):
    """Raised when a request body or query does not have the shape its route expects."""

    code = "invalid_request"
    http_status = 400


class Unauthorized(TroupeError):
    """Raised when a mutation comes without the session token, or with a wrong one."""

    code = "unauthorized"
    http_status = 401


class Forbidden(TroupeError):
    """Raised when a session may not do this: a class session managing workers, a
    read-only one changing anything."""

    code = "not_allowed"
    http_status = 403


class NotYours(Forbidden):
    """Raised when a class session would change what another session submitted (cancel,
    delete, rename, retag or note a run; cancel a sweep; cancel or resume a study; delete
    an uploaded file): that is its submitter's and the teacher's to change. The code names
    what it was: ``not_your_run``, ``not_your_sweep``, ``not_your_study``,
    ``not_your_file``."""

    code = "not_your_run"


class KeepIsTheTeachers(Forbidden):
    """Raised when a class session would tag a run ``keep`` (its own too): retention never
    removes such a run, so the tag is the teacher's to give, or one session's kept runs
    would grow without bound past the retention every other session is held to."""

    code = "keep_is_the_teachers"


class HostNotAllowed(TroupeError):
    """Raised when the request's Host is not one this server answers to."""

    code = "host_not_allowed"
    http_status = 403


class NotFound(TroupeError):
    """Raised for an unknown or malformed resource id."""

    code = "not_found"
    http_status = 404


class StateConflict(TroupeError):
    """Raised when the resource exists but its state forbids the action."""

    code = "state_conflict"
    http_status = 409


class PayloadTooLarge(TroupeError):
    """Raised when a request body is over the server's limit."""

    code = "payload_too_large"
    http_status = 413


class RequestTimeout(TroupeError):
    """Raised when a request's body did not arrive within the read deadline; the
    connection is closed after the answer, so a slow sender holds nothing."""

    code = "request_timeout"
    http_status = 408


class DiskFull(TroupeError):
    """Raised when the disk under the database or the files is full: what could not be
    written is refused, nothing else. 507 Insufficient Storage."""

    code = "disk_full"
    http_status = 507


class DatabaseDamaged(TroupeError):
    """Raised when what a request reads or writes sits on a damaged page of the database:
    that request fails, the rest of the database still serves. 503."""

    code = "database_damaged"
    http_status = 503


class CapacityRefused(TroupeError):
    """Raised when the server refuses work it has no room for right now, instead of
    letting it wait silently (interactive lane limits, the seed gate)."""

    code = "capacity_refused"
    http_status = 503


class QuotaExceeded(TroupeError):
    """Raised when a session's submission would pass a limit its class link set (runs
    running or waiting at once, memory budget held, runs submitted a minute); ``details``
    has the counts, and ``retry_after_s`` when waiting is enough for it to pass."""

    code = "quota_exceeded"
    http_status = 429

    def __init__(self, message: str, *, retry_after_s: int | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_after_s = retry_after_s


def pointer_from_path(path: tuple[Any, ...] | list[Any]) -> str:
    """Turns a location such as ``("graph", "nodes", 2, "type")`` into an RFC 6901
    pointer, escaping ``~`` and ``/`` as the RFC requires."""
    parts = [str(p).replace("~", "~0").replace("/", "~1") for p in path]
    return "/" + "/".join(parts) if parts else ""


class WhereInvalid(InvalidRequest):
    """Raised for a ``where`` filter that does not read as the grammar says
    (``troupe/protocol/where.py``): ``offset`` is where in the text it went wrong (0-based,
    in characters), ``expected`` what could have stood there."""

    code = "where_invalid"

    def __init__(self, message: str, *, offset: int, expected: tuple[str, ...] = (), **kwargs: Any) -> None:
        kwargs.setdefault("pointer", "?where")
        super().__init__(message, **kwargs)
        self.offset = offset
        self.expected = expected

    def to_json(self) -> dict[str, Any]:
        body = super().to_json()
        body["error"]["offset"] = self.offset
        if self.expected:
            body["error"]["expected"] = list(self.expected)
        return body


class WhereUnknownKey(WhereInvalid):
    """Raised for a ``where`` (or ``group_by``) key that names nothing: not a fixed key,
    and no stored run has such a param or series. ``key`` is the key as written."""

    code = "where_unknown_key"

    def __init__(self, message: str, *, offset: int, key: str, **kwargs: Any) -> None:
        super().__init__(message, offset=offset, **kwargs)
        self.key = key

    def to_json(self) -> dict[str, Any]:
        body = super().to_json()
        body["error"]["key"] = self.key
        return body
