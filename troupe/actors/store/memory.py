"""Shared cards: each card's policy, and the memory peaks that become the next budgets.
Called only from the store's thread."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import apsw

from troupe.actors.store.table import Table
from troupe.protocol import events as ev

# Messages ----------------------------------------------------------------------


@dataclass(frozen=True)
class SetCardPolicy:
    """One policy per physical card (NVML UUID), whichever worker it was set through."""

    uuid: str
    sharing: str
    reserved_mib: int


@dataclass(frozen=True)
class RecordPeak:
    """The peak a run measured on ``cards`` cards; ``failed_budget_mib`` when it ran out
    of memory under a budget derived from an earlier peak (then the next budget grows)."""

    graph_digest: str
    cards: int
    peak_mib: int
    failed_budget_mib: int | None = None
    succeeded: bool = True  # a run that succeeded clears a failed budget; one that ran out keeps it


@dataclass(frozen=True)
class CardPolicies:
    """Answers ``{uuid: {"sharing", "reserved_mib"}}`` of every card set to anything."""


@dataclass(frozen=True)
class LastPeak:
    """Answers ``{"peak_mib", "failed_budget_mib"}`` of the graph on that many cards, or None."""

    graph_digest: str
    cards: int


# SQL ---------------------------------------------------------------------------


def set_policy(conn: apsw.Connection, op: SetCardPolicy) -> None:
    conn.execute("INSERT OR REPLACE INTO card_policies(uuid, sharing, reserved_mib, updated_at) VALUES (?, ?, ?, ?)",
                 (op.uuid, op.sharing, op.reserved_mib, ev.utc_now()))


def record_peak(conn: apsw.Connection, op: RecordPeak) -> None:
    # A failed budget is kept until a run of the graph succeeds.
    conn.execute(
        "INSERT INTO memory_peaks(graph_digest, cards, peak_mib, failed_budget_mib, measured_at) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT(graph_digest, cards) DO UPDATE SET peak_mib = excluded.peak_mib, "
        "failed_budget_mib = CASE WHEN ? THEN NULL ELSE COALESCE(excluded.failed_budget_mib, failed_budget_mib) "
        "END, measured_at = excluded.measured_at",
        (op.graph_digest, op.cards, op.peak_mib, op.failed_budget_mib, ev.utc_now(), op.succeeded))


def policies(conn: apsw.Connection) -> dict[str, Mapping[str, Any]]:
    return {str(uuid): {"sharing": sharing, "reserved_mib": int(reserved)}
            for uuid, sharing, reserved in conn.execute("SELECT uuid, sharing, reserved_mib FROM card_policies")}


def last_peak(conn: apsw.Connection, op: LastPeak) -> dict[str, Any] | None:
    found = conn.execute("SELECT peak_mib, failed_budget_mib FROM memory_peaks WHERE graph_digest = ? AND cards = ?",
                         (op.graph_digest, op.cards)).fetchall()
    return {"peak_mib": found[0][0], "failed_budget_mib": found[0][1]} if found else None


WRITES: Table = {
    SetCardPolicy: lambda s, op: set_policy(s.conn, op),
    RecordPeak: lambda s, op: record_peak(s.conn, op),
}
READS: Table = {
    CardPolicies: lambda s, m: policies(s.conn),
    LastPeak: lambda s, m: last_peak(s.conn, m),
}
