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
from collections.abc import Sequence
from pathlib import Path

_DEVICE = re.compile(r"^(cpu|auto|cuda|mps)(?::(\d{1,3}))?$")
# Compiled at import: a warm run child is forked from a process that has, and compiling
# it in the child cost a run about 0.2 ms before its first node.
_INDEX = re.compile(r"\d+")


@functools.lru_cache(maxsize=1)
def probe_cuda_cards() -> tuple[tuple[int, str], ...]:
    """Every card NVML sees as ``(index, uuid)``, in PCI bus order; cached, as cards do
    not come and go under a running process."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return tuple((i, str(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))))
                         for i in range(pynvml.nvmlDeviceGetCount()))
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no library, no card: all mean "no CUDA here"
        return ()


def visible_cards(spec: str | None, cards: Sequence[tuple[int, str]]) -> tuple[int, ...]:
    """The NVML indices of the cards ``CUDA_VISIBLE_DEVICES`` (``spec``) shows, in the
    order CUDA numbers them: its first entry is CUDA's ordinal 0, the device a process is
    on until it picks another, which is what a plain ``cuda`` means.

    CUDA's own rule, read without CUDA: unset shows every card; an entry is an index or
    a UUID (or a unique prefix of one, with or without ``GPU-``); the list ends at the
    first entry that names no card or repeats one. Indices count in PCI bus order, which
    troupe sets (``CUDA_DEVICE_ORDER=PCI_BUS_ID``) so they agree with NVML's."""
    if spec is None:
        return tuple(index for index, _ in cards)
    shown: list[int] = []
    for entry in (e.strip() for e in spec.split(",")):
        if _INDEX.fullmatch(entry):
            found = [index for index, _ in cards if index == int(entry)]
        else:
            wanted = entry if entry.upper().startswith("GPU-") else f"GPU-{entry}"
            found = [index for index, uuid in cards if entry and uuid.upper().startswith(wanted.upper())]
        if len(found) != 1 or found[0] in shown:
            break
        shown.append(found[0])
    return tuple(shown)


def probe_accelerators(cuda_visible: str | None = None) -> tuple[str, ...]:
    """``("cuda:0", "cuda:1")``, ``("mps:0",)`` or ``()``: the cards this process can
    use, named by NVML index, in CUDA's order (so the first is the current device)."""
    found = [f"cuda:{i}" for i in visible_cards(cuda_visible, probe_cuda_cards())]
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        found.append("mps:0")
    return tuple(found)


def torch_device(device: str, cuda_visible: str | None, cards: Sequence[tuple[int, str]] | None = None) -> str:
    """The name torch in this process gives the card troupe calls ``device``: troupe
    names a card by its NVML index, torch by its place among the visible cards. A card
    this process cannot see (a simulated one) keeps its name."""
    parsed = parse_device(device)
    if parsed is None or parsed[0] != "cuda" or parsed[1] is None:
        return device
    order = visible_cards(cuda_visible, probe_cuda_cards() if cards is None else cards)
    return f"cuda:{order.index(parsed[1])}" if parsed[1] in order else device


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
    mps, then cpu; ``cuda`` is the current device, the first card of ``available`` (which
    lists cards in CUDA's order), and ``mps`` is ``mps:0``; an accelerator this machine
    lacks falls back to ``cpu`` with a warning. Raises ``ValueError`` for a name that is
    not a device at all."""
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
    if kind == "cuda" and index is None:
        current = next((d for d in available if d.startswith("cuda:")), None)
        if current:
            return current, None
    device = f"{kind}:{index or 0}"
    if device in available:
        return device, None
    return "cpu", f"device {requested} is not available on this server; running on cpu"
