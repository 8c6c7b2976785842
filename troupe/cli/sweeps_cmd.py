"""``troupe sweep ...`` and ``troupe study ...``: many runs of one graph, from a terminal.

A spec file is the body ``POST /api/sweeps`` or ``POST /api/studies`` takes. Following a
sweep shows done/total and the best so far as its runs end; a study is started and left
to the server, whose budget it spends.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from troupe.cli.client import Client
from troupe.cli.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, CliError
from troupe.cli.files import read_json_object
from troupe.cli.runs_cmd import age, answer, table
from troupe.cli.set_params import apply_sets_by_server
from troupe.protocol import events as ev


def _spec_with(client: Client, path: str, sets: Sequence[str]) -> dict[str, Any]:
    """The spec, its base graph's params changed by ``--set``."""
    body = read_json_object(path, "a JSON object (the body of the request)")
    if sets:
        if not isinstance(body.get("base_graph"), dict):
            raise CliError(f"{path} has no base_graph for --set to change")
        done = apply_sets_by_server(client, body["base_graph"], sets)
        given = body.get("options")
        body["options"] = {**(given if isinstance(given, dict) else {}), "params_set": done}
    return body


def sweep_start(client: Client, path: str, detach: bool, as_json: bool, sets: Sequence[str] = ()) -> int:
    reply = answer(client.request("POST", "/api/sweeps", _spec_with(client, path, sets)),
                   f"starting the sweep of {path}")
    if as_json and detach:
        print(json.dumps(reply, indent=2))
        return EXIT_OK
    if as_json:
        return _then_json(client, f"/api/sweeps/{reply['sweep_id']}", lambda: _follow_sweep(client, reply["sweep_id"]))
    print(f"  Sweep           {reply['sweep_id']}\n  Runs queued     {reply['total_combinations']}", flush=True)
    if detach:
        return EXIT_OK
    try:
        return _follow_sweep(client, reply["sweep_id"])
    except KeyboardInterrupt:
        print(f"\n  stopped watching; the sweep goes on on the server ({reply['sweep_id']})", flush=True)
        return EXIT_INTERRUPTED


def _then_json(client: Client, path: str, follow: Callable[[], int]) -> int:
    """Follows without a line for people, then prints what the server holds at the end:
    one JSON document for a script."""
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            code = follow()
        except KeyboardInterrupt:
            code = EXIT_INTERRUPTED
    print(json.dumps(answer(client.request("GET", path), path), indent=2))
    return code


def _follow_sweep(client: Client, sweep_id: str) -> int:
    """done/total and the best so far, a line each time a run of the sweep ends."""

    def outcome(sweep: dict[str, Any]) -> int | None:
        if sweep["state"] != "finished":
            return None
        failed = sum(sweep["counts"].get(s, 0) for s in (ev.FAILED, ev.CANCELLED, ev.INTERRUPTED))
        return EXIT_OK if not failed else EXIT_FAILED

    return _follow(client, f"/api/sweeps/{sweep_id}", f"sweep {sweep_id}", _progress_line, outcome, 30.0)


def _follow(client: Client, path: str, what: str, line_of: Callable[[dict[str, Any]], str],
            outcome_of: Callable[[dict[str, Any]], int | None], every_s: float) -> int:
    """A line each time ``path`` reads differently after a run ends, until ``outcome_of``
    says how it ended. The stream of every run's changes is opened first, then ``path``
    read: no end is missed. ``every_s``: read again after that long without a change
    (a study halts a moment after its last run ends)."""
    said = ""
    while True:
        try:
            for kind, data in client.stream("/api/stream", read_timeout=every_s):
                if kind != "hello" and not (kind == "run" and data.get("status") in ev.TERMINAL_STATES):
                    continue
                found = answer(client.request("GET", path), what)
                line = line_of(found)
                if line != said:
                    print(line, flush=True)
                    said = line
                code = outcome_of(found)
                if code is not None:
                    return code
        except TimeoutError:
            continue


