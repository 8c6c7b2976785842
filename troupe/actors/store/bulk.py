"""Finished runs stored in bulk, exactly as a server that ran them would have stored them.

A benchmark of a year of history (bench/history.py) needs a million finished runs in a
database; submitting and executing them would take weeks. Writing their rows with SQL of
its own would make a database that drifts from what the server writes (the run index
above all, kept by ``insert_run`` and ``append_events``). So a bulk run goes through the
same writes a server commits over a run's life, through the same ``Writer``: its row
(``InsertRun``, or a sweep's ``CreateSweep``), its events with their metric points
(``AppendEvents``), its end (``UpdateRun``, which harvests a sweep's result) and its
tags (``EditRun``). Only the batching differs: many runs a transaction.

Nothing on the server imports this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw

import troupe.actors.store.actor  # noqa: F401  # applies the store's connection settings (apsw's best practice) once
from troupe.actors.store.events import AppendEvents
from troupe.actors.store.run_list import EditRun
from troupe.actors.store.runs import UPDATABLE, InsertRun, UpdateRun
from troupe.actors.store.sweeps import CreateSweep
from troupe.actors.store.writer import Writer
from troupe.protocol.api import held_devices
from troupe.protocol.run_record import RunRecord


@dataclass(frozen=True)
class FinishedRun:
    """A run's record as admitted, its events (numbered from 1, ending with
    ``run_finished``) and the columns its row had at its end (``status``, ``started_at``,
    ``finished_at``, ``progress``, ``execution_facts``...)."""

    record: RunRecord
    events: tuple[Mapping[str, Any], ...]
    end: Mapping[str, Any]
    tags: tuple[str, ...] = ()

    @classmethod
    def from_stored(cls, row: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> FinishedRun:
        """A run as the API reads it (``GET /api/runs/{id}`` and its events): what a copy
        of a real run needs."""
        # The API leaves out the devices a run holds: they follow from its options, as the store reads them.
        record = RunRecord.from_row({**row, "devices": held_devices(row["options"], row["device"])})
        admitted = record.columns()
        end = {key: row[key] for key in sorted(UPDATABLE - set(admitted) | {"status"}) if key in row}
        return cls(record, tuple(events), end, tuple(row.get("tags") or ()))


@dataclass(frozen=True)
class SweepOf:
    """A sweep's row and variants (as ``CreateSweep`` takes them) and its finished runs."""

    sweep: Mapping[str, Any]
    variants: tuple[Mapping[str, Any], ...]
    runs: tuple[FinishedRun, ...]


def life_writes(items: Sequence[FinishedRun | SweepOf]) -> list[Any]:
    """The writes a server commits over these runs' lives, in their order: every row
    first (each sweep's in one write, as ``POST /api/sweeps`` makes them), then each
    run's events, its end and its tags."""
    ops: list[Any] = []
    runs: list[FinishedRun] = []
    for item in items:
        if isinstance(item, SweepOf):
            ops.append(CreateSweep(item.sweep, item.variants, tuple(run.record for run in item.runs)))
            runs += item.runs
        else:
            ops.append(InsertRun(item.record))
            runs.append(item)
    for run in runs:
        ops.append(AppendEvents(run.record.id, tuple(run.events)))
        ops.append(UpdateRun(run.record.id, dict(run.end)))
        if run.tags:
            ops.append(EditRun(run.record.id, tags=run.tags))
    return ops


class BulkStore:
    """A ``Writer`` on a home's database (made and migrated when new) with a larger page
    cache than a server's; each ``store`` is one transaction. Used while no server has
    the database open."""

    def __init__(self, db_path: Path, runs_dir: Path, cache_mib: int = 256) -> None:
        self.writer = Writer.open(db_path, runs_dir)
        self.writer.conn.execute(f"PRAGMA cache_size=-{cache_mib * 1024}")

    def store(self, items: Sequence[FinishedRun | SweepOf]) -> None:
        """One transaction. A write that failed is raised once the others are committed
        (a server would log it and go on; a bulk load that lost a run quietly would
        measure another database than it says)."""
        ops = life_writes(items)
        results = self.writer.commit(ops)
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is not None:
            raise failed

    @property
    def conn(self) -> apsw.Connection:
        return self.writer.conn

    def close(self) -> None:
        self.writer.close()
