"""``troupe logs``: what happened to a run, in order, from its events: its start and
end, each node's start, end or failure with the traceback, logs, warnings, console
lines, and its metric points at a rate a person reads (``--metrics``: all of them).

A failure is said once. A node's traceback shows the frames of the code that failed, not
troupe's own (the engine that called it, a built-in node: ``--debug`` shows those), and
not its closing exception text, which the failure's line already says; a command's
error leaves out the tail of its stderr that the console above or below shows; and the
run's end names the node's error by its first line only."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Set
from pathlib import Path
from typing import Any

from troupe.cli.client import Client, Reopens
from troupe.cli.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, BadOption
from troupe.cli.runs_cmd import answer, get_run
from troupe.protocol import events as ev

_LOGGED = frozenset({ev.RUN_STARTED, ev.NODE_STARTED, ev.NODE_FINISHED, ev.NODE_FAILED, ev.NODE_QUEUED, ev.LOG,
                     ev.WARNING, ev.CONSOLE, ev.METRIC, ev.RUN_FINISHED})
POINTS_A_SERIES = 20  # metric points shown per series (--metrics: all): the first, then evenly spread
# troupe's own packages: a frame in one of them is troupe's (shown under --debug only)
_OURS = ("troupe",)  # every package of ours lives under troupe/
_ROOT = Path(__file__).resolve().parents[2]
_FRAME = re.compile(r'  File "(.*)", line \d+')


def logs(client: Client, run_id: str, follow_live: bool, tail: int | None, console_only: bool,
         as_json: bool = False, every_metric: bool = False, every_event: bool = False, debug: bool = False) -> int:
    """What happened, in order: the run's start and end, each node's start, end or
    failure (with its traceback), logs, warnings, console lines and metric points at a
    readable rate (``every_metric``: all); or the console alone; or (``every_event``)
    every event the run has. ``as_json``: each event as the API gives it, one a line.
    ``debug``: tracebacks with troupe's own frames."""
    if every_event and console_only:
        raise BadOption("--all shows every event and --console only what the run printed; give one of them")
    run_id = client.full_id("runs", run_id)
    get_run(client, run_id)
    kinds = {ev.CONSOLE} if console_only else ev.VOCABULARY if every_event else _LOGGED
    every_metric = every_metric or every_event
    view = _View(console_only, as_json, debug)
    try:
        if follow_live:
            return _follow(client, run_id, kinds, _Rate(None if every_metric else 1.0), view)
        found = [e for e in _all_events(client, run_id) if e["type"] in kinds]
        if not every_metric:
            found = _thinned(found)
        for event in found[-tail:] if tail else found:
            view.write(event)
        return EXIT_OK
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _follow(client: Client, run_id: str, kinds: Set[str], rate: _Rate, view: _View) -> int:
    """Until the run's end, whose status gives the exit code. A stream cut before it (a
    proxy, a restart) is opened again after the last event shown; a server gone is a
    one-line error (exit 1), never an exit 0 that a script would read as the run's end."""
    after, reopens = 0, Reopens(run_id)
    while True:
        before = after
        for kind, data in client.stream(f"/api/runs/{run_id}/stream?after={after}", read_timeout=None):
            if kind != "run_event":
                continue
            after = data["seq"]
            if data["type"] in kinds and rate.shows(data):
                view.write(data)
            if data["type"] == ev.RUN_FINISHED:
                return EXIT_OK if data["payload"].get("status") == ev.SUCCEEDED else EXIT_FAILED
        reopens.ended(progressed=after != before)


