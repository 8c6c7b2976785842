"""What a call to a server can end in, besides its answer. ``ApiError`` is any answer the
server refused, with the error object the API sends (``code``, ``message``, ``pointer``);
its subclasses name the cases a notebook handles apart. ``Unreachable`` and ``Timeout``
are not answers at all: nothing answered, or the caller's own time ran out while the run
goes on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class TroupeError(Exception):
    """Anything the client raises of its own."""


class Unreachable(TroupeError, ConnectionError):
    """No troupe server answers at the address (refused, reset, a name that does not
    resolve, a certificate this client does not trust)."""

    def __init__(self, url: str, why: str, untrusted: bool = False) -> None:
        super().__init__(f"{url}: {why}" if untrusted else f"no troupe server answers at {url} ({why})")
        self.url = url
        self.untrusted = untrusted  # a server answered, with a certificate not trusted here


class Timeout(TroupeError, TimeoutError):
    """A ``wait`` ran past its ``timeout``. The run (sweep, study) goes on: this says
    nothing about how it ends, so it is never a failure of the run."""

    def __init__(self, what: str, timeout: float, status: str | None = None) -> None:
        now = f"; it is {status}" if status else ""
        super().__init__(f"{what} did not end within {timeout:g} s{now}")
        self.timeout = timeout
        self.status = status


class ApiError(TroupeError):
    """The server answered with an error. ``code`` is the API's stable word for it
    (``graph_invalid``, ``run_not_found``...), ``pointer`` a JSON pointer into the request
    body where the fault is, ``details`` the whole error object as sent."""

    def __init__(self, status: int, code: str, message: str, pointer: str | None = None,
                 details: Mapping[str, Any] | None = None) -> None:
        where = f" at {pointer}" if pointer else ""
        super().__init__(f"{status} {code}: {message}{where}")
        self.status = status
        self.code = code
        self.message = message
        self.pointer = pointer
        self.details: dict[str, Any] = dict(details or {})

    @property
    def node_id(self) -> str | None:
        """The node at fault, where one is."""
        found = self.details.get("node_id")
        return found if isinstance(found, str) else None


class Refused(ApiError):
    """A 4xx: the request itself was refused (invalid, not allowed, in conflict)."""


class NotFound(Refused):
    """A 404: no run, sweep, study or file of that id (or it was removed)."""


class QuotaExceeded(Refused):
    """A 429: the session submitted more than its link allows for now. ``retry_after``:
    seconds until the server takes another (its ``Retry-After``), where it said."""

    def __init__(self, status: int, code: str, message: str, pointer: str | None = None,
                 details: Mapping[str, Any] | None = None, retry_after: float | None = None) -> None:
        super().__init__(status, code, message, pointer, details)
        self.retry_after = retry_after


class Unavailable(ApiError):
    """A 503: the server refused for now (capacity, a stopping server, a quarantined
    queue). A call is tried again, with back-off, when the server says when
    (``Retry-After``); this is raised when it did not, or the tries ran out."""

    def __init__(self, status: int, code: str, message: str, pointer: str | None = None,
                 details: Mapping[str, Any] | None = None, retry_after: float | None = None) -> None:
        super().__init__(status, code, message, pointer, details)
        self.retry_after = retry_after


def retry_after_s(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header given in seconds (the form troupe sends);
    None for none or a form this client does not read (an HTTP date)."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds < 86400 else None


def error_from(status: int, body: Any, retry_after: str | None = None) -> ApiError:
    """The error an answer of ``status`` stands for; ``body`` as decoded (the API's error
    object, or text from something in front of the server)."""
    error = body.get("error") if isinstance(body, Mapping) else None
    if isinstance(error, Mapping):
        code, message = str(error.get("code") or "error"), str(error.get("message") or "")
        pointer = error.get("pointer") if isinstance(error.get("pointer"), str) else None
        details: Mapping[str, Any] = error
    else:
        code, message, pointer, details = f"http_{status}", str(body or "")[:500], None, {}
    wait = retry_after_s(retry_after)
    if status == 404:
        return NotFound(status, code, message, pointer, details)
    if status == 429:
        return QuotaExceeded(status, code, message, pointer, details, wait)
    if status == 503:
        return Unavailable(status, code, message, pointer, details, wait)
    if 400 <= status < 500:
        return Refused(status, code, message, pointer, details)
    return ApiError(status, code, message, pointer, details)
