"""The one HTTP path to a troupe server, for ``troupe.Client`` and the CLI alike: httpx's
synchronous client (one connection pool per client, explicit timeouts, a Unix socket
for an agent behind ``ssh -R``), the API's error object turned into ``ApiError``, a
"not now" (503 with ``Retry-After``) tried again with back-off, and server-sent event
streams read line by line.

Synchronous on purpose: a notebook's kernel already runs an event loop, and nothing
here starts or needs one."""

from __future__ import annotations

import json
import ssl
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from troupe.client._errors import TroupeError, Unreachable, error_from, retry_after_s
from troupe.protocol.tls import client_context, untrusted

# A "not now" is tried this many times more, waiting what the server said (at most this).
RETRIES = 3
MAX_RETRY_WAIT_S = 10.0


@dataclass(frozen=True)
class Answer:
    """A reply as it came: its status, its decoded body (JSON, or text for CSV and plain
    text) and the headers a caller may want (``Retry-After``)."""

    status: int
    body: Any
    headers: Mapping[str, str]


@dataclass(frozen=True)
class ServerEvent:
    """One server-sent event: its ``event`` name, its JSON ``data`` and its ``id``."""

    event: str
    data: Any
    id: str | None


class BadAnswer(TroupeError):
    """A success whose body is not what a troupe server sends (another program at that
    address)."""


