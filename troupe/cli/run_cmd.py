"""``troupe run``: submit a saved graph to the server and follow it."""

from __future__ import annotations

import contextlib
import io
import json
import sys
import time
from collections.abc import Sequence, Set
from datetime import datetime
from pathlib import Path
from typing import Any

from troupe.cli.client import Client, Reopens
from troupe.cli.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, CliError, SubmitRejected
from troupe.cli.files import read_json_object
from troupe.cli.render import Renderer
from troupe.cli.set_params import apply_sets_by_server
from troupe.protocol import events as ev

# The server sends a keepalive every 15 s; a stream silent for longer is gone.
_STREAM_SILENCE_S = 45.0


def submit_and_follow(client: Client, path: str, options: dict[str, Any], name: str | None, detach: bool,
                      timeout: float | None, sets: Sequence[str] = (), form: str = "text") -> int:
    graph = read_json_object(path, "a graph object")
    done = apply_sets_by_server(client, graph, sets)
    if done:
        options = {**options, "params_set": done}
    body: dict[str, Any] = {"graph": graph, "options": {k: v for k, v in options.items() if v is not None}}
    if name:
        body["name"] = name
    return queued(client, client.request("POST", "/api/runs", body), f"Graph           {Path(path).name}", detach,
                  timeout, form)


def rerun_and_follow(client: Client, run_id: str, resume: bool, detach: bool, timeout: float | None,
                     sets: Sequence[str] = (), form: str = "text") -> int:
    """``troupe rerun``: the run queued again (from its newest checkpoint with ``resume``),
    with the params ``sets`` names changed (read against the run's own graph)."""
    run_id = client.full_id("runs", run_id)
    body: dict[str, Any] = {"resume": True} if resume else {}
    if sets:
        status, row = client.request("GET", f"/api/runs/{run_id}")
        if status != 200:
            raise CliError(f"run {run_id}: the server answered {status}: {row}")
        body["params_set"] = apply_sets_by_server(client, dict(row["graph"]), sets)
    answer = client.request("POST", f"/api/runs/{run_id}/rerun", body)
    return queued(client, answer, f"{'Resumes' if resume else 'Again from':<16}{run_id}", detach, timeout, form)


def queued(client: Client, answer: tuple[int, Any], origin: str, detach: bool, timeout: float | None,
           form: str = "text") -> int:
    """Says what was queued and follows it (unless ``detach``). ``form``: ``text``;
    ``quiet``, the id alone (as ``sbatch --parsable``), then the exit code says how it
    ended; ``json``, the submission's answer when detached, else the ended run's row."""
    status, reply = answer
    if status != 201:
        error = (reply or {}).get("error", {}) if isinstance(reply, dict) else {}
        where = f" at {error['pointer']}" if error.get("pointer") else ""
        raise SubmitRejected(f"the server refused the run ({status} {error.get('code', '')}){where}: "
                             f"{error.get('message', reply)}")
    run_id = reply["run_id"]
    if form != "text":
        return _quietly(client, reply, detach, timeout, form)
    print("=== Run submitted ===")
    print(f"  Run ID          {run_id}")
    print(f"  {origin}")
    print(f"  Device          {reply['device']}")
    print(f"  Status          {reply['status']}")
    for warning in reply.get("warnings", []):
        print(f"  ⚠ {warning}")
    print(flush=True)
    if detach:
        return EXIT_OK
    try:
        return follow(client, run_id, reply["queue_key"], timeout, said=frozenset(reply.get("warnings", [])))
    except KeyboardInterrupt:
        print(f"\n  stopped watching; the run goes on on the server ({run_id})", flush=True)
        return EXIT_INTERRUPTED


def _quietly(client: Client, reply: dict[str, Any], detach: bool, timeout: float | None, form: str) -> int:
    run_id = reply["run_id"]
    if form == "quiet":
        print(run_id, flush=True)
    if detach:
        if form == "json":
            print(json.dumps(reply, indent=2))
        return EXIT_OK
    with contextlib.redirect_stdout(io.StringIO()):  # the follow's lines are for people
        try:
            code = follow(client, run_id, reply["queue_key"], timeout)
        except KeyboardInterrupt:
            code = EXIT_INTERRUPTED
    if form == "json":
        status, row = client.request("GET", f"/api/runs/{run_id}")
        print(json.dumps(row if status == 200 else reply, indent=2))
    return code


