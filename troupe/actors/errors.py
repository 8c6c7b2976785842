"""Errors of the actor runtime and the run service, with stable codes."""

from __future__ import annotations

import asyncio

from troupe.protocol.errors import CapacityRefused, InvalidRequest, NotFound, StateConflict, TroupeError, Unauthorized


class ActorDeadError(TroupeError):
    """Raised to an ``ask`` whose actor stopped before (or while) answering, and to every
    ask still waiting in a mailbox at teardown, so no caller hangs."""

    code = "actor_dead"
    http_status = 503


class AskTimeout(TroupeError, asyncio.TimeoutError):
    """Raised when an ``ask`` got no answer within its timeout. The message may still be
    handled later, which is why writes are idempotent."""

    code = "ask_timeout"
    http_status = 503


class StoreUnavailable(TroupeError):
    """Raised to writers when the store could not commit (its file is gone, or it is
    restarting); the write did not happen."""

    code = "store_unavailable"
    http_status = 503


class RunNotFound(NotFound):
    code = "run_not_found"


class RunStillActive(StateConflict):
    """Raised when deleting a run that has not finished."""

    code = "run_active"


class RunNeeded(StateConflict):
    """Raised when deleting a run that a queued or running resume loads its checkpoint
    from (retention keeps it for the same reason)."""

    code = "run_needed"


class CheckpointGone(StateConflict):
    """Raised when a resume is stored after the run it resumes from was removed (pruned
    or deleted while the request was checked): its checkpoint cannot be loaded."""

    code = "checkpoint_unavailable"


class LaneFull(CapacityRefused):
    """Raised when the interactive lane already holds its limit of runs."""

    code = "interactive_lane_full"


class EditorSessionBusy(CapacityRefused):
    """Raised when the editor session already has a run executing."""

    code = "editor_session_busy"


class SeedGateClosed(CapacityRefused):
    """Raised when an interactive run cannot start because of the seed gate: a seeded
    run needs the process alone, and one already executes or waits."""

    code = "seed_gate_closed"


class QueueQuarantined(CapacityRefused):
    """Raised when a queue key was quarantined after crashing past its restart limit."""

    code = "queue_quarantined"


class ShuttingDown(CapacityRefused):
    code = "shutting_down"


class EnrollmentRefused(Unauthorized):
    """Raised when an enrollment token is unknown, expired, used up or revoked: no retry
    can help, so the agent exits."""

    code = "enrollment_refused"


class NameTaken(EnrollmentRefused):
    code = "worker_name_taken"
    http_status = 409



class DeviceUnavailable(InvalidRequest):
    """Raised when a run asks for a device this server or its worker lacks and refuses
    the fallback to cpu (``options.require_device``, ``--require-device``)."""

    code = "device_unavailable"


class MemoryBudgetRequired(InvalidRequest):
    """Raised when a run for a shared card has no budget: none declared, none measured."""

    code = "memory_budget_required"


class MemoryBudgetTooLarge(InvalidRequest):
    """Raised when a run's budget could never fit the card it names, even empty."""

    code = "memory_budget_too_large"


class MemoryBusy(CapacityRefused):
    """Raised when a run's budget fits its card but not now, and it did not ask to wait."""

    code = "memory_busy"


class FlavorNotFound(NotFound):
    code = "flavor_not_found"


class FlavorExists(StateConflict):
    code = "flavor_exists"


class FlavorInUse(StateConflict):
    """Raised when deleting a flavor that a run, sweep or study that is not over uses."""

    code = "flavor_in_use"


class FileNotFound(NotFound):
    code = "file_not_found"


class FileInUse(StateConflict):
    """Raised when deleting an upload that a queued or executing run still names."""

    code = "file_in_use"


class UploadDeleted(StateConflict):
    """Raised when the same content was deleted while it was being uploaded."""

    code = "upload_deleted"


class WorkerNotConnected(TroupeError):
    """Raised when what is asked for lives on a worker (a worker run's recorded outputs)
    and that worker is not connected now."""

    code = "worker_offline"
    http_status = 503


class ArtifactNotFound(NotFound):
    code = "artifact_not_found"


class ArtifactUnreachable(StateConflict):
    """Raised when an artifact's bytes live where this server cannot read them (a mount
    label it does not hold, or a bucket it has no keys for)."""

    code = "artifact_unreachable"


class ArtifactRefused(InvalidRequest):
    """Raised when a worker's transfer of an artifact is cut short or its content does
    not match the hash it announced: nothing is kept."""

    code = "artifact_refused"


class StorageUnavailable(TroupeError):
    """Raised when the S3 bucket could not take or give a file; nothing was recorded."""

    code = "storage_unavailable"
    http_status = 503