def _thinned(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each series' points cut to ``POINTS_A_SERIES``, evenly spread, its last kept."""
    by_series: dict[str, list[int]] = {}
    for index, event in enumerate(events):
        if event["type"] == ev.METRIC:
            by_series.setdefault(str(event["payload"].get("name")), []).append(index)
    dropped: set[int] = set()
    for indexes in by_series.values():
        if len(indexes) > POINTS_A_SERIES:
            stride = (len(indexes) - 1) / (POINTS_A_SERIES - 1)
            kept = {indexes[round(i * stride)] for i in range(POINTS_A_SERIES)}
            dropped.update(set(indexes) - kept)
    return [event for index, event in enumerate(events) if index not in dropped]


class _Rate:
    """Live: a series' point at most once a ``seconds`` (its last one when the run ends is
    in its metrics); None: every point."""

    def __init__(self, seconds: float | None) -> None:
        self._seconds = seconds
        self._last: dict[str, float] = {}

    def shows(self, event: dict[str, Any]) -> bool:
        if event["type"] != ev.METRIC or self._seconds is None:
            return True
        name, now = str(event["payload"].get("name")), time.monotonic()
        if now - self._last.get(name, -1e9) < self._seconds:
            return False
        self._last[name] = now
        return True


def _all_events(client: Client, run_id: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    after: int | None = 0
    while after is not None:
        page = answer(client.request("GET", f"/api/runs/{run_id}/events?after={after}"), "events")
        events += page["events"]
        after = page["next_cursor"]
    return events


class _View:
    """How events are written: the console alone, JSON, or lines; and which nodes'
    failures were said already (the run's end then names its error by its first line)."""

    def __init__(self, console_only: bool, as_json: bool, debug: bool) -> None:
        self.console_only, self.as_json, self.debug = console_only, as_json, debug
        self.failed_shown: set[str | None] = set()

    def write(self, event: dict[str, Any]) -> None:
        payload = event["payload"]
        if self.as_json:
            print(json.dumps(event), flush=True)
            return
        if event["type"] == ev.CONSOLE:
            text = payload.get("text", "")
            if self.console_only:
                (sys.stderr if payload.get("stream") == "stderr" else sys.stdout).write(text)
            else:
                mark = "err" if payload.get("stream") == "stderr" else "out"
                for line in text.splitlines():
                    print(f"[{mark}] {line}")
        elif event["type"] == ev.LOG:
            print(f"[log] {event.get('node_id') or ''}  {payload.get('message', '')}".replace("]  ", "] "))
        elif event["type"] == ev.WARNING:
            print(f"[warning] {payload.get('message', '')}")
        elif event["type"] == ev.NODE_FAILED:
            print(self._failed(event))
        elif event["type"] == ev.RUN_FINISHED and payload.get("error") and payload.get("node_id") in self.failed_shown:
            print(f"[run] {payload.get('status')}: {str(payload['error']).split(chr(10))[0]}")
        else:
            print(_event_line(event))
        sys.stdout.flush()

    def _failed(self, event: dict[str, Any]) -> str:
        """The node's error (less the tail of a command's stderr, which its console holds),
        then its traceback's frames."""
        payload = event["payload"]
        self.failed_shown.add(event.get("node_id"))
        error = str(payload.get("error") or "")
        echoed = payload.get("console_tail_lines")
        if isinstance(echoed, int) and 0 < echoed < len(lines := error.split("\n")):
            error = "\n".join(lines[:-echoed])
        trace = _frames(str(payload.get("traceback") or ""), error, self.debug)
        return f"[failed] {event.get('node_id') or ''}: {error}" + (f"\n{trace}" if trace else "")


def _frames(trace: str, error: str, debug: bool) -> str:
    """A traceback's frames without its closing exception text (the error, said on the
    line above): only those outside troupe's own code, unless ``debug``; nothing when
    none is left."""
    message = error.partition(": ")[2].split("\n")[0]
    at = trace.rfind(message) if message else len(trace.rstrip())  # no words: the closing line is the type
    if at < 0:  # cut to its last 4000 characters inside a long message: no frame is left
        return ""
    head = trace[:at].rsplit("\n", 1)[0].rstrip()  # less the line the closing text starts on
    if debug:
        return head
    kept: list[str] = []
    keeping = False
    for line in head.split("\n"):
        found = _FRAME.match(line)
        if found is not None:
            keeping = not _ours(found.group(1))
        elif not line.startswith("    "):
            keeping = False  # a chained exception's words: said with the frames they belong to, under --debug
        if keeping:
            kept.append(line)
    return "\n".join(["Traceback (most recent call last):", *kept]) if kept else ""


def _ours(path: str) -> bool:
    """A file of troupe's own packages, here or on the machine that ran the node (the
    same file below one of their names)."""
    parts = Path(path).parts
    for index in range(len(parts) - 1, -1, -1):
        if parts[index] in _OURS:
            below = Path(*parts[index:])
            return (_ROOT / below).is_file() or (_ROOT.parent / below).is_file()
    return False


def _event_line(event: dict[str, Any]) -> str:
    kind, node, payload = event["type"], event.get("node_id") or "", event["payload"]
    if kind == ev.METRIC:
        where = f" epoch {payload['epoch']}/{payload['epochs']}" if payload.get("epochs") else ""
        return f"[metric] {node} {payload.get('name')}={payload.get('value')} step {payload.get('step')}{where}"
    if kind == ev.NODE_FINISHED:
        took = payload.get("duration_s")
        return f"[node] {node} finished" + (f" in {took:.2f}s" if isinstance(took, int | float) else "")
    if kind == ev.RUN_FINISHED:
        error = payload.get("error")
        return f"[run] {payload.get('status')}" + (f": {error}" if error else "")
    if kind == ev.RUN_STARTED:
        worker = f" ({payload['worker']})" if payload.get("worker") else ""
        return f"[run] started on {payload.get('device')}{worker}"
    if kind == ev.NODE_QUEUED:
        return f"[node] {node} waits: {payload.get('reason') or ''}"
    if kind == ev.RUN_QUEUED:
        return f"[run] queued on {payload.get('queue_key')}"
    if kind in (ev.ARTIFACT, ev.ARTIFACT_PENDING, ev.ARTIFACT_REMOVED):
        state = {ev.ARTIFACT: "stored", ev.ARTIFACT_PENDING: "waits on its worker"}.get(kind, "let go (bounds)")
        return f"[artifact] {node} {payload.get('kind') or 'file'} {payload.get('path')} {state}"
    if kind == ev.PROVENANCE:
        return f"[read] {node} {payload.get('kind') or 'file'} {payload.get('ref')}"
    if kind != ev.NODE_STARTED:  # one this terminal does not know yet: its type and payload
        return " ".join(part for part in (f"[{kind}]", node, json.dumps(payload)) if part)
    return f"[node] {node} started"
