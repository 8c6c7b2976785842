"""What the queues hold, read from the actors that hold it: the QueueActors (their lines
and slots) and the placer (runs a queue handed on that have not started yet, and why).

A queue counts a run as holding a slot from the moment it hands the run to the placer;
the run may still wait there (for the seed gate, a device it shares with a worker, a
worker). ``running`` counts only what the placer started; a run still waiting anywhere
is ``queued``, and each queued run can say what it waits for (``queue_reason``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from troupe.actors.placer.actor import PlacerView, Quarantined, Waiting
from troupe.actors.placer.ledger import SHARED
from troupe.actors.placer.queue import PositionOf, PredictFor, QueueView
from troupe.protocol import events as ev
from troupe.web.context import Services
from troupe.web.login import submitter_of


class QueueState:
    """One reading of the placer and the queues, for one request."""

    def __init__(self, waiting: dict[str, Any], quarantined: dict[str, str],
                 snapshots: dict[str, QueueView], shares: dict[str, dict[str, Any]] | None = None) -> None:
        self.waiting: dict[str, dict[str, str]] = waiting["runs"]
        self.quarantined = quarantined
        self._snapshots = snapshots
        self._held: dict[str, int] = waiting["held"]
        self._shares = shares or {}

    @classmethod
    async def read(cls, svc: Services, keys: set[str] | None = None,
                   run_ids: frozenset[str] | None = None) -> QueueState:
        """``keys``: the queues to read, ``run_ids``: the runs whose reasons are wanted
        (None: all). The published views are read (the placer is asked before its first view)."""
        placer = svc.actor("placer")
        refs = {key: ref for key in (keys if keys is not None else
                                     [name.removeprefix("queues/") for name in svc.registry.names("queues/")])
                if (ref := svc.registry.lookup(f"queues/{key}")) is not None}
        view = placer.view
        if isinstance(view, PlacerView):  # as of the placer's last burst of messages: no ask
            waiting, quarantined = view.board.answer(run_ids), view.quarantined
        else:  # not published yet: an ask ahead of its line
            waiting, quarantined = await asyncio.gather(placer.ask(Waiting(run_ids), first=True),
                                                        placer.ask(Quarantined(), first=True))
        return cls(waiting, quarantined, {key: view for key, ref in refs.items() if (view := ref.view) is not None},
                   shared_devices(svc))

    def row(self, key: str, limit: int) -> dict[str, Any]:
        """The queue's counts: ``running`` what the placer started, ``queued`` the rest."""
        found = self._snapshots.get(key)
        snapshot: dict[str, Any] = found.counts() if found is not None else {
            "queue_key": key, "limit": limit, "running": 0, "queued": 0}
        held = self._held.get(key, 0)
        # The limit is the key's slot count (a worker's queue only keeps the order).
        row = {**snapshot, "limit": limit, "running": max(0, snapshot["running"] - held),
               "queued": snapshot["queued"] + held, "state": "ok", "reason": None, "shares": self._shares.get(key)}
        if key in self.quarantined:
            row.update(state="quarantined", reason=self.quarantined[key])
        return row

    def rows(self, limit_of: Any) -> list[dict[str, Any]]:
        keys = set(self._snapshots) | set(self.quarantined)
        return [self.row(key, limit_of(key)) for key in sorted(keys)]

    def reason(self, run: dict[str, Any], limit: int) -> dict[str, str] | None:
        """What a queued run waits for, with a stable code; None for any other run."""
        if run["status"] != ev.QUEUED:
            return None
        key = run["queue_key"]
        held = self.waiting.get(run["id"])
        if held is not None:
            return {"code": held["code"], "message": held["message"]}
        if key in self.quarantined:
            return {"code": "queue_quarantined", "message": f"queue {key} is quarantined: {self.quarantined[key]}"}
        place = f"#{run['queue_position']} in line" if run.get("queue_position") else "in line"
        found = self._snapshots.get(key)
        cap = found.limit_of(run.get("submitted_by") or "") if found is not None else None
        if cap is not None:
            return at_limit_reason(key, cap, place)
        return {"code": "slots_busy", "message": f"{place} for {key}: {self.busy(key, limit)}"}

    def busy(self, key: str, limit: int) -> str:
        """How many of the key's slots are taken, in words: a run handed on that waits at
        the seed gate, or for its device, holds its slot too."""
        queue, held = self.row(key, limit), self._held.get(key, 0)
        also = "" if not held else " (1 by a run that waits to start)" if held == 1 else \
            f" ({held} by runs that wait to start)"
        return f"{queue['running'] + held} of {queue['limit']} slots busy{also}"


