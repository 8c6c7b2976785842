"""Errors the engine raises, with stable codes."""

from __future__ import annotations

from protocol.errors import InvalidRequest, TroupeError


class GraphInvalid(InvalidRequest):
    """Raised when a graph does not fit the catalog: the message says which node, port
    or param, and ``pointer`` points at it inside the submitted document."""

    code = "graph_invalid"


class RunCancelled(TroupeError):
    """Raised inside node code when the run was asked to stop; the engine turns it into
    a ``cancelled`` outcome instead of a failure."""

    code = "run_cancelled"


class CheckpointUnavailable(TroupeError):
    """Raised when the checkpoint a resumed run continues from is not, when it is loaded,
    the one its run records (swapped or damaged since the rerun was asked for), or cannot
    be read: the run never trains on weights its record does not name."""

    code = "checkpoint_unavailable"

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class PackLoadError(TroupeError):
    """Raised when a pack named by the ``troupe.packs`` entry points cannot be loaded."""

    code = "pack_load_error"
