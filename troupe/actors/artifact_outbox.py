"""ArtifactOutbox (agent side): uploads what the runs' children kept in the artifact
outbox (``troupe.subprocess_runner.outbox``) to the control plane, one file at a time, and
removes each entry only once the control plane confirmed the stored copy's sha256.

An upload that fails for a reason that may pass (the control plane is down or
restarting, the transfer was cut, a 5xx) is tried again with a pause of its own that
grows up to a minute, while the other files go on: one file never holds up the rest. A
reconnect of the link tries every file again at once. One the control plane refuses for
good (the run was deleted, the worker revoked) is dropped; one refused as it is (too
large, a bad name) or refused each of ``_CUT_TRIES`` times it was sent (bytes that
differ from their sha256) is given up: the agent tells the control plane, whose row of
it then says ``failed`` with the reason. The outbox may hold at most ``limit_bytes``; it
is full when the largest file it has kept would no longer fit, and then the agent takes
no new runs (its heartbeat says so) until uploads free room.
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from troupe.actors.base import Actor
from troupe.protocol.unix_http import connect
from troupe.subprocess_runner import outbox
from troupe.subprocess_runner.artifacts import FAILED_HEADER, SHA256_HEADER

log = logging.getLogger("troupe.agent")

_FIRST_PAUSE_S = 1.0
_MAX_PAUSE_S = 60.0
_REFUSED_FOR_GOOD = (401, 403, 404, 410)  # the run or the worker is gone: nothing will take it
_MAY_PASS = (0, 408, 409, 429)  # no answer, or an answer that may change (and every 5xx)
_CUT_TRIES = 5  # a 400 (cut short, or bytes that differ) this many times for one file: given up


# Messages ----------------------------------------------------------------------


@dataclass(frozen=True)
class Wake:
    """A child kept a new artifact, or the link is back: upload now."""


@dataclass(frozen=True)
class Flush:
    """Ask: a future answered once every entry the outbox held (of ``run_id`` alone,
    when given) has been tried, and those that can be stored were: a restarted agent
    uploads before it takes new runs, and a run reports its end after its files went
    up. The wait (never the entries) is given up after ``within_s``."""

    within_s: float = 60.0
    run_id: str | None = None


@dataclass(frozen=True)
class Usage:
    """Ask: ``(bytes held, entries, full)`` for the heartbeat."""


@dataclass(frozen=True)
class _Next:
    pass


@dataclass(frozen=True)
class _Done:
    entry: outbox.Entry
    status: int  # the control plane's answer; 0: no answer
    problem: str


# The actor ---------------------------------------------------------------------


class ArtifactOutbox(Actor):
    def __init__(self, folder: Path, limit_bytes: int, control_plane: dict[str, Any]) -> None:
        super().__init__("artifact-outbox")
        self._folder = folder
        self._limit = limit_bytes
        self._control = control_plane
        self._busy = False
        self._timer: asyncio.TimerHandle | None = None
        self._cut: dict[str, int] = {}  # entry folder -> 400s so far
        # entry folder -> (when it may be tried again, its next pause): a file that
        # failed waits on its own, never in front of the others.
        self._backoff: dict[str, tuple[float, float]] = {}
        self._largest = 0  # the largest file kept so far: what "one more" must fit
        self._flushes: list[tuple[asyncio.Future[None], set[str]]] = []

    async def on_start(self) -> None:
        self._folder.mkdir(parents=True, exist_ok=True)
        self.ref.tell(_Next())

    async def on_stop(self, reason: str) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for waiter, _ in self._flushes:
            if not waiter.done():
                waiter.set_result(None)

    async def receive(self, message: Any) -> Any:
        match message:
            case Wake():
                self._backoff.clear()
                self.ref.tell(_Next())
            case _Next():
                self._start_next()
            case _Done(entry, status, problem):
                self._busy = False
                self._after(entry, status, problem)
            case Flush(within_s, run_id):
                waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                pending = {entry.folder for entry in outbox.entries(self._folder)
                           if run_id is None or entry.run_id == run_id}
                if not pending:
                    waiter.set_result(None)
                else:
                    self._flushes.append((waiter, pending))
                    asyncio.get_running_loop().call_later(within_s, _give_up, waiter)
                return waiter
            case Usage():
                found = outbox.entries(self._folder)
                used = outbox.usage(self._folder)  # with the files children are keeping now
                self._largest = max([self._largest, *(entry.size for entry in found)])
                # Full once the next file like those it keeps would not fit: a child
                # refuses a file past the limit, so "used >= limit" would never hold.
                return used, len(found), used >= self._limit or (bool(found) and used + self._largest > self._limit)
            case _:
                raise TypeError(f"{self.name} got an unknown message {message!r}")
        return None

    def _start_next(self) -> None:
        if self._busy:
            return
        now = time.monotonic()
        found = outbox.entries(self._folder)
        due = [entry for entry in found if self._backoff.get(entry.folder, (0.0, 0.0))[0] <= now]
        if not due:
            waits = [self._backoff[entry.folder][0] for entry in found if entry.folder in self._backoff]
            if waits:
                self._wake_at(min(waits))
            return
        self._busy = True
        entry = due[0]
        self._largest = max(self._largest, entry.size)
        loop = asyncio.get_running_loop()
        loop.run_in_executor(None, _upload, entry, self._control).add_done_callback(
            lambda done: self.ref.tell(_Done(entry, *(done.result() if not done.exception() else
                                                      (0, str(done.exception()))))))

    def _wake_at(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        delay = max(0.0, when - time.monotonic())
        self._timer = asyncio.get_running_loop().call_later(delay, self.ref.tell, _Next())

    def _after(self, entry: outbox.Entry, status: int, problem: str) -> None:
        cuts = self._cut.get(entry.folder, 0) + (status == 400)
        if status == 201:
            outbox.remove(entry)
            log.info("artifact %s of run %s stored on the control plane", entry.path, entry.run_id)
        elif status in _REFUSED_FOR_GOOD:
            outbox.remove(entry)
            log.warning("artifact %s of run %s was refused for good (%s): dropped from the outbox", entry.path,
                        entry.run_id, problem)
        elif (400 <= status < 500 and status not in _MAY_PASS and status != 400) or cuts >= _CUT_TRIES:
            reason = (f"refused {cuts} times: {problem}" if cuts >= _CUT_TRIES else f"refused: {problem}")[:400]
            outbox.remove(entry)
            log.warning("artifact %s of run %s was given up (%s)", entry.path, entry.run_id, reason)
            asyncio.get_running_loop().run_in_executor(None, _report_given_up, entry, self._control, reason)
        else:
            self._cut[entry.folder] = cuts
            _, pause = self._backoff.get(entry.folder, (0.0, _FIRST_PAUSE_S))
            self._backoff[entry.folder] = (time.monotonic() + pause, min(_MAX_PAUSE_S, pause * 2))
            log.warning("artifact %s of run %s not stored yet (%s); again in %.0f s", entry.path, entry.run_id,
                        problem, pause)
            self._settle(entry.folder)
            self.ref.tell(_Next())
            return
        self._cut.pop(entry.folder, None)
        self._backoff.pop(entry.folder, None)
        self._settle(entry.folder)
        self.ref.tell(_Next())

    def _settle(self, folder: str) -> None:
        """A flush waits for each entry it found to have been tried once."""
        for waiter, pending in self._flushes:
            pending.discard(folder)
            if not pending and not waiter.done():
                waiter.set_result(None)
        self._flushes = [(w, p) for w, p in self._flushes if not w.done()]


def _give_up(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _put(entry: outbox.Entry, control: dict[str, Any], body: Any, headers: dict[str, str]) -> tuple[int, str]:
    """One PUT about the entry (blocking: on a thread); the control plane's answer."""
    query = urllib.parse.urlencode({"path": entry.path, "kind": entry.kind, "node": entry.node_id or ""})
    started = time.monotonic()
    try:
        conn = connect(str(control.get("url", "")), control.get("unix_socket"), 60.0, control.get("ca"))
    except OSError as exc:
        return 0, f"the control plane cannot be reached: {exc}"
    try:
        conn.request("PUT", f"/api/runs/{entry.run_id}/artifacts?{query}", body=body, headers={
            **headers, "Authorization": f"Bearer {control.get('credential', '')}"})
        response = conn.getresponse()
        answer = response.read(4096).decode("utf-8", "replace")
        return response.status, f"{response.status} {answer[:200]} after {time.monotonic() - started:.1f} s"
    except (OSError, http.client.HTTPException) as exc:
        return 0, f"the transfer was cut: {exc}"
    finally:
        conn.close()


def _upload(entry: outbox.Entry, control: dict[str, Any]) -> tuple[int, str]:
    try:
        with entry.data.open("rb") as body:
            return _put(entry, control, body, {"Content-Length": str(entry.size), SHA256_HEADER: entry.sha256,
                                               "Content-Type": "application/octet-stream"})
    except FileNotFoundError:
        return 410, "its file is gone from the outbox"


def _report_given_up(entry: outbox.Entry, control: dict[str, Any], reason: str) -> None:
    """Best effort: the row says ``failed`` and why (a header holds ASCII only)."""
    text = " ".join(reason.split()).encode("ascii", "backslashreplace").decode()
    status, answer = _put(entry, control, b"", {"Content-Length": "0", FAILED_HEADER: text})
    if status != 200:
        log.warning("artifact %s of run %s: the control plane was not told it failed (%s)", entry.path,
                    entry.run_id, answer)
