"""``troupe ls / show / attach / logs / cancel / wait / rm``: the runs the server holds,
from a terminal, through the same client and session as ``troupe run``.

Human output is an aligned table or a short block; ``--json`` prints the API's own
objects as one document. Exit codes are ``troupe run``'s: 0 ok; 1 a run failed, was
cancelled or interrupted, or the command could not do what was asked; 130 Ctrl+C, which
only stops following.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from troupe.cli import code_facts
from troupe.cli.client import Client
from troupe.cli.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, BadOption, CliError
from troupe.cli.render import printable, size_text
from troupe.cli.run_cmd import follow
from troupe.protocol import events as ev
from troupe.protocol.errors import WhereInvalid
from troupe.protocol.where import parse as parse_where

TERMINAL = ev.TERMINAL_STATES
# In the order a run goes through them, as ``ls --status`` lists them.
STATES = (ev.QUEUED, ev.RUNNING, ev.SUCCEEDED, ev.FAILED, ev.CANCELLED, ev.INTERRUPTED, ev.DISCONNECTED)


# Refusals that are the command line's own mistake (a filter that does not read, a key
# no run has): exit 2, as a bad option is.
USAGE_CODES = frozenset({"where_invalid", "where_unknown_key"})


def answer(reply: tuple[int, Any], what: str) -> Any:
    """The body of a 2xx reply, or a CliError saying what the server refused and why."""
    status, body = reply
    if 200 <= status < 300:
        return body
    error = body.get("error", {}) if isinstance(body, dict) else {}
    if error.get("code") in USAGE_CODES:  # the terminal's own way to list the keys
        raise BadOption(f"{what}: {str(error.get('message')).replace('GET /api/runs/keys', 'troupe ls --keys')}")
    raise CliError(f"{what}: the server answered {status} {error.get('code', '')}: {error.get('message', body)}")


def checked_where(where: str | None) -> str | None:
    """``--where`` read as the server reads it, so a malformed filter is said (exit 2)
    before anything is asked; a key no run has is the server's to say."""
    if where is None or not where.strip():
        return None
    try:
        parse_where(where)
    except WhereInvalid as exc:
        raise BadOption(f"--where: {exc.message}") from None
    return where


def table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    """An aligned table, its last column left to run on."""
    shown = [[printable(cell) for cell in row] for row in [header, *rows]]
    widths = [max(len(r[i]) for r in shown) for i in range(len(header) - 1)]
    lines = []
    for row in shown:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(lines)


def age(stamp: str | None) -> str:
    if not stamp:
        return "-"
    seconds = (datetime.now(UTC) - datetime.fromisoformat(stamp.replace("Z", "+00:00"))).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


def duration(row: dict[str, Any]) -> str:
    if not row.get("started_at"):
        return "-"
    start = datetime.fromisoformat(row["started_at"].replace("Z", "+00:00"))
    end = datetime.fromisoformat(row["finished_at"].replace("Z", "+00:00")) if row.get("finished_at") \
        else datetime.now(UTC)
    seconds = max(0.0, (end - start).total_seconds())
    return f"{seconds:.1f}s" if seconds < 60 else f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def status_of(row: dict[str, Any]) -> str:
    if row["status"] == ev.QUEUED and row.get("queue_position"):
        return f"queued #{row['queue_position']}"
    return str(row["status"])


@dataclass(frozen=True)
class Listing:
    """What ``troupe ls`` asks for and how it prints it."""

    status: str | None = None  # one status, or several joined by commas
    sweep: str | None = None
    study: str | None = None
    search: str | None = None
    tag: str | None = None
    limit: int = 50
    cursor: str | None = None  # where an earlier page ended (``next page:`` on stderr)
    form: str = "table"  # "table", "json" (the API's objects) or "ids" (one a line)
    full: bool = False  # whole ids (the table shows 8 characters; any unique 4 name a run)
    sort: str | None = None  # a metric series: by its newest value, lowest first
    descending: bool = False
    params: bool = False  # a column per swept param (the runs of one sweep)
    mine: bool = False  # only the runs this login submitted
    where: str | None = None  # a filter in the where grammar (troupe/protocol/where.py)