def follow(client: Client, run_id: str, queue_key: str, timeout: float | None, said: Set[str] = frozenset()) -> int:
    """Prints the run's events until its end; ``said``: the warnings the submission's
    answer printed already (its stream carries them again as events)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    last_position: int | None = None
    after = 0
    renderer = Renderer()  # one line per epoch, whichever connection its metrics came on
    live = LiveLine() if sys.stdout.isatty() else None  # on a terminal: epoch k/n and an ETA, in place
    reopens = Reopens(run_id)
    while True:
        before = after
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return _timed_out(run_id, timeout)
        read_timeout = _STREAM_SILENCE_S if remaining is None else min(_STREAM_SILENCE_S, remaining)
        try:
            for kind, data in client.stream(f"/api/runs/{run_id}/stream?after={after}", read_timeout, deadline):
                if kind == "queue_position":
                    position = data.get("queue_position")
                    if position is not None and position != last_position:
                        print(f"  ○ queued  position {position} on {queue_key}", flush=True)
                        last_position = position
                    continue
                if kind != "run_event":
                    continue
                after = data["seq"]
                if data["type"] == ev.WARNING and data["payload"].get("message") in said:
                    continue
                for line in renderer.feed(data):
                    if live is not None:
                        live.clear()
                    print(line, flush=True)
                if live is not None:
                    live.feed(data)
                if data["type"] == ev.RUN_FINISHED:
                    final = data["payload"].get("status")
                    print(f"\n  Result          {final}", flush=True)
                    return EXIT_OK if final == ev.SUCCEEDED else EXIT_FAILED
                if deadline is not None and time.monotonic() > deadline:
                    return _timed_out(run_id, timeout)
        except TimeoutError:
            if deadline is not None and time.monotonic() >= deadline:
                return _timed_out(run_id, timeout)
            continue  # silence within the deadline: ask again
        # The stream ended without a result (server restart): reconnect from `after`.
        reopens.ended(progressed=after != before)


class LiveLine:
    """A training's place, rewritten in place on a terminal: ``epoch 3/10  ETA 12s``."""

    def __init__(self) -> None:
        self._shown = False
        self._first: tuple[float, int] | None = None

    def feed(self, event: dict[str, Any]) -> None:
        payload = event.get("payload") or {}
        if event["type"] != ev.METRIC or not isinstance(payload.get("epochs"), int):
            return
        epoch, epochs = int(payload.get("epoch") or 0), payload["epochs"]
        # When the epoch happened, not when this terminal read it: attached half way, the
        # past epochs come at once and would make the rest look instant.
        now = _event_time(event)
        if self._first is None:
            self._first = (now, epoch)
        started, first_epoch = self._first
        eta = ""
        if epoch > first_epoch:
            with contextlib.suppress(OverflowError):  # a count of epochs past any float: no ETA
                eta = f"  ETA {(now - started) / (epoch - first_epoch) * (epochs - epoch):.0f}s"
        sys.stdout.write(f"\r\033[K  ⋯ {event.get('node_id')}  epoch {epoch}/{epochs}{eta}")
        sys.stdout.flush()
        self._shown = True

    def clear(self) -> None:
        if self._shown:
            sys.stdout.write("\r\033[K")
            self._shown = False


def _event_time(event: dict[str, Any]) -> float:
    stamp = event.get("ts")
    if isinstance(stamp, str):
        with contextlib.suppress(ValueError):
            return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return time.time()


def _timed_out(run_id: str, timeout: float | None) -> int:
    print(f"\n  stopped waiting after {timeout}s; the run goes on on the server ({run_id})")
    print("  Result          unknown (timed out)", flush=True)
    return EXIT_FAILED
