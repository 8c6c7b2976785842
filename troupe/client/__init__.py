"""Drives a troupe server from Python: ``Client`` and the handles it returns (``Run``,
``Sweep``, ``Study``), and the errors a call can end in (docs/python.md).

The names load on first use: the server and an agent import this package's light
modules (``_config``: where a server is, its session file) and must not pay for the
client's HTTP library (httpx, and through it rich) and reply models at their start."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from troupe.client._client import Client
    from troupe.client._errors import (
        ApiError,
        NotFound,
        QuotaExceeded,
        Refused,
        Timeout,
        TroupeError,
        Unavailable,
        Unreachable,
    )
    from troupe.client._follow import StreamStalled
    from troupe.client._handles import Run, Study, Sweep

__all__ = ["ApiError", "Client", "NotFound", "QuotaExceeded", "Refused", "Run", "StreamStalled", "Study", "Sweep",
           "Timeout", "TroupeError", "Unavailable", "Unreachable"]
_WHERE = {"Client": "_client", "StreamStalled": "_follow", "Run": "_handles", "Study": "_handles",
          "Sweep": "_handles"}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'troupe.client' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"troupe.client.{_WHERE.get(name, '_errors')}"), name)
    globals()[name] = value  # found once
    return value
