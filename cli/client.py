"""A small HTTP client for the CLI: JSON requests and an SSE reader (stdlib only, so the
CLI starts fast)."""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from cli.errors import BadAddress, BadOption, CliError, NoServer, ReplyShape
from protocol.tls import untrusted
from protocol.unix_http import connect

_PREFIX = re.compile(r"^[0-9a-f]{4,31}$")
_WHOLE = re.compile(r"^[0-9a-f]{32}$")
_SHORT = re.compile(r"^[0-9a-f]{1,3}$")


class _Reply(dict[str, Any]):
    """A JSON object of a reply: a missing field is a one-line CliError, not a traceback."""

    def __missing__(self, key: str) -> Any:
        raise ReplyShape(f"the server's answer has no {key!r}; is this a troupe server's address (of this "
                         "version)?")


class Client:
    def __init__(self, url: str, token: str | None, unix_socket: str | None = None, ca: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self._unix_socket = unix_socket
        self.ca = ca  # a self-signed server's certificate (``--ca``)

    def _connection(self, timeout: float | None) -> http.client.HTTPConnection:
        try:
            return connect(self.url, self._unix_socket, timeout, self.ca)
        except (ValueError, http.client.InvalidURL) as exc:  # "[::1", "x:y", a port past 65535
            raise BadAddress(f"{self.url} is not a server's address ({exc}); give --host NAME --port 1-65535") from None

    def _headers(self, body: bytes | None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def _unreachable(self, exc: BaseException, hint: str = "") -> CliError:
        """A server that answered with a certificate this terminal does not trust is
        there: the error says how to trust it, not that nothing answers."""
        why = untrusted(exc)
        if why is not None:
            return CliError(f"{self.url}: {why}")
        return NoServer(f"no troupe server answers at {self.url} ({exc}){hint}")

    def request(self, method: str, path: str, body: Any = None, timeout: float = 30.0) -> tuple[int, Any]:
        try:  # JSON has no NaN or Infinity: the server would answer "not valid JSON"
            raw = json.dumps(body, allow_nan=False).encode() if body is not None else None
        except ValueError as exc:
            raise BadOption(f"a value given is not a finite number ({exc})") from None
        conn = self._connection(timeout)
        try:
            conn.request(method, path, body=raw, headers=self._headers(raw))
            response = conn.getresponse()
            data = response.read()
        except (TimeoutError, ConnectionRefusedError, socket.gaierror, OSError) as exc:
            raise self._unreachable(exc, "; start one with `troupe start`") from None
        except (OverflowError, http.client.InvalidURL) as exc:  # a port or a host name no socket takes
            raise BadAddress(f"{self.url} is not a server's address ({exc})") from None
        finally:
            conn.close()
        return response.status, self._answer(response.status, response.getheader("Content-Type") or "", data)

    def _answer(self, status: int, content_type: str, data: bytes) -> Any:
        """The reply's JSON, or the text of a CSV or of the metrics page. A troupe server
        answers one of those (or nothing): a success that is anything else came from
        something else at that address, and no command may read it as done; a refusal
        that is not JSON is kept as its text."""
        if content_type.startswith(("text/csv", "text/plain")):
            return data.decode(errors="replace")
        try:
            found = json.loads(data, object_hook=_Reply) if data else None
        except (ValueError, RecursionError):
            found = data.decode(errors="replace")
        if 200 <= status < 300 and not (found is None or isinstance(found, dict)):
            raise CliError(f"{self.url} answered {status} with {str(found)[:80]!r}, not a troupe server's JSON; "
                           "is this the server's address?")
        return found

    def full_id(self, kind: str, given: str) -> str:
        """The id of the run, sweep or study (``kind``: runs, sweeps, studies) that
        ``given`` starts: any unique prefix of at least 4 hex characters names one, as
        in git and docker. A whole id goes as it is, text that is no prefix as one
        quoted path segment (the server says whether it knows it); none or several
        matches are a CliError."""
        what = {"runs": "run", "sweeps": "sweep", "studies": "study"}[kind]
        text = given.strip().lower()
        if not text:
            raise BadOption(f"an empty {what} id")
        if _WHOLE.fullmatch(text):
            return text
        if _SHORT.fullmatch(text):  # hex, but too few characters to name one: said, not sent
            raise BadOption(f"{given.strip()!r} is too short: a {what} id, or the start of one, needs 4 or more "
                            "characters (troupe ls shows them)")
        if not _PREFIX.fullmatch(text):  # sent as one path segment, whatever it holds: the server says it knows none
            return urllib.parse.quote(given.strip(), safe="")
        status, found = self.request("GET", f"/api/ids?prefix={text}")
        if status != 200:
            return given
        matches = found.get(kind, [])
        if not matches:
            raise CliError(f"no {what} has an id starting with {given}")
        if len(matches) > 1:
            raise CliError(f"{given} names more than one {what}: {', '.join(m[:12] for m in matches)}"
                           f"{' and more' if len(matches) >= 10 else ''}; give more of the id")
        return str(matches[0])

    def full_ids(self, kind: str, given: Sequence[str]) -> list[str]:
        return [self.full_id(kind, one) for one in given]

    def stream(self, path: str, read_timeout: float | None = None,
               deadline: float | None = None) -> Iterator[tuple[str, Any]]:
        """Yields ``(event, data)`` of a server-sent event stream; ``socket.timeout``
        propagates when no byte came within ``read_timeout``, and once ``deadline`` (a
        ``time.monotonic()`` time) has passed, however busy the stream is: no read waits
        past it, and the next one after it raises at once (a follower's ``--timeout``
        holds while its run emits without a pause). A reader the server finds
        too far behind is told where to resume (``stream_lagged``): the stream is opened
        again from there, and the caller sees one stream without a gap."""
        while True:
            lagged = None
            for kind, data in self._stream_once(path, read_timeout, deadline):
                if kind == "stream_lagged":
                    lagged = data
                    break
                yield kind, data
            if lagged is None:
                return
            resume = lagged.get("resume_after")
            if resume is not None:
                parts = urllib.parse.urlsplit(path)
                query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query) if k != "after"]
                path = urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(
                    [*query, ("after", str(resume))])))

    def _stream_once(self, path: str, read_timeout: float | None,
                     deadline: float | None = None) -> Iterator[tuple[str, Any]]:
        conn = self._connection(_wait_s(read_timeout, deadline))
        sock: socket.socket | None = None  # the response reads it after the connection lets go of it

        def before_read() -> None:  # each read waits until the deadline at most
            if deadline is not None:
                wait_s = _wait_s(read_timeout, deadline)
                if sock is not None:
                    sock.settimeout(wait_s)

        try:
            conn.request("GET", path, headers={**self._headers(None), "Accept": "text/event-stream"})
            sock = conn.sock
            response = conn.getresponse()
        except TimeoutError as exc:
            conn.close()
            if deadline is not None and time.monotonic() >= deadline:
                raise  # the caller's deadline, not a server that is not there
            raise self._unreachable(exc) from None
        except (ConnectionRefusedError, OSError) as exc:
            conn.close()
            raise self._unreachable(exc) from None
        except (OverflowError, http.client.InvalidURL) as exc:
            conn.close()
            raise BadAddress(f"{self.url} is not a server's address ({exc})") from None
        if response.status != 200:
            body = response.read()
            conn.close()
            raise CliError(f"{self.url}{path} answered {response.status}: {_said(body)}")
        try:
            yield from read_events(response, before_read)
        finally:
            conn.close()


