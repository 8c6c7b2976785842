"""Checkpoints in bounds: a node's ``keep_checkpoints: N`` keeps the newest N of the
checkpoints it stored, ``keep_best: SERIES`` the best by that series; every other one
is let go as the next one is stored, from the run's folder, the worker's outbox, the
label's folder or the bucket, and the control plane's copy (``Shipper``'s removal and
the ``artifact_removed`` event). A 60-epoch script that saves each epoch keeps N files,
not 60.

The newest is always kept, whatever the bounds: it is the one a resume goes on from
(``troupe rerun --resume``). Neither param set (the default): every checkpoint is kept.

A checkpoint's epoch is the last number in its file name, and its score the point of
the ``keep_best`` series at that step, as the node logged it (``troupe.protocol.series``): the
server names the same one best in ``show``. One without a score yet (its epoch's point
not logged) is never the best, so it goes once N newer ones came.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from troupe.protocol.series import checkpoint_number, keep_best

Files = Sequence[tuple[str, Path]]  # (artifact kind, file) of one checkpoint: the weights, their training state


@dataclass(frozen=True)
class _Held:
    number: int | None
    files: tuple[tuple[str, Path], ...]


class Bounds:
    """One node's checkpoints, oldest first, and the points of its ``keep_best`` series."""

    def __init__(self, ctx: Any, keep: int, best: str) -> None:
        self._ctx = ctx
        self._keep = max(0, int(keep))
        self._best = keep_best(best)
        self._held: list[_Held] = []
        self._points: dict[int, float] = {}
        self._lock = threading.Lock()  # a script's checkpoints and its metric lines come on two threads
        if self._best is not None:
            ctx.sinks.metric_listeners.append(self._heard)

    @property
    def active(self) -> bool:
        return bool(self._keep) or self._best is not None

    def close(self) -> None:
        if self._heard in self._ctx.sinks.metric_listeners:
            self._ctx.sinks.metric_listeners.remove(self._heard)

    def _heard(self, node_id: str | None, name: str, step: int, value: float) -> None:
        if self._best is not None and node_id == self._ctx.node_id and name == self._best[0] and math.isfinite(value):
            with self._lock:
                self._points[step] = value

    def kept(self, files: Files) -> None:
        """The node stored a checkpoint (newer than every one before): the ones now out of
        bounds are let go."""
        if not self.active or not files:
            return
        with self._lock:
            self._held.append(_Held(checkpoint_number(files[0][1].name), tuple(files)))
            keep = self._kept()
            going = [held for index, held in enumerate(self._held) if index not in keep]
            self._held = [held for index, held in enumerate(self._held) if index in keep]
        for held in going:
            for kind, path in held.files:
                self._ctx.remove_artifact(kind, path)

    def _kept(self) -> set[int]:
        count = len(self._held)
        keep = {count - 1}  # the newest: a resume's
        if self._keep:
            keep.update(range(max(0, count - self._keep), count))
        if self._best is not None:
            lower = self._best[1]
            scored = [(self._points[h.number], index) for index, h in enumerate(self._held)
                      if h.number is not None and h.number in self._points]
            if scored:
                keep.add((min if lower else max)(scored, key=lambda pair: pair[0])[1])
        return keep


_of_node: weakref.WeakKeyDictionary[Any, Bounds] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def for_node(ctx: Any, params: Mapping[str, Any]) -> Bounds | None:
    """The node's bounds, made at its first call (before the epoch's points are logged:
    they are heard from then on); None when it keeps every checkpoint."""
    keep, best = int(params.get("keep_checkpoints") or 0), str(params.get("keep_best") or "")
    if not keep and not best.strip():
        return None
    with _lock:
        found = _of_node.get(ctx)
        if found is None:
            found = _of_node[ctx] = Bounds(ctx, keep, best)
        return found
