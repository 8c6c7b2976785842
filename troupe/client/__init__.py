"""Drives a troupe server from Python: ``Client`` and the handles it returns (``Run``,
``Sweep``, ``Study``), and the errors a call can end in (docs/python.md)."""

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
