"""The CLI's HTTP client: ``troupe.Client``'s own path to a server (one path, not two),
with the answers worded for a terminal."""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from troupe.cli.errors import BadAddress, BadOption, CliError, NoServer, ReplyShape

# troupe.client (httpx, and through it rich; the API's reply models) is imported at the
# first request, not with this module: every process that imports troupe.cli.main would pay
# it, ~150 ms of CPU, the server, an agent, and each run child an agent spawns (which
# imports troupe.cli.main again) included.
if TYPE_CHECKING:
    from troupe.client._errors import Unreachable
    from troupe.client._http import Http

_PREFIX = re.compile(r"^[0-9a-f]{4,31}$")
_WHOLE = re.compile(r"^[0-9a-f]{32}$")
_SHORT = re.compile(r"^[0-9a-f]{1,3}$")


class _Reply(dict[str, Any]):
    """A JSON object of a reply: a missing field is a one-line CliError, not a traceback."""

    def __missing__(self, key: str) -> Any:
        raise ReplyShape(f"the server's answer has no {key!r}; is this a troupe server's address (of this "
                         "version)?")


class Client:
    """The CLI's side of ``troupe.Client``'s HTTP path (troupe/client/_http.py, on httpx):
    the same connection pool, TLS and Unix-socket handling, with a command's view of an
    answer: ``(status, body)`` for it to word, and every failure to reach a server as a
    one-line ``CliError``."""

    def __init__(self, url: str, token: str | None, unix_socket: str | None = None, ca: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self._unix_socket = unix_socket
        self.ca = ca  # a self-signed server's certificate (``--ca``)
        self._http: Http | None = None

    @property
    def http(self) -> Http:
        if self._http is None:  # made on first use: a command that never asks pays nothing
            from troupe.client._http import Http

            try:
                self._http = Http(self.url, self.token, unix_socket=self._unix_socket, ca=self.ca,
                                  object_hook=_Reply)
            except ValueError as exc:  # "[::1", "x:y", a port past 65535
                raise BadAddress(f"{self.url} is not a server's address ({exc}); give --host NAME --port 1-65535"
                                 ) from None
        return self._http

    def _unreachable(self, exc: Unreachable, hint: str = "") -> CliError:
        """A server that answered with a certificate this terminal does not trust is
        there: the error says how to trust it, not that nothing answers."""
        if exc.untrusted:
            return CliError(str(exc))
        return NoServer(f"{exc}{hint}")

    def request(self, method: str, path: str, body: Any = None, timeout: float = 30.0) -> tuple[int, Any]:
        try:  # JSON has no NaN or Infinity: the server would answer "not valid JSON"
            raw = json.dumps(body, allow_nan=False).encode() if body is not None else None
        except ValueError as exc:
            raise BadOption(f"a value given is not a finite number ({exc})") from None
        from troupe.client._errors import Unreachable

        try:
            answer = self.http.send(method, path, raw, timeout=timeout, retries=0)
        except Unreachable as exc:
            raise self._unreachable(exc, "; start one with `troupe start`") from None
        except ValueError as exc:  # a port or a host name no socket takes
            raise BadAddress(f"{self.url} is not a server's address ({exc})") from None
        found = answer.body
        if 200 <= answer.status < 300 and not (found is None or isinstance(found, dict | str)):
            raise CliError(f"{self.url} answered {answer.status} with {str(found)[:80]!r}, not a troupe server's "
                           "JSON; is this the server's address?")
        if 200 <= answer.status < 300 and isinstance(found, str) and not answer.headers.get(
                "Content-Type", "").startswith(("text/csv", "text/plain")):
            raise CliError(f"{self.url} answered {answer.status} with {found[:80]!r}, not a troupe server's JSON; "
                           "is this the server's address?")
        return answer.status, found

    def full_id(self, kind: str, given: str) -> str:
        """The id of the run, sweep or study (``kind``: runs, sweeps, studies) that
        ``given`` starts: any unique prefix of at least 4 hex characters names one, as
        in git and docker. A whole id goes as it is; text that is not hex, or too short,
        is a usage mistake (BadOption, exit 2), said before anything is sent; none or
        several matches are a CliError."""
        what = {"runs": "run", "sweeps": "sweep", "studies": "study"}[kind]
        text = given.strip().lower()
        if not text:
            raise BadOption(f"an empty {what} id")
        if _WHOLE.fullmatch(text):
            return text
        if _SHORT.fullmatch(text):  # hex, but too few characters to name one: said, not sent
            raise BadOption(f"{given.strip()!r} is too short: a {what} id, or the start of one, needs 4 or more "
                            "characters (troupe ls shows them)")
        if not _PREFIX.fullmatch(text):  # no id at all (zzzz, ../x, x?y=1): said, not sent
            raise BadOption(f"{given.strip()!r} is not a {what} id: an id is 32 hex characters (0-9, a-f), and 4 "
                            "or more of its first name it (troupe ls shows them)")
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
        """Yields ``(event, data)`` of a server-sent event stream; ``TimeoutError``
        when no byte came within ``read_timeout``, and once ``deadline`` (a
        ``time.monotonic()`` time) has passed, however busy the stream is: no read waits
        past it, and the next event after it raises at once (a follower's ``--timeout``
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
        from troupe.client._errors import ApiError, Unreachable
        from troupe.client._http import BadAnswer

        try:
            for item in self.http.events(path, read_timeout=_wait_s(read_timeout, deadline)):
                _wait_s(read_timeout, deadline)  # past the deadline: TimeoutError, however busy the stream
                if item.event:  # not a keepalive
                    if not isinstance(item.data, dict):
                        raise CliError(f"the server's event stream sent a {item.event!r} event that is not a JSON "
                                       f"object: {str(item.data)[:80]!r}; is this a troupe server?")
                    yield item.event, item.data
        except Unreachable as exc:
            raise self._unreachable(exc) from None
        except ApiError as exc:
            raise CliError(f"{self.url}{path} answered {exc.status}: {exc.code}: {exc.message}") from None
        except BadAnswer as exc:
            raise CliError(f"the server's event stream {exc}") from None


def _wait_s(read_timeout: float | None, deadline: float | None) -> float | None:
    """How long the next read may wait: ``read_timeout``, cut to what is left before
    ``deadline``; past the deadline, TimeoutError now."""
    if deadline is None:
        return read_timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the deadline has passed")
    return left if read_timeout is None else min(left, read_timeout)


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
