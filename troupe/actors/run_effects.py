"""What a run's events mean beyond its log: the rows some of them write beside it (a
node's recorded outputs, a training's epoch as the run's progress, an artifact listed
stored, pending or failed, the params and tags a script logged), the peak a run's end
records for the next budget, and the events a queued run opens its log with. The RunActor owns the order of writes; this
module only says which."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from troupe.actors.store.artifacts import FAILED, PENDING, STORED, RecordArtifact, RemoveArtifact
from troupe.actors.store.events import RecordOutputs
from troupe.actors.store.logged import RecordLogged
from troupe.actors.store.memory import RecordPeak
from troupe.actors.store.runs import UpdateRun
from troupe.protocol import events as ev
from troupe.protocol.run_record import RunRecord
from troupe.subprocess_runner.fingerprint import with_code, with_pack_versions


class EventRows:
    """The row an event of one run writes, if any. It remembers the epoch last written,
    so a training's progress is written once per epoch, not once per metric."""

    def __init__(self, run_id: str, record_outputs: bool, outputs_keep: int) -> None:
        self._run_id = run_id
        self._record_outputs = record_outputs
        self._outputs_keep = outputs_keep
        self._epoch: Any = None  # the training epoch last written as the run's progress
        self._first_epoch: tuple[Any, str] | None = None  # the first epoch seen ended, and when (for an ETA)
        self._facts: dict[str, Any] | None = None  # what executed the run, as last written
        self._removed: set[str] = set()  # paths of files the run let go of (``artifact_removed``)

    def took(self, facts: dict[str, Any]) -> dict[str, Any]:
        """The facts this process took of itself when it starts the run (kept, so the
        code its commands ran joins them)."""
        self._facts = facts
        return facts

    def fact_row(self, kind: str, node_id: str | None, payload: dict[str, Any]) -> UpdateRun:
        """A fact of the run, not an event of its log: a worker's environment (with the
        folder packs' versions, which its child names by digest alone), or the code a
        command node ran, joined to the fingerprint (the digest taken again). Code whose
        run's facts this actor never saw (a run adopted after a restart, whose facts
        came before it) is not recorded (an update of nothing)."""
        if kind == ev.ENVIRONMENT:
            self._facts = with_pack_versions(payload)
        elif self._facts is not None and node_id is not None and isinstance(payload.get("files"), list):
            self._facts = with_code(self._facts, node_id, payload)
        else:
            return UpdateRun(self._run_id, {})
        return UpdateRun(self._run_id, {"execution_facts": self._facts})

    def was_removed(self, path: str) -> bool:
        return path in self._removed

    def row_for(self, kind: str, node_id: str | None, payload: dict[str, Any], remote: bool,
                worker: str | None) -> Any | None:
        """``remote``: the event came from a worker, whose recorded outputs stay there
        (read through its link)."""
        if kind == ev.NODE_FINISHED and self._record_outputs and node_id is not None and not remote:
            return RecordOutputs(self._run_id, node_id, payload.get("outputs", {}), self._outputs_keep)
        if kind == ev.METRIC and isinstance(payload.get("epochs"), int) and payload.get("epoch") != self._epoch:
            return self._progress(payload)
        if kind in (ev.ARTIFACT, ev.ARTIFACT_PENDING) and payload.get("backend") is not None:  # listed
            return RecordArtifact(self._run_id, node_id, str(payload.get("kind")), payload["path"],
                                  payload["backend"], payload.get("label"), payload["size"], payload["sha256"],
                                  PENDING if kind == ev.ARTIFACT_PENDING else STORED)
        if kind == ev.PARAMS:  # what the script logged (MLflow): each name's newest value, on the run
            return RecordLogged(self._run_id, payload.get("params") or {}, payload.get("tags") or {})
        if kind == ev.ARTIFACT_REMOVED:
            self._removed.add(payload["path"])
            return RemoveArtifact(self._run_id, payload["path"])
        if kind == ev.WARNING and str(payload.get("code", "")).startswith("artifact_") and payload.get("path"):
            # A file the run wrote that could not be kept is listed failed, never lost silently.
            return RecordArtifact(self._run_id, node_id, str(payload.get("kind") or "file"), str(payload["path"]),
                                  "transfer" if worker else "local", None, None, None, FAILED,
                                  str(payload.get("message"))[:500])
        return None

    def _progress(self, payload: dict[str, Any]) -> UpdateRun:
        """A training's place, epoch k of n, for lists and terminals."""
        self._epoch = payload.get("epoch")
        now = ev.utc_now()
        if self._first_epoch is None:
            self._first_epoch = (self._epoch, now)
        return UpdateRun(self._run_id, {"progress": {
            "epoch": self._epoch, "epochs": payload["epochs"], "first_epoch": self._first_epoch[0],
            "first_at": self._first_epoch[1], "at": now}})


def opening_events(record: RunRecord) -> Iterator[tuple[str, str | None, dict[str, Any]]]:
    """After ``run_queued``: the checkpoint a resumed run continues from (by content),
    then the warnings its submission gave (a text, or a message with its code and node)."""
    resumed: Mapping[str, Any] = record.resumed_from or {}
    for node_id, plan in resumed.get("nodes", {}).items():
        for part in ("weights", "state"):
            yield ev.PROVENANCE, node_id, {
                "kind": "checkpoint", "ref": f"run:{resumed['run_id']}/artifacts/{plan[f'{part}_id']}",
                "mode": "content", "sha256": plan[f"{part}_sha256"], "epoch": plan["epoch"], "resume": part}
    for warning in record.warnings:
        found = dict(warning) if isinstance(warning, dict) else {"message": warning}
        yield ev.WARNING, found.pop("node_id", None), found


def peak_row(record: RunRecord, status: str, memory: tuple[int | None, bool, bool] | None) -> RecordPeak | None:
    """An exact peak on a worker's cards becomes the next budget of the same graph on
    as many cards: from a run that succeeded, or one that ran out of memory (then a
    budget that was derived from an earlier peak is known to be too small). ``memory``:
    the run's peak in MiB, whether it is exact, and whether it ran out of memory."""
    if memory is None or not memory[0] or not memory[1] or record.graph_digest is None:
        return None  # a peak of 0 is none measured (a context started, nothing allocated)
    cards = sum(1 for device in record.devices if device.startswith("cuda"))
    if not cards or not (status == ev.SUCCEEDED or memory[2]):
        return None
    derived = record.memory_budget_source == "measured"
    failed = record.memory_budget_mib if memory[2] and derived else None
    return RecordPeak(record.graph_digest, cards, memory[0], failed, status == ev.SUCCEEDED)
