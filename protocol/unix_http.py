"""HTTP over a Unix socket: how an agent behind an SSH session (``ssh -R``) and its run
children reach the control plane. The URL's host still goes in the Host header."""

from __future__ import annotations

import http.client
import socket


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, host: str, port: int, timeout: float | None) -> None:
        super().__init__(host, port, timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)