class Http:
    """Requests to one server. ``url``: its base (``http://127.0.0.1:8765``); ``token``:
    the session's bearer token (reads need none); ``unix_socket``: reach it through
    that socket instead (the URL's host still goes in the Host header); ``ca``: a
    certificate to trust besides the system's, for a server serving its own."""

    def __init__(self, url: str, token: str | None = None, *, unix_socket: str | None = None,
                 ca: str | None = None, timeout: float = 30.0,
                 object_hook: Callable[[dict[str, Any]], Any] | None = None) -> None:
        self.url = url.rstrip("/")
        self._object_hook = object_hook  # what a JSON object is decoded as (the CLI's names a missing field)
        self.token = token
        self.ca = ca
        self.unix_socket = unix_socket
        try:
            host = urllib.parse.urlsplit(self.url).hostname or "127.0.0.1"
        except ValueError as exc:
            raise ValueError(f"{url} is not a server's address ({exc})") from None
        verify: ssl.SSLContext | bool = client_context(host, ca) if self.url.startswith("https:") else True
        transport = httpx.HTTPTransport(uds=unix_socket, verify=verify)
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._client = httpx.Client(base_url=self.url, headers=headers, transport=transport,
                                    timeout=httpx.Timeout(timeout))

    def close(self) -> None:
        self._client.close()

    def send(self, method: str, path: str, body: Any = None, *, params: Mapping[str, Any] | None = None,
             timeout: float | None = None, retries: int = RETRIES) -> Answer:
        """The answer, whatever its status (a refusal is an answer too); a "not now" the
        server says when to try again is tried again up to ``retries`` times. ``body``:
        JSON to send (no NaN or Infinity: ``ValueError``), or bytes already encoded."""
        content = body if isinstance(body, bytes) or body is None else json.dumps(body, allow_nan=False).encode()
        headers = {"Content-Type": "application/json"} if content is not None else {}
        query = {key: _query_value(value) for key, value in (params or {}).items() if value is not None}
        for attempt in range(retries + 1):
            try:
                response = self._client.request(method, path, content=content, headers=headers, params=query or None,
                                                timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout)
            except httpx.InvalidURL as exc:
                raise ValueError(f"{self.url}{path} is not an address ({exc})") from None
            except httpx.TransportError as exc:
                raise self.unreachable(exc) from None
            wait = retry_after_s(response.headers.get("Retry-After"))
            if response.status_code != 503 or wait is None or attempt == retries:
                return Answer(response.status_code, _decoded(response, self._object_hook), response.headers)
            time.sleep(min(MAX_RETRY_WAIT_S, max(wait, 0.1 * 2**attempt)))
        raise AssertionError("unreachable")  # the loop returns on its last attempt

    def request(self, method: str, path: str, body: Any = None, *, params: Mapping[str, Any] | None = None,
                timeout: float | None = None) -> Any:
        """The decoded body of a success; ``ApiError`` (by status) for a refusal."""
        answer = self.send(method, path, body, params=params, timeout=timeout)
        if answer.status >= 400:
            raise error_from(answer.status, answer.body, answer.headers.get("Retry-After"))
        if not 200 <= answer.status < 300:
            raise BadAnswer(f"{self.url}{path} answered {answer.status}, which a troupe server does not send here")
        return answer.body

    def events(self, path: str, *, params: Mapping[str, Any] | None = None, last_event_id: str | None = None,
               read_timeout: float | None = None) -> Iterator[ServerEvent]:
        """The events of one server-sent event stream until it ends or is cut (an end
        too: the caller opens it again from its last id). A refusal raises
        ``ApiError``; silence past ``read_timeout`` raises ``TimeoutError``."""
        headers = {"Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        query = {key: _query_value(value) for key, value in (params or {}).items() if value is not None}
        timeout = httpx.Timeout(self._client.timeout.connect, read=read_timeout)
        try:
            with self._client.stream("GET", path, params=query or None, headers=headers, timeout=timeout) as response:
                if response.status_code != 200:
                    response.read()
                    raise error_from(response.status_code, _decoded(response), response.headers.get("Retry-After"))
                yield from _server_events(response.iter_lines(), self._object_hook)
        except httpx.ReadTimeout:
            raise TimeoutError(f"{self.url}{path} sent nothing for {read_timeout} s") from None
        except (httpx.RemoteProtocolError, httpx.ReadError):
            return  # cut mid-stream: the caller resumes from the last event it had
        except httpx.TransportError as exc:
            raise self.unreachable(exc) from None

    def download(self, path: str, target: Path) -> None:
        """Writes a file's bytes to ``target`` as they come (a checkpoint may be large);
        a refusal raises ``ApiError`` and leaves nothing at ``target``."""
        partial = target.with_name(f".{target.name}.part")
        try:
            with self._client.stream("GET", path, headers={"Accept": "*/*"}) as response:
                if response.status_code != 200:
                    response.read()
                    raise error_from(response.status_code, _decoded(response), response.headers.get("Retry-After"))
                with partial.open("wb") as out:
                    for chunk in response.iter_bytes():
                        out.write(chunk)
            partial.replace(target)
        except httpx.TransportError as exc:
            raise self.unreachable(exc) from None
        finally:
            partial.unlink(missing_ok=True)

    def unreachable(self, exc: BaseException) -> Unreachable:
        """``exc`` as said to a person: a certificate not trusted here is a server that
        is there, and the words say how to trust it."""
        found: BaseException | None = exc
        while found is not None:
            why = untrusted(found)
            if why is not None:
                return Unreachable(self.url, why, untrusted=True)
            found = found.__cause__ or found.__context__
        return Unreachable(self.url, str(exc) or type(exc).__name__)


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _decoded(response: httpx.Response, object_hook: Callable[[dict[str, Any]], Any] | None = None) -> Any:
    """JSON as JSON, CSV and plain text as text; a body that is neither is kept as text
    (a proxy's error page), and the caller decides what a success of that means."""
    kind = response.headers.get("Content-Type", "")
    data = response.content
    if kind.startswith(("text/csv", "text/plain")):
        return data.decode(errors="replace")
    if not data:
        return None
    try:
        return json.loads(data, object_hook=object_hook)
    except (ValueError, RecursionError):
        return data.decode(errors="replace")


def _server_events(lines: Iterator[str], object_hook: Callable[[dict[str, Any]], Any] | None = None,
                   ) -> Iterator[ServerEvent]:
    event, data, last_id = "message", list[str](), None
    for line in lines:
        if line == "":
            if data:
                try:
                    parsed = json.loads("\n".join(data), object_hook=object_hook)
                except (ValueError, RecursionError) as exc:
                    raise BadAnswer(f"the event stream sent a {event!r} event that is not JSON: {exc}") from None
                yield ServerEvent(event, parsed, last_id)
            event, data = "message", []
        elif line.startswith(":"):  # a keepalive: said, so a reader with a deadline looks at its clock
            yield ServerEvent("", None, last_id)
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif line.startswith("id:"):
            last_id = line[3:].strip()