def _wait_s(read_timeout: float | None, deadline: float | None) -> float | None:
    """How long the next read may wait: ``read_timeout``, cut to what is left before
    ``deadline``; past the deadline, TimeoutError now."""
    if deadline is None:
        return read_timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the deadline has passed")
    return left if read_timeout is None else min(left, read_timeout)


def _said(body: bytes) -> str:
    """A refusal in words: the error's code and message when the body is the API's
    error object, else its first 200 characters."""
    try:
        error = json.loads(body)["error"]
        return f"{error['code']}: {error['message']}"
    except (ValueError, KeyError, TypeError):
        return body[:200].decode("utf-8", "replace")


class Reopens:
    """A followed run stream that ends before the run did (a restart, a proxy that cuts)
    is opened again after its last event; one that keeps ending with nothing new is
    given up with a one-line error, so that a follower never spins on a server that
    answers and cuts."""

    LIMIT = 3
    PAUSE_S = 0.5

    def __init__(self, run_id: str) -> None:
        self._run_id = run_id
        self._fruitless = 0

    def ended(self, progressed: bool) -> None:
        """The stream ended, having brought something new or not: pause, or give up."""
        self._fruitless = 0 if progressed else self._fruitless + 1
        if self._fruitless >= self.LIMIT:
            raise CliError(f"run {self._run_id}'s stream ended {self._fruitless} times with nothing new before the "
                           f"run did; it may still be going: troupe attach {self._run_id}")
        time.sleep(self.PAUSE_S)


def read_events(response: http.client.HTTPResponse,
                before_read: Callable[[], None] | None = None) -> Iterator[tuple[str, Any]]:
    """``(event, data)`` of a server-sent event stream, until the body ends, or is cut
    (a proxy, a server gone mid-chunk): that is an end too, and the caller opens the
    stream again from where it was or says it cannot. Silence past the read timeout
    still raises TimeoutError, as does ``before_read`` (called before each line is read)."""
    event, data = "message", list[str]()
    while True:
        if before_read is not None:
            before_read()
        try:
            line = response.readline()
        except TimeoutError:
            raise
        except (http.client.HTTPException, ConnectionError):
            return
        if not line:
            return
        text = line.decode(errors="replace").rstrip("\r\n")
        if text == "":
            if data:
                try:
                    parsed = json.loads("\n".join(data), object_hook=_Reply)
                except (ValueError, RecursionError) as exc:
                    raise CliError(f"the server's event stream sent a {event!r} event that is not JSON: {exc}") from exc
                if not isinstance(parsed, dict):
                    raise CliError(f"the server's event stream sent a {event!r} event that is not a JSON object: "
                                   f"{str(parsed)[:80]!r}; is this a troupe server?")
                yield event, parsed
            event, data = "message", list[str]()
        elif text.startswith(":"):
            continue
        elif text.startswith("event:"):
            event = text[6:].strip()
        elif text.startswith("data:"):
            data.append(text[5:].lstrip())
