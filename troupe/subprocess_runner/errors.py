"""Errors the engine raises, with stable codes."""

from __future__ import annotations

from troupe.protocol.errors import InvalidRequest, NotFound, StateConflict, TroupeError


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


class PackArchiveRefused(TroupeError):
    """Raised when a pack's archive, fetched from the control plane, is not the pack it
    claims to be (its files' sha256 differs, it is truncated, or it holds a path outside
    the pack): nothing of it is unpacked where a run would load it."""

    code = "pack_archive_refused"

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class PackUnsendable(StateConflict):
    """Raised when the control plane cannot offer a folder pack to workers as it is: a
    file name that is not UTF-8, or more files or bytes than an agent accepts (a pack is
    code, not data: data goes by path or upload). Only runs on workers need the archive."""

    code = "pack_unsendable"


class PackNotFound(NotFound):
    """Raised for a pack this control plane does not offer (none of that name was loaded
    from a folder: an installed pack is each machine's own)."""

    code = "pack_not_found"


class PackChanged(StateConflict):
    """Raised when a pack's files changed on disk after the control plane loaded them:
    what it would send is not what it runs, until it is restarted."""

    code = "pack_changed"


class PackBrokenNode(GraphInvalid):
    """Raised at submission for a node whose type's pack failed to load: the error names
    the pack and why, rather than calling the type unknown."""

    code = "pack_broken"