def shared_devices(svc: Services) -> dict[str, dict[str, Any]]:
    """Each queue key whose physical device is one quota with other keys' (the server's
    cpu and a same-machine worker's ``gpu-a/cpu``): that device, the keys that offer it,
    its slots and the runs holding it through any of them, as its ledger last published
    them. A key's own ``running`` and ``limit`` cannot tell that its device is busy
    through another key; these can. Only the few ledgers several providers offer now are
    read (they mark themselves so), not every card's."""
    shares: dict[str, dict[str, Any]] = {}
    for ref in svc.registry.marked(SHARED):
        view = ref.view
        if not isinstance(view, dict) or len(view.get("queue_keys", ())) < 2:
            continue
        share = {"device": view["physical_id"], "queue_keys": list(view["queue_keys"]), "limit": view["limit"],
                 "running": len(view["holders"])}
        for key in share["queue_keys"]:
            shares[key] = share
    return shares


def at_limit_reason(queue_key: str, cap: int, place: str) -> dict[str, str]:
    """A run held back because its session runs as many runs on the key as its link lets it."""
    runs = "run" if cap == 1 else "runs"
    return {"code": "session_at_limit",
            "message": f"{place} for {queue_key}: its session already runs {cap} {runs} there, the most its login "
                       "link lets it run at once (max_running); it starts when one of them ends"}


def in_line(svc: Services, run_id: str, stored: int | None, queue_key: str | None = None) -> int | None:
    """A queued run's position: what the store counts (the FIFO's) unless its queue is
    under fair order with several submitters waiting; then the runs handed on before it
    plus its place in the fair line, as of the queue's last published view."""
    if stored is None:
        return None
    names = [f"queues/{queue_key}"] if queue_key is not None else svc.registry.names("queues/")
    for name in names:
        ref = svc.registry.lookup(name)
        view = ref.view if ref is not None else None
        if isinstance(view, QueueView) and view.order is not None:
            found = view.order.position(run_id)
            if found is not None:
                return _placer_held(svc, view.queue_key) + found
    return stored


async def submitted_position(svc: Services, run_id: str, submitter: str | None, queue_key: str,
                             stored: int | None) -> int | None:
    """A run just stored: its place in line. Its queue is asked (it has the run by now:
    the placer told it before the row was stored) only when others wait there under fair
    order; else the store's FIFO count is the place."""
    ref = svc.registry.lookup(f"queues/{queue_key}")
    view = ref.view if ref is not None else None
    if stored is None or ref is None or not isinstance(view, QueueView) or not view.fair \
            or not view.submitters - {submitter or ""}:
        return stored
    found = await ref.ask(PositionOf(run_id))
    return stored if found is None else _placer_held(svc, queue_key) + found


async def predicted_place(svc: Services, queue_key: str, request: Any, fifo: int) -> tuple[int, bool]:
    """Where a run the request's session queued now on ``queue_key`` would start, and
    whether that is by fair order (others wait there); ``fifo``: the place at the end."""
    ref = svc.registry.lookup(f"queues/{queue_key}")
    view = ref.view if ref is not None else None
    who = svc.login.who(request)
    me = submitter_of(who) if who is not None else ""
    if ref is None or not isinstance(view, QueueView) or not view.fair or not view.submitters - {me}:
        return fifo, False
    found = await ref.ask(PredictFor(me))
    return (fifo, False) if found is None else (_placer_held(svc, queue_key) + found, True)


def asker_limit(svc: Services, queue_key: str, request: Any) -> tuple[int | None, int]:
    """The limit of runs at once the request's session has reached on the key (None: not
    reached), and how many waiting runs of other sessions at theirs its run would pass."""
    ref = svc.registry.lookup(f"queues/{queue_key}")
    view = ref.view if ref is not None else None
    if not isinstance(view, QueueView):
        return None, 0
    who = svc.login.who(request)
    asker = submitter_of(who) if who is not None else ""
    return view.limit_of(asker), view.held_back(asker)


def _placer_held(svc: Services, queue_key: str) -> int:
    """Runs of the key its queue handed on that have not started (the seed gate, a device
    shared with a worker): they start before any run still in the queue's line."""
    placer = svc.actor("placer").view
    return placer.board.held().get(queue_key, 0) if isinstance(placer, PlacerView) else 0


async def with_queue_reasons(svc: Services, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows, each queued one with its ``queue_reason`` (asks the actors only when the
    page holds a queued run)."""
    queued = [run for run in runs if run["status"] == ev.QUEUED]
    if not queued:
        return runs
    state = await QueueState.read(svc, {run["queue_key"] for run in queued}, frozenset(run["id"] for run in queued))
    for run in queued:
        run["queue_position"] = in_line(svc, run["id"], run.get("queue_position"), run["queue_key"])
    for run in runs:
        run["queue_reason"] = state.reason(run, svc.settings.concurrency_for(run["queue_key"]))
    return runs
