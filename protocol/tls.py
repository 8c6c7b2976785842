"""TLS as a client of the control plane sees it: the system's trusted authorities, plus
``ca`` (``--ca FILE``) for a server serving a self-signed certificate.

A loopback address is not what a certificate names, so on loopback the name is not
checked; the chain still is, against the same authorities (the server's own
certificate, for the server's own terminal)."""

from __future__ import annotations

import ssl

_LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


def client_context(host: str, ca: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if ca:
        context.load_verify_locations(cafile=ca)
    if host.strip("[]") in _LOOPBACK:
        context.check_hostname = False
    return context


def server_context(cert: str, key: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context