def _progress_line(sweep: dict[str, Any]) -> str:
    done = sum(count for status, count in sweep["counts"].items() if status not in ev.ACTIVE_STATES)
    best = sweep.get("best")
    return f"  {done}/{sweep['total_combinations']} done" + (
        f"  best {sweep['objective']['metric']}={best['objective_value']:.6g} {json.dumps(best['params'])}"
        if best else "")


def sweep_ls(client: Client, form: str, limit: int | None = None) -> int:
    return _listing(client, "sweeps", form, limit, ["ID", "NAME", "STATE", "RUNS", "CREATED"],
                    lambda s: [s.get("state", ""), str(s.get("total", ""))])


def sweep_show(client: Client, sweep_id: str, as_json: bool) -> int:
    sweep_id = client.full_id("sweeps", sweep_id)
    sweep = answer(client.request("GET", f"/api/sweeps/{sweep_id}"), f"sweep {sweep_id}")
    if as_json:
        print(json.dumps(sweep, indent=2))
        return EXIT_OK
    keys = [p["key"] for p in sweep["params"]]
    print(f"  Sweep   {sweep['sweep_id']}  {sweep.get('name') or ''}\n  State   {sweep['state']}\n"
          f"  Ranked  by {sweep['objective']['metric']} ({sweep['objective']['direction']})\n")
    rows = [[str(v["rank"] or "-"), str(v["index"]), v["status"],
             "-" if v["objective_value"] is None else f"{v['objective_value']:.6g}",
             *(json.dumps(v["params"].get(k)) for k in keys), v["run_id"]] for v in sweep["variants"]]
    print(table(rows, ["RANK", "INDEX", "STATUS", "OBJECTIVE", *keys, "RUN"]))
    return EXIT_OK


def sweep_csv(client: Client, sweep_id: str, out: str | None) -> int:
    sweep_id = client.full_id("sweeps", sweep_id)
    status, body = client.request("GET", f"/api/sweeps/{sweep_id}?format=csv")  # text: a CSV is no JSON
    if status != 200 or not isinstance(body, str):
        answer((status, body), f"sweep {sweep_id}")
        raise CliError(f"sweep {sweep_id}: the server answered {status} without a CSV")
    if out:
        try:
            Path(out).write_text(body, encoding="utf-8")
        except OSError as exc:
            raise CliError(f"cannot write {out}: {exc.strerror or exc}") from None
        print(f"wrote {out}")
    else:
        sys.stdout.write(body)
    return EXIT_OK


def sweep_cancel(client: Client, sweep_id: str) -> int:
    sweep_id = client.full_id("sweeps", sweep_id)
    reply = answer(client.request("POST", f"/api/sweeps/{sweep_id}/cancel"), f"cancelling sweep {sweep_id}")
    print(f"  cancelled {reply.get('cancelled', 0)}, already finished {reply.get('already_finished', 0)}")
    return EXIT_OK


def study_start(client: Client, path: str, as_json: bool, wait: bool = False, sets: Sequence[str] = ()) -> int:
    """``wait``: follow it until it finishes, halts on its budget (both exit 0: it did
    what it was told; ``study resume`` raises the budget) or is cancelled (exit 1)."""
    reply = answer(client.request("POST", "/api/studies", _spec_with(client, path, sets)),
                   f"starting the study of {path}")
    if as_json and wait:
        return _then_json(client, f"/api/studies/{reply['id']}",
                          lambda: _follow_study(client, reply))
    if as_json:
        print(json.dumps(reply, indent=2))
    else:
        print(f"  Study           {reply['id']}\n  State           {reply['state']}\n"
              f"  Variants        {len(reply['variants'])} x {reply['repeats']} repeats", flush=True)
        for note in reply.get("notes") or []:
            print(f"  Note            {note['message']}", flush=True)
    if not wait:
        return EXIT_OK
    return _follow_study(client, reply)


