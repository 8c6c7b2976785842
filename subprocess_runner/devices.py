"""Which devices this machine has, found without importing torch, and how a requested
device becomes a queue key.

The control plane probes CUDA through NVML (``pynvml``) and mps through the platform, so
it never creates a CUDA context. ``resolve_device`` is part of the export surface.
"""

from __future__ import annotations

import functools
import hashlib
import platform
import re
import socket
from pathlib import Path

_DEVICE = re.compile(r"^(cpu|auto|cuda|mps)(?::(\d{1,3}))?$")


@functools.lru_cache(maxsize=1)
def probe_accelerators() -> tuple[str, ...]:
    """``("cuda:0", "cuda:1")``, ``("mps:0",)`` or ``()``; cached, as cards do not come
    and go under a running server."""
    found: list[str] = []
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            found.extend(f"cuda:{i}" for i in range(pynvml.nvmlDeviceGetCount()))
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no library, no card: all mean "no CUDA here"
        pass
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        found.append("mps:0")
    return tuple(found)


@functools.lru_cache(maxsize=1)
def host_machine_id() -> str:
    """This machine's stable id (systemd's machine-id, else a hash of the hostname). The
    server and an agent on one host read the same value, which is how a same-machine
    worker is recognised: never by its peer address."""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            value = Path(path).read_text().strip()
        except OSError:
            continue
        if value:
            return value
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:32]


def parse_device(name: str) -> tuple[str, int | None] | None:
    match = _DEVICE.match(name.strip().lower())
    if not match:
        return None
    return match.group(1), int(match.group(2)) if match.group(2) is not None else None


def resolve_device(requested: str | None, available: tuple[str, ...] | None = None) -> tuple[str, str | None]:
    """Returns ``(device, warning)``. ``None`` means ``cpu``; ``auto`` picks cuda, then
    mps, then cpu; ``cuda`` is ``cuda:0`` and ``mps`` is ``mps:0``; an accelerator this
    machine lacks falls back to ``cpu`` with a warning. Raises ``ValueError`` for a name
    that is not a device at all."""
    if available is None:
        available = probe_accelerators()
    if requested is None or requested.strip() == "":
        return "cpu", None
    parsed = parse_device(requested)
    if parsed is None:
        raise ValueError(f"{requested!r} is not a device (cpu, auto, cuda, cuda:N or mps)")
    kind, index = parsed
    if kind == "cpu":
        return "cpu", None
    if kind == "auto":
        for prefix in ("cuda:", "mps:"):
            best = next((d for d in available if d.startswith(prefix)), None)
            if best:
                return best, None
        return "cpu", None
    device = f"{kind}:{index or 0}"
    if device in available:
        return device, None
    return "cpu", f"device {requested} is not available on this server; running on cpu"
