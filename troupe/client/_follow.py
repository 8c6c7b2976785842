"""A run's events as they happen, over its server-sent event stream, to its end. A
stream that is cut (a proxy, a restarted server, a dropped connection) is opened again
with the last event's id as ``Last-Event-ID``, so the reader sees every event once; one
that keeps ending with nothing new is checked against the run's record, and given up
with ``StreamStalled`` only when the run has not ended; a server that answers nothing is
waited for (a restart) and given up with ``Unreachable`` after ``AWAY_FOR_S``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from troupe.client._errors import TroupeError, Unreachable
from troupe.client._http import Http
from troupe.protocol.api import Event

FINISHED = "run_finished"
REOPENS = 8  # streams in a row that brought nothing new before the follow gives up
REOPEN_PAUSE_S = 0.25
# A server that answers nothing is waited for this long before the follow says so: a
# restart (`troupe stop`, then `troupe start`, or a start after a crash) takes several
# seconds, and a laptop waking from sleep rejoins its network later still.
AWAY_FOR_S = 60.0
AWAY_PAUSE_MAX_S = 2.0


class StreamStalled(TroupeError):
    """The run's stream kept ending before the run did, with nothing new."""


def follow_run(http: Http, run_id: str, after: int = 0, deadline: float | None = None) -> Iterator[Event]:
    """Yields each event after ``after`` up to ``run_finished``; returns early, without a
    word, once ``deadline`` (a ``time.monotonic()`` instant) has passed: the caller says
    what that means."""
    for data in run_events(http, run_id, after, deadline):
        yield Event.model_validate(data)


def run_events(http: Http, run_id: str, after: int = 0, deadline: float | None = None) -> Iterator[dict[str, Any]]:
    """``follow_run``'s events as the JSON objects they came as: a caller that only waits
    for the end pays for no model per event."""
    last, fruitless, away_since = after, 0, None
    path = f"/api/runs/{run_id}/stream"
    while not _past(deadline):
        progressed = False
        if away_since is not None:  # a server away for a moment (a restart) is waited for
            gone = time.monotonic() - away_since
            time.sleep(min(AWAY_PAUSE_MAX_S, REOPEN_PAUSE_S + gone / 4, _left(deadline) or AWAY_PAUSE_MAX_S))
        try:
            for item in http.events(path, params={"after": last}, last_event_id=str(last) if last else None,
                                    read_timeout=_left(deadline)):
                if _past(deadline):
                    return
                if item.event == "stream_lagged":  # too far behind: opened again where it was
                    resume = item.data.get("resume_after") if isinstance(item.data, dict) else None
                    last = resume if isinstance(resume, int) else last
                    break
                if item.event != "run_event" or not isinstance(item.data, dict):
                    continue
                seq = item.data.get("seq")
                if not isinstance(seq, int) or seq <= last:
                    continue
                last, progressed = seq, True
                yield item.data
                if item.data.get("type") == FINISHED:
                    return
        except TimeoutError:
            continue  # silence until the deadline: the loop's condition ends it
        except Unreachable as exc:
            away_since = away(exc, away_since)
            continue
        fruitless = 0 if progressed else fruitless + 1
        away_since = None if progressed else away_since
        if fruitless >= REOPENS:
            try:
                status = http.request("GET", f"/api/runs/{run_id}")["status"]
            except Unreachable as exc:  # a stream cut at once, and no answer either: the server is away
                away_since = away(exc, away_since)
                continue
            away_since = None
            if status in ("succeeded", "failed", "cancelled", "interrupted"):
                return
            raise StreamStalled(f"run {run_id}'s stream ended {fruitless} times with nothing new while it is "
                                f"{status}; it goes on: follow it again later")
        time.sleep(REOPEN_PAUSE_S * fruitless)  # a stream that ends at once is not opened in a tight loop


def away(exc: Unreachable, since: float | None) -> float:
    """When the server was first found away; ``exc`` is raised once it has been away for
    ``AWAY_FOR_S``, or at once for a certificate not trusted here (no wait mends that)."""
    since = time.monotonic() if since is None else since
    if exc.untrusted or time.monotonic() - since >= AWAY_FOR_S:
        raise exc
    return since


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.001, deadline - time.monotonic())


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline
