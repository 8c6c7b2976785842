"""Quotas per session: the limits a class link gives the sessions it opens.

* ``max_running``: runs of the session running at once. The queue holds the others back
  (``troupe/actors/placer/queue.py``), so it refuses nothing by itself;
* ``max_waiting``: runs waiting at once. A run counts as waiting until it starts, except
  those that may start at once under ``max_running``;
* ``max_memory_mib``: memory budgets (``target.memory_gib``) of its running and waiting
  runs together;
* ``max_submits_per_minute``: runs submitted in the last 60 seconds, finished or not (a
  sweep's every variant, every run a study may start, a rerun, a resume). The limits above
  count only what is active: a flood of quick runs passes them all. On for class links
  unless the teacher says otherwise (``TROUPE_CLASS_MAX_SUBMITS_PER_MINUTE``, 30). Counted
  in memory: a restart of the server starts every session's minute afresh.

A submission that would pass a limit is refused whole, before anything is stored: 429
``quota_exceeded`` with the limit and the counts (and, past the per-minute limit, when to
try again: ``retry_after_s`` and the ``Retry-After`` header). One session's submissions are checked
one at a time, each until its rows are stored, so two at once cannot both slip under a
limit. The teacher's sessions and the server's token have no limits unless their link
set some.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from troupe.actors.store.submitters import SessionLoad
from troupe.protocol.api import RunOptions
from troupe.protocol.errors import QuotaExceeded
from troupe.web.context import Services
from troupe.web.login import Who

QUOTA_NAMES = ("max_running", "max_waiting", "max_memory_mib", "max_submits_per_minute")
RATE = "max_submits_per_minute"
RATE_WINDOW_S = 60.0


def quotas_from(max_running: int | None, max_waiting: int | None, max_memory_gib: float | None,
                max_submits_per_minute: int | None = None) -> dict[str, int]:
    """A link's limits as stored; an absent one is no limit (and so is a rate of 0)."""
    found = {"max_running": max_running, "max_waiting": max_waiting,
             "max_memory_mib": math.ceil(max_memory_gib * 1024) if max_memory_gib is not None else None,
             RATE: max_submits_per_minute or None}
    return {name: int(value) for name, value in found.items() if value is not None}


def declared_mib(options: RunOptions) -> int:
    """The memory budget a run declares (``target.memory_gib``), MiB; 0 without one."""
    gib = options.target.memory_gib if options.target is not None else None
    return math.ceil(gib * 1024) if gib is not None else 0


@asynccontextmanager
async def within_quota(svc: Services, who: Who | None, runs: int, memory_mib: int,
                       at_once: bool = False, submits: int | None = None) -> AsyncIterator[None]:
    """Holds the session's turn while ``runs`` more (with ``memory_mib`` of budgets in
    all) are checked and stored; raises ``QuotaExceeded`` when they would pass a limit.
    ``at_once``: they start as they are stored (the interactive lane), held back by no
    queue, so ``max_running`` is checked here. ``submits``: the runs the per-minute limit
    counts, when more than ``runs`` (a study starts all it may run over time, ``runs`` of
    them at once: every one is a run this submission makes)."""
    submits = runs if submits is None else submits
    quotas = who.quotas if who is not None else None
    if not quotas or who is None or who.session_id is None:
        yield
        return
    async with svc.login.quota_lock(who.session_id):
        load = await svc.store.read(SessionLoad(who.session_id))
        _check(quotas, load, runs, memory_mib, at_once)
        submitted = svc.login.submitted(who.session_id) if quotas.get(RATE) else None
        if submitted is not None:
            _check_rate(quotas, load, submitted, submits, time.monotonic())
        yield
        if submitted is not None:  # stored: they count (a refusal further on counts nothing)
            submitted.extend([time.monotonic()] * submits)


def _check(quotas: Mapping[str, int], load: Mapping[str, int], runs: int, memory_mib: int,
           at_once: bool = False) -> None:
    counts: dict[str, Any] = {"running": load["running"], "waiting": load["waiting"], "asked": runs}
    max_running, max_waiting = quotas.get("max_running"), quotas.get("max_waiting")
    if at_once and max_running is not None and load["running"] + runs > max_running:
        raise QuotaExceeded(
            f"this session may have {max_running} runs running at once; it has {load['running']} running, and an "
            "interactive run starts at once. Wait for one to finish, or cancel one",
            details={**counts, "limit": "max_running", **quotas})
    if max_waiting is not None:
        room = max(0, max_running - load["running"]) if max_running is not None else 0
        would_wait = max(0, load["waiting"] + runs - room)
        if would_wait > max_waiting:
            raise QuotaExceeded(
                f"this session may have {max_waiting} runs waiting at once"
                + (f" (and {max_running} running)" if max_running is not None else "")
                + f"; it has {load['running']} running and {load['waiting']} waiting, and this asks for {runs} more. "
                "Wait for some to finish, or cancel some", details={**counts, "limit": "max_waiting", **quotas})
    max_memory = quotas.get("max_memory_mib")
    if max_memory is not None and memory_mib and load["memory_mib"] + memory_mib > max_memory:
        raise QuotaExceeded(
            f"this session may hold {max_memory} MiB of memory budgets at once; its runs hold {load['memory_mib']} "
            f"MiB and this asks for {memory_mib} MiB more", details={**counts, "limit": "max_memory_mib",
                                                                   "memory_mib": load["memory_mib"],
                                                                   "asked_mib": memory_mib, **quotas})


def _check_rate(quotas: Mapping[str, int], load: Mapping[str, int], submitted: deque[float], runs: int,
                now: float) -> None:
    """``max_submits_per_minute`` over the last ``RATE_WINDOW_S``: ``submitted`` (oldest
    first) loses what has left the window, then must have room for ``runs`` more."""
    while submitted and submitted[0] <= now - RATE_WINDOW_S:
        submitted.popleft()
    limit = quotas[RATE]
    if len(submitted) + runs <= limit:
        return
    details: dict[str, Any] = {"running": load["running"], "waiting": load["waiting"], "asked": runs, "limit": RATE,
                               "submitted_last_minute": len(submitted), **quotas}
    if runs > limit:  # no wait lets it pass
        raise QuotaExceeded(f"this session may submit {limit} runs a minute, and this asks for {runs} at once: "
                            "submit fewer at a time (a smaller sweep or study)", details={**details,
                                                                                          "retry_after_s": None})
    # The submissions that must leave the window first; the last of them says when.
    retry = max(1, math.ceil(submitted[len(submitted) + runs - limit - 1] + RATE_WINDOW_S - now))
    raise QuotaExceeded(f"this session may submit {limit} runs a minute; it submitted {len(submitted)} in the last "
                        f"minute, and this asks for {runs} more. Try again in {retry} s", retry_after_s=retry,
                        details={**details, "retry_after_s": retry})
