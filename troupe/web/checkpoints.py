"""A run's checkpoints in a few words (``GET /api/runs/{id}``'s ``checkpoints``): how many
it keeps and their size, the newest (what a resume goes on from), the best by its
node's ``keep_best`` series, and how many it let go (``keep_checkpoints``). ``show``
and the run page print this rather than a line per file; ``artifacts`` still lists
every file kept.

The best is found as the run's process found it (``troupe.protocol.series``): a checkpoint's
epoch is the last number in its name, its score the series' point at that step, and
the series' name (or a ``min:``/``max:`` before it) says which way is better."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from troupe.actors.store.artifacts import REMOVED
from troupe.actors.store.metric_pages import MetricPage
from troupe.protocol.series import checkpoint_number, keep_best
from troupe.web.context import Services

CHECKPOINT = "checkpoint"
_POINTS_READ = 100_000  # points of the keep_best series read for the best (a series is an epoch's)


def kept(artifacts: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The files a run still has (a removed one is history: its row stays, its file does not)."""
    return [a for a in artifacts if a.get("state") != REMOVED]


def best_series(graph: Mapping[str, Any]) -> tuple[str, str, bool] | None:
    """(node id, series, lower is better) of the first node that keeps its best checkpoint."""
    for node in graph.get("nodes") or ():
        found = keep_best(str((node.get("params") or {}).get("keep_best") or ""))
        if found is not None:
            return node["id"], found[0], found[1]
    return None


async def summary(svc: Services, row: Mapping[str, Any]) -> dict[str, Any] | None:
    """None for a run without checkpoints (kept or let go)."""
    files = row.get("artifacts") or ()
    mine = [a for a in files if a.get("kind") == CHECKPOINT]
    if not mine:
        return None
    live = [a for a in mine if a.get("state") in (None, "stored", "pending")]
    total = sum(a.get("size") or 0 for a in kept(files) if a.get("kind") in (CHECKPOINT, "training_state"))
    newest = max(live, key=lambda a: a["id"]) if live else None
    return {"count": len(live), "total_size": total, "newest": _ref(newest) if newest else None,
            "best": await _best(svc, row, live), "removed": sum(1 for a in mine if a.get("state") == REMOVED)}


def _ref(artifact: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": artifact["id"], "path": artifact["path"], "node_id": artifact.get("node_id"),
            "size": artifact.get("size"), "epoch": checkpoint_number(artifact["path"])}


async def _best(svc: Services, row: Mapping[str, Any], live: list[Mapping[str, Any]]) -> dict[str, Any] | None:
    wanted = best_series(row.get("graph") or {})
    if wanted is None:
        return None
    node_id, series, lower = wanted
    points = await svc.store.read(MetricPage(row["id"], series, 0, 2**62, _POINTS_READ))
    by_step = {int(step): float(value) for _, step, value, _, _ in points
               if value is not None and math.isfinite(float(value))}
    scored = [(by_step[number], a) for a in live if a.get("node_id") == node_id
              and (number := checkpoint_number(a["path"])) is not None and number in by_step]
    if not scored:
        return None
    value, artifact = (min if lower else max)(scored, key=lambda pair: pair[0])
    return {**_ref(artifact), "series": series, "value": value, "lower_is_better": lower}