def _follow_study(client: Client, reply: dict[str, Any]) -> int:
    def line(study: dict[str, Any]) -> str:
        best = study["ranking"][0] if study["ranking"] else None
        return (f"  {study['used']['runs']} runs used, {study['state']}"
                + (f": {study['halt_reason']}" if study.get("halt_reason") else "")
                + (f"  best {best['variant']}={best['objective_value']:.6g}" if best else ""))

    def outcome(study: dict[str, Any]) -> int | None:
        return None if study["state"] == "running" else EXIT_FAILED if study["state"] == "cancelled" else EXIT_OK

    try:
        return _follow(client, f"/api/studies/{reply['id']}", f"study {reply['id']}", line, outcome, 1.0)
    except KeyboardInterrupt:
        print(f"\n  stopped watching; the study goes on on the server ({reply['id']})", flush=True)
        return EXIT_INTERRUPTED


def study_ls(client: Client, form: str, limit: int | None = None) -> int:
    return _listing(client, "studies", form, limit, ["ID", "NAME", "STATE", "HALTED BECAUSE", "CREATED"],
                    lambda s: [s["state"], s.get("halt_reason") or ""])


def _listing(client: Client, what: str, form: str, limit: int | None, header: list[str],
             middle: Callable[[dict[str, Any]], list[str]]) -> int:
    """``GET /api/<what>`` as a table: id, name, ``middle``'s columns, created; or
    ``form`` "json" (the API's objects) or "ids" (one a line); the newest ``limit``."""
    reply = answer(client.request("GET", f"/api/{what}"), f"listing {what}")
    reply[what] = reply[what][:limit]
    if form != "table":
        print(json.dumps(reply, indent=2) if form == "json" else "\n".join(item["id"] for item in reply[what]))
        return EXIT_OK
    rows = [[item["id"], item.get("name") or "", *middle(item), age(item.get("created_at"))] for item in reply[what]]
    print(table(rows, header) if rows else f"no {what} yet")
    return EXIT_OK


def study_show(client: Client, study_id: str, as_json: bool) -> int:
    study_id = client.full_id("studies", study_id)
    study = answer(client.request("GET", f"/api/studies/{study_id}"), f"study {study_id}")
    if as_json:
        print(json.dumps(study, indent=2))
        return EXIT_OK
    print(f"  Study   {study['id']}  {study.get('name') or ''}\n  State   {study['state']}"
          + (f" ({study['halt_reason']})" if study.get("halt_reason") else "")
          + f"\n  Used    {study['used']['runs']} runs, {study['used']['active_seconds']:.0f} s\n")
    rows = [[str(r["rank"]), r["variant"], f"{r['objective_value']:.6g}", str(r["repeats"])] for r in study["ranking"]]
    rows += [["-", u["variant"], "-", u.get("reason", "")] for u in study["unranked"]]
    print(table(rows, ["RANK", "VARIANT", "OBJECTIVE", "REPEATS / WHY NOT"]))
    return EXIT_OK


def study_resume(client: Client, study_id: str, raised: dict[str, float | int | None]) -> int:
    study_id = client.full_id("studies", study_id)
    budget = {k: v for k, v in raised.items() if v is not None}
    reply = answer(client.request("POST", f"/api/studies/{study_id}/resume", {"budget": budget}),
                   f"resuming study {study_id}")
    print(f"  Study   {reply['id']}  {reply['state']}")
    return EXIT_OK


def study_cancel(client: Client, study_id: str) -> int:
    """Exit 0 once the study goes no further: cancelled now, or it had finished before
    the cancel came (as ``troupe cancel`` of a run that ended, and ``sweep cancel``): a
    script that cancels a study its last attempt just finished has what it asked for."""
    study_id = client.full_id("studies", study_id)
    reply = answer(client.request("POST", f"/api/studies/{study_id}/cancel"), f"cancelling study {study_id}")
    state = reply["state"]
    print(f"  Study   {reply['id']}  {state}" + ("  (it had ended)" if state == "finished" else ""))
    return EXIT_OK if state in ("cancelled", "finished") else EXIT_FAILED
