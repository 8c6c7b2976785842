"""A run, a sweep and a study as a notebook holds them: the record the server answered
(the same pydantic models it answers with, ``troupe.protocol.api`` and ``troupe.protocol.replies``)
and the verbs that act on it. A handle is a snapshot: ``refresh()`` (or ``wait()``)
reads it again."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from troupe.client._errors import Timeout, Unreachable
from troupe.client._follow import FINISHED, away, follow_run, run_events
from troupe.protocol.api import Event, RunDetail, RunRow
from troupe.protocol.replies import MetricPoint, StudyDetail, SweepDetail
from troupe.protocol.replies_runs import Fingerprint

if TYPE_CHECKING:
    from troupe.client._client import Client

FINAL = frozenset({"succeeded", "failed", "cancelled", "interrupted"})
_POLL_S = (0.05, 0.1, 0.2, 0.5, 1.0)  # a sweep's or a study's state, read again at these paces


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class Run:
    """One run. ``record``: its row as last read (a ``RunDetail`` once read alone, a
    ``RunRow`` from a list), read on first use; ``ok``: it succeeded."""

    def __init__(self, client: Client, record: RunRow | None = None, *, run_id: str | None = None,
                 status: str | None = None) -> None:
        self._client = client
        self._record = record
        self._id = record.id if record is not None else str(run_id)
        self._status = status  # heard from the server since the record was read (its end)

    def __repr__(self) -> str:
        return f"<Run {self.id[:12]} {self.name or ''} {self.status}>".replace("  ", " ")

    @property
    def record(self) -> RunRow:
        return self._record if self._record is not None else self.detail()

    @property
    def id(self) -> str:
        return self._id

    @property
    def name(self) -> str | None:
        return self.record.name

    @property
    def status(self) -> str:
        return self._status if self._status is not None else self.record.status

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"

    @property
    def done(self) -> bool:
        return self.status in FINAL

    def refresh(self) -> Run:
        self.detail()
        return self

    def detail(self) -> RunDetail:
        """Its whole record, read now (graph, options, artifacts, seed...)."""
        found = RunDetail.model_validate(self._client.http.request("GET", f"/api/runs/{self.id}"))
        self._record, self._status = found, None
        return found

    def wait(self, timeout: float | None = None) -> Run:
        """Returns once the run has ended, however it ended (``ok`` says); raises
        ``troupe.Timeout`` past ``timeout`` seconds, and the run goes on. It reads the
        run's stream to its end: nothing is polled, and the end is known as it happens."""
        if self._status in FINAL:
            return self
        for event in run_events(self._client.http, self.id, deadline=_deadline(timeout)):
            if event.get("type") == FINISHED:
                self._record, self._status = None, str((event.get("payload") or {}).get("status"))
                return self
        if not self.refresh().done:  # the deadline came first (or the stream gave out)
            raise Timeout(f"run {self.id}", float(timeout or 0), self.status)
        return self

    def follow(self, after: int = 0, timeout: float | None = None) -> Iterator[Event]:
        """The run's events as they happen (the stored ones after ``after`` first), to
        its end. A cut connection is resumed from the last event (``Last-Event-ID``):
        nothing is seen twice or missed."""
        return follow_run(self._client.http, self.id, after=after, deadline=_deadline(timeout))

    def events(self, after: int = 0) -> list[Event]:
        """The events stored so far, after ``after``, every page read."""
        found: list[Event] = []
        cursor: int | None = after
        while cursor is not None:
            page = self._client.http.request("GET", f"/api/runs/{self.id}/events", params={"after": cursor})
            found.extend(Event.model_validate(e) for e in page["events"])
            cursor = page.get("next_cursor")
        return found

    def metrics(self) -> dict[str, list[MetricPoint]]:
        """Each series by name, its points in step order (step, value, ts)."""
        body = self._client.http.request("GET", f"/api/runs/{self.id}/metrics")
        return {name: sorted((MetricPoint.model_validate(p) for p in points), key=lambda p: p.step)
                for name, points in body["series"].items()}

    def metrics_frame(self) -> Any:
        """The points as a pandas DataFrame in long form (series, step, value, ts)."""
        from troupe.client._frames import metrics_frame

        return metrics_frame(self.metrics())

    def logs(self) -> list[str]:
        """What its nodes logged (``log`` events), in order."""
        return [str(e.payload.get("message", e.payload.get("line", ""))) for e in self.events() if e.type == "log"]

    def console(self) -> str:
        """The console a command or a script printed, whole."""
        text, offset = [], 0
        while True:
            page = self._client.http.request("GET", f"/api/runs/{self.id}/console", params={"offset": offset})
            text.append(page["text"])
            if page["next_offset"] >= page["size"] or not page["text"]:
                return "".join(text)
            offset = page["next_offset"]

    def cancel(self) -> Run:
        self._client.http.request("POST", f"/api/runs/{self.id}/cancel")
        return self.refresh()

    def rerun(self, resume: bool = False, set: Mapping[str, Any] | None = None, *, wait: bool = False,
              timeout: float | None = None) -> Run:
        """The run made again (``resume``: from its newest checkpoint), with ``set``
        changing params first (``"NODE.PARAM"`` -> value)."""
        body: dict[str, Any] = {"resume": resume}
        if set:
            body["params_set"] = dict(set)
        created = self._client.http.request("POST", f"/api/runs/{self.id}/rerun", body)
        again = self._client.get(created["run_id"])
        return again.wait(timeout) if wait else again

    def tag(self, *tags: str, replace: bool = False) -> Run:
        """Adds ``tags`` (or, with ``replace``, makes them the whole set)."""
        kept = [] if replace else list(self.detail().tags)
        self._client.http.request("PATCH", f"/api/runs/{self.id}", {"tags": sorted({*kept, *tags})})
        return self.refresh()

    def note(self, text: str | None) -> Run:
        self._client.http.request("PATCH", f"/api/runs/{self.id}", {"note": text})
        return self.refresh()

    def artifacts(self) -> list[Any]:
        """Its files (checkpoints, recorded outputs...): each with ``id``, ``path``,
        ``kind``, ``size`` and ``sha256``, as the run's record lists them."""
        return list(self.detail().artifacts)

    def fingerprint(self, against: Run | str | None = None) -> Fingerprint:
        """What executed it (the code its commands ran, its packs, the interpreter...);
        ``against`` another run: also ``against.differs``, each field that differs
        (``code.train.files.train.py.sha256`` -> this and other)."""
        params = {"against": str(getattr(against, "id", against))} if against is not None else None
        return Fingerprint.model_validate(self._client.http.request("GET", f"/api/runs/{self.id}/fingerprint",
                                                                    params=params))

    def download(self, artifact: Any, to: str | Path) -> Path:
        """Writes one artifact (its id, or an entry of ``artifacts()``) to ``to`` (a
        folder keeps the artifact's own file name) and returns the path written."""
        artifact_id = str(getattr(artifact, "id", artifact))
        target = Path(to)
        if target.is_dir():
            entry = next((a for a in self.artifacts() if str(a.id) == artifact_id), None)
            target = target / Path(entry.path if entry is not None else artifact_id).name
        self._client.http.download(f"/api/runs/{self.id}/artifacts/{artifact_id}", target)
        return target


