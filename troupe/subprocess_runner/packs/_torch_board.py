"""A training loop's TensorBoard event files: the points each epoch reports (its training
loss, its validation loss and accuracy), written beside its checkpoints in the run's
folder (``tensorboard/<node>/events.out.tfevents.*``), so that ``tensorboard --logdir``
pointed at troupe's runs shows them as the seeds' loop wrote them. Imported when such a
node executes.

They are written with torch's own ``SummaryWriter``, which needs the ``tensorboard``
package (``pip install 'troupe[tensorboard]'``); without it the run says so once and
trains on. A run with no folder of its own (``troupe exec``, a warm child's priming)
writes none. Once the loop ends, however it ends, each file is announced as the run's
artifact of kind ``tensorboard``: an in-process run's stays where it is, a worker's
travels as its checkpoints do (the storage label, the bucket, or the agent's artifact
outbox to the control plane), since the run's folder on the worker is removed with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from troupe.protocol.graph import node_file_stem

EXTRA = "troupe[tensorboard]"
KIND = "tensorboard"  # the artifact kind of an event file


class Board:
    """One loop's writer: ``add`` a point, ``epoch_done`` to flush an epoch's points to
    the file (a TensorBoard watching the folder sees them), ``close`` at the loop's end."""

    def __init__(self, ctx: Any, writer: Any, folder: Path) -> None:
        self._ctx, self._writer, self._folder = ctx, writer, folder

    @classmethod
    def open(cls, ctx: Any) -> Board | None:
        if getattr(ctx, "run_dir", None) is None:
            return None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except Exception as exc:  # ImportError without the package; a broken install says its own words
            ctx.warning(f"no TensorBoard event files are written for this loop: torch's SummaryWriter cannot be "
                        f"loaded ({exc}); install the tensorboard package (pip install '{EXTRA}'). Training goes on",
                        code="tensorboard_not_written")
            return None
        folder = ctx.files(KIND) / node_file_stem(ctx.node_id)
        return cls(ctx, SummaryWriter(log_dir=str(folder)), folder)

    def add(self, name: str, value: float, epoch: int) -> None:
        self._writer.add_scalar(name, value, epoch)

    def epoch_done(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        """Writes what is left, then announces every event file of the loop."""
        self._writer.close()
        for path in sorted(self._folder.rglob("*tfevents*")):
            if path.is_file():
                self._ctx.artifact(KIND, path)
