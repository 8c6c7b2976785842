"""Errors the supervision tree raises, with stable codes."""

from __future__ import annotations

from troupe.protocol.errors import TroupeError


class StartRefused(TroupeError):
    """Raised when the control plane cannot start for a reason its owner mends (the
    database cannot be opened or written, the runs folder cannot be made): said in one
    line, nothing started."""

    code = "start_refused"
