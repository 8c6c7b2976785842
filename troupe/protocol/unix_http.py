"""HTTP over a Unix socket: how an agent behind an SSH session (``ssh -R``) and its run
children reach the control plane. The URL's host still goes in the Host header."""

from __future__ import annotations

import http.client
import socket
import urllib.parse

from troupe.protocol.tls import client_context


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, host: str, port: int, timeout: float | None) -> None:
        super().__init__(host, port, timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def connect(url: str, unix_socket: str | None, timeout: float | None,
            ca: str | None = None) -> http.client.HTTPConnection:
    """A connection to the control plane at ``url``: through ``unix_socket`` when there
    is one (an SSH session's forward), else over TCP; TLS for an ``https`` URL, trusting
    ``ca`` beside the system's authorities."""
    parsed = urllib.parse.urlsplit(url)
    https = parsed.scheme == "https"
    host, port = parsed.hostname or "127.0.0.1", parsed.port or (443 if https else 80)
    if unix_socket is not None:
        return UnixHTTPConnection(unix_socket, host, port, timeout)
    if https:
        return http.client.HTTPSConnection(host, port, timeout=timeout, context=client_context(host, ca))
    return http.client.HTTPConnection(host, port, timeout=timeout)