class _Group:
    """What a sweep and a study share: a record read again until it ends."""

    _path = ""
    _what = ""
    _model: type[SweepDetail] | type[StudyDetail]
    _going: frozenset[str] = frozenset({"running"})

    def __init__(self, client: Client, record: Any) -> None:
        self._client = client
        self.record = record

    def refresh(self) -> Self:
        self.record = self._model.model_validate(self._client.http.request("GET", f"/api/{self._path}/{self.id}"))
        return self

    @property
    def id(self) -> str:
        raise NotImplementedError

    @property
    def state(self) -> str:
        return str(self.record.state)

    @property
    def done(self) -> bool:
        return self.state not in self._going

    def wait(self, timeout: float | None = None) -> Self:
        """Returns once it has ended; raises ``troupe.Timeout`` past ``timeout``. A server
        that answers nothing (a restart) is waited for as a run's wait waits for it."""
        deadline = _deadline(timeout)
        pace = iter(_POLL_S)
        away_since: float | None = None
        while True:
            try:
                if self.refresh().done:
                    return self
                away_since = None
            except Unreachable as exc:
                away_since = away(exc, away_since)
            left = _left(deadline)
            if left == 0.0:
                raise Timeout(f"{self._what} {self.id}", float(timeout or 0), self.state)
            pause = next(pace, _POLL_S[-1])
            time.sleep(pause if left is None else min(pause, left))

    def cancel(self) -> Self:
        self._client.http.request("POST", f"/api/{self._path}/{self.id}/cancel")
        return self.refresh()

    @property
    def ranking(self) -> list[Any]:
        raise NotImplementedError

    @property
    def best(self) -> Any:
        """The first of ``ranking``: the best variant so far, or None."""
        return next(iter(self.ranking), None)


class Sweep(_Group):
    """One sweep. ``ranking``: its variants best first (by its objective); ``best``: the first."""

    _path, _what, _model = "sweeps", "sweep", SweepDetail
    _going = frozenset({"running", "cancelling"})
    record: SweepDetail

    def __repr__(self) -> str:
        return f"<Sweep {self.id[:12]} {self.state} {len(self.record.variants)} variants>"

    @property
    def id(self) -> str:
        return self.record.sweep_id

    def runs(self) -> list[Run]:
        return self._client.runs(sweep=self.id)

    @property
    def ranking(self) -> list[Any]:
        ranked = [v for v in self.record.variants if v.rank is not None]
        return sorted(ranked, key=lambda v: v.rank)


class Study(_Group):
    """One study. ``ranking``: its variants best first (mean of their repeats, by its
    objective); ``best``: the first; ``resume(budget)`` raises a halted study's budget."""

    _path, _what, _model = "studies", "study", StudyDetail
    record: StudyDetail

    def __repr__(self) -> str:
        return f"<Study {self.id[:12]} {self.state}>"

    @property
    def id(self) -> str:
        return self.record.id

    def runs(self) -> list[Run]:
        return self._client.runs(study=self.id)

    @property
    def ranking(self) -> list[Any]:
        return list(self.record.ranking)

    def resume(self, budget: Mapping[str, Any]) -> Study:
        """Goes on with a raised budget (``{"max_runs": 12}``...)."""
        self._client.http.request("POST", f"/api/studies/{self.id}/resume", {"budget": dict(budget)})
        return self.refresh()
