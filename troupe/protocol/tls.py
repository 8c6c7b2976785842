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


class EncryptedKey(ValueError):
    """Raised when the TLS key asks for a passphrase: a server that starts unattended has
    nobody to type it (OpenSSL itself only says "Invalid argument")."""


def server_context(cert: str, key: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key, password=lambda: _no_passphrase(key))
    return context


def _no_passphrase(key: str) -> str:
    raise EncryptedKey(f"the key {key} is encrypted with a passphrase, which a server cannot ask for; give it a key "
                       f"without one (openssl pkey -in {key} -out plain.key, then keep plain.key readable by you "
                       "only)")


def untrusted(exc: BaseException) -> str | None:
    """What to tell a client whose connection failed because the server's certificate did
    not verify (None for any other failure): where to give the certificate to trust."""
    if not isinstance(exc, ssl.SSLCertVerificationError):
        return None
    return (f"the server's certificate is not trusted here ({exc.reason}: {exc.verify_message}); if it serves a "
            "certificate of its own, give it with --ca FILE (troupe login URL --ca FILE keeps it for later commands)")