def list_query(client: Client, asked: Listing) -> dict[str, str]:
    """The query of ``GET /api/runs`` that ``asked`` means, its usage mistakes said first."""
    unknown = [] if asked.status is None else [s for s in asked.status.split(",") if s not in ev.ALL_STATES]
    if unknown:  # a usage mistake, said before anything is asked of the server
        raise BadOption(f"--status takes {', '.join(STATES)}, or several joined by commas; "
                        f"{', '.join(repr(s) for s in unknown)} is none of them")
    where = checked_where(asked.where)
    return {k: v for k, v in (("status", asked.status), ("sweep_id", asked.sweep and client.full_id(
        "sweeps", asked.sweep)), ("study_id", asked.study and client.full_id("studies", asked.study)),
        ("q", asked.search), ("tag", asked.tag), ("limit", str(asked.limit)), ("cursor", asked.cursor),
        ("sort", asked.sort and ("-" if asked.descending else "") + asked.sort),
        ("mine", "true" if asked.mine else None), ("where", where)) if v}


def list_runs(client: Client, asked: Listing) -> int:
    query = list_query(client, asked)
    reply = answer(client.request("GET", f"/api/runs?{urllib.parse.urlencode(query)}"), "listing runs")
    if asked.form != "table":
        print(json.dumps(reply, indent=2) if asked.form == "json" else "\n".join(r["id"] for r in reply["runs"]))
        return EXIT_OK
    runs = reply["runs"]
    if not runs:
        print("no runs" + (" match" if query.keys() - {"limit"} else " yet"))
        return EXIT_OK
    wide = shutil.get_terminal_size((120, 24)).columns >= WIDE_COLUMNS
    rows = [_ls_row(r, asked.full, wide) for r in runs]
    header = (["ID", "NAME", "STATUS", "WHERE", "BY", "STARTED", "TOOK", "LEFT", "LOSS", "PROGRESS / WAITS FOR"]
              if wide else ["ID", "STATUS", "LEFT", "LOSS", "PROGRESS / WAITS FOR"])
    extra_header, extra = _extra_columns(client, asked, runs)
    rows = [[*row[:-1], *more, row[-1]] for row, more in zip(rows, extra, strict=True)]
    print(table(rows, [*header[:-1], *extra_header, header[-1]]))
    if reply.get("next_cursor"):
        print(f"next page: troupe ls --cursor {reply['next_cursor']}", file=sys.stderr)
    return EXIT_OK


