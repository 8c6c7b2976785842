"""Retention: each submitter keeps its newest N finished runs (``TROUPE_RUN_RETENTION_KEEP_LAST``),
never one tagged ``keep``, never one a resume that has not ended needs; an interrupted
run's checkpoints stay (its resume point after a crash). Called only from the store's
thread."""

from __future__ import annotations

import shutil
from collections import Counter
from dataclasses import dataclass

import apsw

from troupe.actors.store.runs import TERMINAL_SQL, delete_runs
from troupe.actors.store.table import Session, Table
from troupe.protocol import events as ev


@dataclass(frozen=True)
class Prune:
    """Retention: keeps the newest ``keep_last`` runs of each submitter (active ones count
    but are never removed; one tagged ``keep`` is never removed and takes no place).
    Returns ``Pruned``."""

    keep_last: int


@dataclass(frozen=True)
class Pruned:
    """What one prune removed: the run ids, and per submitter (a session's id, ``server``,
    or None for runs an older troupe stored without one) its name and how many."""

    run_ids: tuple[str, ...] = ()
    by_submitter: tuple[tuple[str | None, str, int], ...] = ()


KEEP_TAG = "keep"  # a run tagged so is never pruned

# One submitter's finished runs past its newest N (those tagged keep take no place): read
# by the submitter index (runs an older troupe stored without a submitter, by a scan).
_PAST_WINDOW = ("SELECT id, status FROM (SELECT id, status, enqueue_seq FROM runs r WHERE {who} AND NOT EXISTS "
                f"(SELECT 1 FROM run_tags t WHERE t.run_id = r.id AND t.tag = '{KEEP_TAG}') "
                f"ORDER BY enqueue_seq DESC LIMIT -1 OFFSET ?) WHERE status IN {TERMINAL_SQL} ORDER BY enqueue_seq")
_SUBMITTERS_PAST = _PAST_WINDOW.format(who="submitted_by = ?")
_UNRECORDED_PAST = _PAST_WINDOW.format(who="submitted_by IS NULL")


def _crowded(conn: apsw.Connection, keep_last: int) -> list[str | None]:
    """The submitters with more than ``keep_last`` runs, None for the runs stored without
    one: read from the counts the runs' inserts and deletes keep (schema 29), all a pass
    reads when there is nothing to prune, however many runs are stored."""
    return [str(who) or None for (who,) in conn.execute(
        "SELECT submitted_by FROM submitter_runs WHERE runs > ?", (keep_last,))]


def prunable(conn: apsw.Connection, keep_last: int) -> list[tuple[str, str, str | None]]:
    """Each submitter's finished runs outside its newest ``keep_last`` (negative: none),
    as (id, status, submitter), but for a run tagged ``keep`` and one whose checkpoint a
    resumed run that has not ended will load: retention never takes what an accepted
    run needs (it goes at a later pass, once that run ended). One session's runs never
    push out another's, nor the server token's."""
    if keep_last < 0:
        return []
    doomed = [(str(run_id), str(status), who) for who in _crowded(conn, keep_last) for run_id, status in (
        conn.execute(_SUBMITTERS_PAST, (who, keep_last)) if who is not None
        else conn.execute(_UNRECORDED_PAST, (keep_last,)))]
    if not doomed:
        return []
    needed = {row[0] for row in conn.execute(
        "SELECT rerun_of FROM runs WHERE status IN ('queued', 'running', 'disconnected') "
        "AND resumed_from IS NOT NULL")}
    return [found for found in doomed if found[0] not in needed]


def _prune(s: Session, op: Prune) -> Pruned:
    pruned = prunable(s.conn, op.keep_last)
    if not pruned:
        return Pruned()
    delete_runs(s, [run_id for run_id, _, _ in pruned])
    for run_id, status, _ in pruned:
        _remove_run_dir(s, run_id, keep_checkpoints=status == ev.INTERRUPTED)
    counts = Counter(who for _, _, who in pruned)
    names = _submitter_names(s.conn, list(counts))
    return Pruned(tuple(run_id for run_id, _, _ in pruned),
                  tuple((who, names[who], count) for who, count in counts.items()))


def _submitter_names(conn: apsw.Connection, submitters: list[str | None]) -> dict[str | None, str]:
    """How the log names each submitter: ``session 1a2b3c4d5e6f7a8b (ann)``, ``server token``."""
    sessions = [who for who in submitters if who not in (None, "server")]  # "server": the server's own token
    labels = {str(sid): str(label) for sid, label in conn.execute(
        f"SELECT id, label FROM sessions WHERE id IN ({', '.join('?' * len(sessions))})", sessions)} if sessions else {}
    return {who: "server token" if who == "server" else "runs stored with no submitter" if who is None
            else f"session {who}" + (f" ({labels[who]})" if labels.get(who) else "") for who in submitters}


def _remove_run_dir(s: Session, run_id: str, keep_checkpoints: bool) -> None:
    # Retention, unlike a user's delete, also removes what a run wrote on its own;
    # an interrupted run keeps its checkpoints, its resume point after a crash.
    run_dir = s.runs_dir / run_id
    if not run_dir.is_dir():
        return
    for child in run_dir.iterdir():
        if keep_checkpoints and child.name == "checkpoints":
            continue
        if child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
    if not any(run_dir.iterdir()):
        run_dir.rmdir()


WRITES: Table = {Prune: _prune}
READS: Table = {}
