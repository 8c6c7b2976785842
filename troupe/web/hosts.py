"""The names a server bound beyond loopback is reached by: each interface's address and
the machine's names. They are printed at start (a teacher reads them out) and admitted
as ``Host`` without any setting; any other ``Host`` is still refused (the DNS-rebinding
guard)."""

from __future__ import annotations

import contextlib
import socket
import struct

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


def beyond_loopback(host: str) -> bool:
    return host.strip("[]").lower() not in LOOPBACK


def interface_addresses() -> list[str]:
    """Every interface's IPv4 address but loopback's (Linux; elsewhere the names' own)."""
    found: list[str] = []
    with contextlib.suppress(OSError, AttributeError):
        import fcntl

        for _, name in socket.if_nameindex():
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                try:
                    packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
                except OSError:
                    continue  # an interface with no IPv4 address
                found.append(socket.inet_ntoa(packed[20:24]))
    if not found:
        with contextlib.suppress(OSError):
            found = sorted({str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)})
    return [address for address in dict.fromkeys(found) if not address.startswith("127.")]


def reachable_names(bound: str) -> list[str]:
    """The addresses and names a server bound to ``bound`` answers on, best first."""
    if not beyond_loopback(bound):
        return []
    names = interface_addresses() if bound in ("0.0.0.0", "::", "") else [bound.strip("[]")]
    with contextlib.suppress(OSError):
        host = socket.gethostname()
        names += [host, socket.getfqdn(host), f"{host.split('.')[0]}.local"]
    return [name.lower() for name in dict.fromkeys(names) if name and name.lower() not in LOOPBACK]
