"""Letting go of a file a run stored (a checkpoint past its node's ``keep_checkpoints``):
the run's own file and every copy its backend made on this side, in the run's process
(in-process: the server's; on a worker: the run's child, which holds the label's folder
and the bucket's credentials). The control plane deletes the copy it holds itself when
the run's ``artifact_removed`` event reaches it (``troupe.actors.store.artifacts``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from troupe.subprocess_runner import outbox

if TYPE_CHECKING:
    from troupe.subprocess_runner.artifacts import Destination


def remove_copies(run_id: str, path: Path, relative: str | None, where: Destination) -> None:
    """Raises OSError (or the bucket's error) for a copy that could not be removed; the
    run's own file goes first either way."""
    path.unlink(missing_ok=True)
    if relative is None:
        return
    if where.backend == "mount" and where.root is not None:
        from troupe.subprocess_runner.artifacts import MOUNT_FOLDER

        (where.root / MOUNT_FOLDER / run_id / relative).unlink(missing_ok=True)
    elif where.backend == "s3" and where.bucket is not None:
        from troupe.subprocess_runner.s3 import artifact_key, delete_key

        asyncio.run(delete_key(where.bucket, artifact_key(where.bucket, run_id, relative)))
    elif where.backend == "transfer" and where.outbox is not None:
        outbox.drop(where.outbox, run_id, relative)
