"""The benchmark's HTTP client: one keep-alive HTTP/1.1 connection to the troupe server on
127.0.0.1, for JSON requests and for reading a server-sent event stream."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

from bench._measure import BenchError

HOST = "127.0.0.1"


class Conn:
    """One persistent (keep-alive) HTTP/1.1 connection to the server on 127.0.0.1."""

    def __init__(self, port: int, token: str, timeout: float) -> None:
        self.port, self.token, self.timeout = port, token, timeout
        self.http = http.client.HTTPConnection(HOST, port, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
        status, data = self.raw(method, path, body)
        return status, json.loads(data) if data else None

    def raw(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        """The status and the body's bytes, undecoded: a timer around this measures the
        server and the transfer, not the client's own JSON parsing."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
            headers["Authorization"] = f"Bearer {self.token}"
        for attempt in (1, 2):
            try:
                self.http.request(method, path, body=body, headers=headers)
                response = self.http.getresponse()
                data = response.read()
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                # The server may close an idle keep-alive connection; retry once on a new one
                # (only reached before a response was read, so nothing is submitted twice
                # unless the server dropped the connection mid-request).
                self.http.close()
                if attempt == 2:
                    raise
        return response.status, data

    def stream(self, path: str) -> Iterator[tuple[str, Any]]:
        """Yields (event, data) of a server-sent event stream on this connection; reads the
        response to its end when the caller stops, so the connection can be reused."""
        self.http.request("GET", path, headers={"Accept": "text/event-stream"})
        response = self.http.getresponse()
        if response.status != 200:
            body = response.read()
            raise BenchError(f"GET {path} answered {response.status}: {body[:200]!r}")
        try:
            yield from read_events(response)
        finally:
            # Finish the chunked body (the server closes the stream after run_finished) so
            # the next request can use the same socket; close it if that is not possible.
            try:
                response.read()
            except (OSError, http.client.HTTPException):
                self.http.close()
            if response.will_close:
                self.http.close()


def read_events(response: http.client.HTTPResponse) -> Iterator[tuple[str, Any]]:
    """``(event, data)`` of a server-sent event stream until the body ends (or is cut):
    the bench's own stdlib reader, so that what it times is the server, not a library."""
    event, data = "message", list[str]()
    while True:
        try:
            line = response.readline()
        except (http.client.HTTPException, ConnectionError):
            return
        if not line:
            return
        text = line.decode(errors="replace").rstrip("\r\n")
        if text == "":
            if data:
                yield event, json.loads("\n".join(data))
            event, data = "message", list[str]()
        elif text.startswith("event:"):
            event = text[6:].strip()
        elif text.startswith("data:"):
            data.append(text[5:].lstrip())