def _extra_columns(client: Client, asked: Listing, runs: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The sorting metric's value, and with ``params`` a column per swept param."""
    header: list[str] = []
    columns: list[list[str]] = [[] for _ in runs]
    if asked.sort:
        header.append(asked.sort.upper())
        for row, run in zip(columns, runs, strict=True):
            value = run.get("sort_value")
            row.append("-" if value is None else f"{value:.4g}")
    if asked.params:
        swept: dict[str, dict[str, Any]] = {}
        for sweep_id in sorted({r["sweep_id"] for r in runs if r.get("sweep_id")}):
            for variant in answer(client.request("GET", f"/api/sweeps/{sweep_id}"), f"sweep {sweep_id}")["variants"]:
                swept[variant["run_id"]] = variant["params"]
        names = sorted({name for params in swept.values() for name in params})
        header += names
        for row, run in zip(columns, runs, strict=True):
            row += [json.dumps(swept.get(run["id"], {}).get(name)) if name in swept.get(run["id"], {}) else "-"
                    for name in names]
    return header, columns


WIDE_COLUMNS = 100  # below this, ls leaves out name, place and times: 80 columns hold the rest
_SHORT = 8


def _ls_row(run: dict[str, Any], full: bool, wide: bool) -> list[str]:
    short = run["id"] if full else run["id"][:_SHORT]
    reason = (run.get("queue_reason") or {}).get("message")
    last = reason or _progress(run)
    if wide:
        return [short, (run.get("name") or "")[:24], run["status"], run.get("queue_key") or run.get("device") or "",
                (run.get("submitted_label") or "-")[:20], age(run.get("started_at")), duration(run), time_left(run),
                _loss(run), last]
    return [short, run["status"], time_left(run), _loss(run), last[:40]]


def _progress(row: dict[str, Any]) -> str:
    progress = row.get("progress") or {}
    return f"epoch {progress['epoch']}/{progress['epochs']}" if progress.get("epochs") else "-"


def time_left(row: dict[str, Any]) -> str:
    """From the run's own timestamps (its first and newest epoch), so a terminal that
    looks in half way sees what is left, not what it has watched."""
    progress = row.get("progress") or {}
    if row["status"] != ev.RUNNING or not progress.get("epochs") or progress.get("epoch") is None:
        return "-"
    done = int(progress["epoch"]) - int(progress.get("first_epoch") or 0)
    if done <= 0 or not progress.get("first_at") or not progress.get("at"):
        return "-"
    first, newest = _when(progress["first_at"]), _when(progress["at"])
    per_epoch = (newest - first).total_seconds() / done
    try:
        left = per_epoch * (int(progress["epochs"]) - int(progress["epoch"]))
    except OverflowError:  # a count of epochs past any float: no time left to say
        return "-"
    left -= (datetime.now(UTC) - newest).total_seconds()
    return _seconds(max(0.0, left))


def _when(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _seconds(seconds: float) -> str:
    return f"{seconds:.0f}s" if seconds < 60 else f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def _loss(row: dict[str, Any]) -> str:
    """The newest loss; while the run goes on it is its last so far, not its final."""
    value = f"{row['final_loss']:.4g}" if row.get("final_loss") is not None else row.get("final_loss_non_finite")
    if value is None:
        return "-"
    return f"{value} (last)" if row["status"] in ev.ACTIVE_STATES else str(value)


def get_run(client: Client, run_id: str) -> dict[str, Any]:
    return answer(client.request("GET", f"/api/runs/{run_id}"), f"run {run_id}")


def show_run(client: Client, run_id: str, as_json: bool, all_artifacts: bool = False) -> int:
    """``all_artifacts``: every file it keeps, checkpoints too (else they are one line)."""
    run_id = client.full_id("runs", run_id)
    run = get_run(client, run_id)
    if as_json:
        print(json.dumps(run, indent=2))
        return EXIT_OK
    # A resumed run reads as one training: the runs it goes on from give the steps before it.
    lineage = "?lineage=true" if run.get("resumed_from") else ""
    metrics = answer(client.request("GET", f"/api/runs/{run_id}/metrics{lineage}"), "metrics")["series"]
    facts = [("Run", run["id"]), ("Name", run.get("name") or ""), ("Status", status_of(run))]
    if (run.get("queue_reason") or {}).get("message"):
        facts.append(("Waits for", run["queue_reason"]["message"]))
    if run.get("tags"):
        facts.append(("Tags", " ".join(run["tags"])))
    if run.get("note"):
        facts.append(("Note", run["note"]))
    if run.get("error"):
        facts.append(("Error", run["error"]))
    target = (run.get("options") or {}).get("target")
    facts += [("Where", run.get("queue_key") or run["device"]), ("Worker", run.get("worker") or "this server")]
    if target:
        facts.append(("Target", json.dumps(target)))
    if (run.get("options") or {}).get("params_set"):
        facts.append(("Set", ", ".join(f"{k}={json.dumps(v)}" for k, v in run["options"]["params_set"].items())))
    if run.get("seed") is not None:
        facts.append(("Seed", f"{run['seed']}{' (deterministic)' if run.get('deterministic') else ''}"))
    facts += [("Created", f"{run['created_at']} ({age(run['created_at'])})"), ("Duration", duration(run))]
    for key, label in (("sweep_id", "Sweep"), ("rerun_of", "Made again from")):
        if run.get(key):
            facts.append((label, run[key]))
    if run.get("reruns"):
        facts.append(("Made again as", ", ".join(run["reruns"])))
    if run.get("resumed_from"):
        facts.append(("Resumes", _chain(client, run)))
    if run.get("resume_point"):
        facts.append(("Can be resumed", f"from epoch {run['resume_point']['epoch']}, {run['resume_point']['until']}"))
    facts += code_facts.code_lines(run.get("execution_facts"))  # the files its commands ran, its folder packs
    if (checkpoints := code_facts.checkpoint_line(run.get("checkpoints"))) is not None:
        facts.append(("Checkpoints", checkpoints))
    width = max(len(k) for k, _ in facts)
    print("\n".join(f"  {k.ljust(width)}  {_fact(v)}" for k, v in facts))
    params = [(n["id"], n["type"], json.dumps(n.get("params") or {})) for n in run.get("graph", {}).get("nodes", [])]
    if params:
        print("\n  Nodes\n" + _indent(table([list(p) for p in params], ["ID", "TYPE", "PARAMS"])))
    logged = [[kind, key, value] for kind, field in (("param", "logged_params"), ("tag", "logged_tags"))
              for key, value in (run.get(field) or {}).items()]
    if logged:  # what the script logged itself (MLflow's log_param, set_tag)
        print("\n  Logged by the script\n" + _indent(table(logged, ["KIND", "NAME", "VALUE"])))
    if metrics:
        rows = [[name, str(len(points)), _last(points)] for name, points in metrics.items()]
        title = "Metrics, with the runs it resumes" if lineage else "Metrics"
        print(f"\n  {title}\n" + _indent(table(rows, ["SERIES", "POINTS", "LAST"])))
    listed = [a for a in run.get("artifacts") or ()
              if all_artifacts or a.get("kind") not in code_facts.CHECKPOINT_KINDS]
    if listed:
        rows = [[a.get("kind", ""), a["path"], a.get("state", "stored"), size_text(a.get("size")),
                 (a.get("sha256") or "")[:16] or (a.get("reason") or "")] for a in listed]
        print("\n  Artifacts\n" + _indent(table(rows, ["KIND", "PATH", "STATE", "SIZE", "SHA256"])))
    return EXIT_OK


def _fact(text: Any) -> str:
    """A fact's text with its control characters written out, line by line: a fact of
    several lines (the runs a resumed run goes on from, a note) keeps its line breaks."""
    return "\n".join(printable(line) for line in str(text).split("\n"))


def _chain(client: Client, run: dict[str, Any], longest: int = 20) -> str:
    """The runs a resumed run goes on from, newest first: one training, several records."""
    links: list[str] = []
    while run.get("resumed_from") and len(links) < longest:
        point = run["resumed_from"]
        links.append(f"{point['run_id']} from epoch {point['epoch']} (sha256 {point['sha256'][:12]})")
        status, run = client.request("GET", f"/api/runs/{point['run_id']}")
        if status != 200:
            break
    return ",\n    which resumes ".join(links)


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())


def _last(points: list[dict[str, Any]]) -> str:
    last = points[-1]
    value = last.get("value")
    return f"{value:.6g} (step {last['step']})" if value is not None else f"{last.get('non_finite')}"


def attach(client: Client, run_id: str, timeout: float | None) -> int:
    run_id = client.full_id("runs", run_id)
    run = get_run(client, run_id)
    print(f"  Run ID          {run['id']}\n  Status          {status_of(run)}", flush=True)
    try:
        return follow(client, run_id, run.get("queue_key") or run["device"], timeout)
    except KeyboardInterrupt:
        print(f"\n  stopped watching; the run goes on on the server ({run_id})", flush=True)
        return EXIT_INTERRUPTED


CANCEL_WAIT_S = 30.0  # longer than a worker's and a command's kill grace (10 s, 5 s)


def cancel(client: Client, run_ids: Sequence[str], as_json: bool = False) -> int:
    """Asks every run to stop, then prints the state each went to: a running run stops
    at its node's next check, so the server's answer (still ``running``) is not it. A
    run still going after ``CANCEL_WAIT_S`` is said so, exit 1."""
    code = EXIT_OK
    answers: list[dict[str, Any]] = []
    for run_id in client.full_ids("runs", run_ids):
        status, body = client.request("POST", f"/api/runs/{run_id}/cancel")
        answers.append({"id": run_id, **(body if isinstance(body, dict) else {"error": body})})
        if status == 200:
            answers[-1]["status"] = body["status"]  # what a troupe server answers, never any 200
        else:
            error = body.get("error", {}) if isinstance(body, dict) else {}
            print(f"troupe: {run_id}: {error.get('message', body)}", file=sys.stderr)
            code = EXIT_FAILED
    deadline = time.monotonic() + CANCEL_WAIT_S
    for answer_of in answers:
        if "error" in answer_of:
            continue
        if answer_of["status"] not in TERMINAL:
            answer_of["status"] = _ended_as(client, answer_of["id"], deadline)
        if answer_of["status"] not in TERMINAL:
            print(f"troupe: {answer_of['id']} is still {answer_of['status']} {CANCEL_WAIT_S:.0f}s after it was "
                  "asked to stop; troupe wait ID follows it to its end", file=sys.stderr)
            code = EXIT_FAILED
        elif not as_json:
            print(f"{answer_of['id']}  {answer_of['status']}" + ("  (asked before)" if answer_of.get("repeat") else ""))
    if as_json:
        print(json.dumps({"runs": answers}, indent=2))
    return code


def _ended_as(client: Client, run_id: str, deadline: float) -> str:
    """The status the run ended with, from its stream (after its newest event), or its
    row's status when ``deadline`` passed first or the stream ended before the run did."""
    events = answer(client.request("GET", f"/api/runs/{run_id}/events?tail=1"), f"run {run_id}")["events"]
    if events and events[-1]["type"] == ev.RUN_FINISHED:
        return str(events[-1]["payload"].get("status"))
    after = events[-1]["seq"] if events else 0
    try:
        for kind, data in client.stream(f"/api/runs/{run_id}/stream?after={after}", deadline=deadline):
            if kind == "run_event" and data["type"] == ev.RUN_FINISHED:
                return str(data["payload"].get("status"))
    except TimeoutError:
        pass
    return str(get_run(client, run_id)["status"])


def remove(client: Client, run_ids: Sequence[str]) -> int:
    code = EXIT_OK
    for run_id in client.full_ids("runs", run_ids):
        status, body = client.request("DELETE", f"/api/runs/{run_id}")
        if status == 200 and body["deleted"]:  # what a troupe server answers, never any 200
            print(f"{run_id}  deleted")
        else:
            error = body.get("error", {}) if isinstance(body, dict) else {}
            print(f"troupe: {run_id}: {error.get('message', body)}", file=sys.stderr)
            code = EXIT_FAILED
    return code


def wait(client: Client, run_ids: Sequence[str], timeout: float | None, as_json: bool = False) -> int:
    """Until every run ended; 0 only when all succeeded. Past ``timeout``, 1: a run it no
    longer watches has not succeeded (seed 002's rule for ``run --timeout``); with
    ``as_json`` the statuses then say which are still going."""
    run_ids = client.full_ids("runs", run_ids)
    deadline = None if timeout is None else time.monotonic() + timeout
    statuses: dict[str, str] = {}
    code: int | None = None
    try:
        for run_id in run_ids:
            statuses[run_id] = get_run(client, run_id)["status"]
        for run_id in run_ids:
            while code is None:
                run = get_run(client, run_id)
                statuses[run_id] = run["status"]
                if run["status"] in TERMINAL:
                    if not as_json:
                        print(f"{run_id}  {run['status']}", flush=True)
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    print(f"troupe: timed out: stopped waiting after {timeout}s; {run_id} is {run['status']} "
                          "(it goes on on the server)", file=sys.stderr)
                    code = EXIT_FAILED
                    break
                _until_status_changes(client, run_id, deadline)
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    if as_json:
        print(json.dumps({"runs": [{"id": run_id, "status": status} for run_id, status in statuses.items()]},
                         indent=2))
    if code is not None:
        return code
    return EXIT_OK if all(s == ev.SUCCEEDED for s in statuses.values()) else EXIT_FAILED


def _until_status_changes(client: Client, run_id: str, deadline: float | None) -> None:
    """Until the run's stream says it finished, 30 s of silence, or ``deadline``, whichever
    comes first: a run that emits without a pause still stops the wait at its deadline."""
    try:
        for kind, data in client.stream(f"/api/runs/{run_id}/stream", read_timeout=30.0, deadline=deadline):
            if kind == "run_event" and data["type"] == ev.RUN_FINISHED:
                return
    except TimeoutError:
        return
