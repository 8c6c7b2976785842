"""``troupe sweep ...`` and ``troupe study ...``: many runs of one graph, from a terminal.

A spec file is the body ``POST /api/sweeps`` or ``POST /api/studies`` takes. Following a
sweep shows done/total and the best so far as its runs end; a study is started and left
to the server, whose budget it spends.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cli.client import Client
from cli.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, CliError
from cli.runs_cmd import age, answer, table
from protocol import events as ev


def _spec(path: str) -> dict[str, Any]:
    try:
        body = json.loads(Path(path).read_text())
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise CliError(f"{path} is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise CliError(f"{path} must hold a JSON object (the body of the request)")
    return body


def sweep_start(client: Client, path: str, detach: bool, as_json: bool) -> int:
    reply = answer(client.request("POST", "/api/sweeps", _spec(path)), f"starting the sweep of {path}")
    if as_json:
        print(json.dumps(reply, indent=2))
    else:
        print(f"  Sweep           {reply['sweep_id']}\n  Runs queued     {reply['total_combinations']}", flush=True)
    if detach:
        return EXIT_OK
    try:
        return _follow_sweep(client, reply["sweep_id"])
    except KeyboardInterrupt:
        print(f"\n  stopped watching; the sweep goes on on the server ({reply['sweep_id']})", flush=True)
        return EXIT_INTERRUPTED


def _follow_sweep(client: Client, sweep_id: str) -> int:
    """done/total and the best so far, a line each time a run of the sweep ends. The
    stream of every run's changes is opened first, then the sweep read: no end is missed."""
    said = ""
    while True:
        try:
            for kind, data in client.stream("/api/stream", read_timeout=30.0):
                if kind != "hello" and not (kind == "run" and data.get("status") in ev.TERMINAL_STATES):
                    continue
                sweep = answer(client.request("GET", f"/api/sweeps/{sweep_id}"), f"sweep {sweep_id}")
                line = _progress_line(sweep)
                if line != said:
                    print(line, flush=True)
                    said = line
                if sweep["state"] == "finished":
                    failed = sum(sweep["counts"].get(s, 0) for s in (ev.FAILED, ev.CANCELLED, ev.INTERRUPTED))
                    return EXIT_OK if not failed else EXIT_FAILED
        except TimeoutError:
            continue


def _progress_line(sweep: dict[str, Any]) -> str:
    done = sum(count for status, count in sweep["counts"].items() if status not in ev.ACTIVE_STATES)
    best = sweep.get("best")
    return f"  {done}/{sweep['total_combinations']} done" + (
        f"  best {sweep['objective']['metric']}={best['objective_value']:.6g} {json.dumps(best['params'])}"
        if best else "")


def sweep_ls(client: Client, as_json: bool) -> int:
    return _listing(client, "sweeps", as_json, ["ID", "NAME", "STATE", "RUNS", "CREATED"],
                    lambda s: [s.get("state", ""), str(s.get("total", ""))])


def sweep_show(client: Client, sweep_id: str, as_json: bool) -> int:
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
    status, body = client.request("GET", f"/api/sweeps/{sweep_id}?format=csv")  # text: a CSV is no JSON
    if status != 200 or not isinstance(body, str):
        answer((status, body), f"sweep {sweep_id}")
        raise CliError(f"sweep {sweep_id}: the server answered {status} without a CSV")
    if out:
        Path(out).write_text(body)
        print(f"wrote {out}")
    else:
        sys.stdout.write(body)
    return EXIT_OK


def sweep_cancel(client: Client, sweep_id: str) -> int:
    reply = answer(client.request("POST", f"/api/sweeps/{sweep_id}/cancel"), f"cancelling sweep {sweep_id}")
    print(f"  cancelled {reply.get('cancelled', 0)}, already finished {reply.get('already_finished', 0)}")
    return EXIT_OK


def study_start(client: Client, path: str, as_json: bool) -> int:
    reply = answer(client.request("POST", "/api/studies", _spec(path)), f"starting the study of {path}")
    if as_json:
        print(json.dumps(reply, indent=2))
        return EXIT_OK
    print(f"  Study           {reply['id']}\n  State           {reply['state']}\n"
          f"  Variants        {len(reply['variants'])} x {reply['repeats']} repeats")
    return EXIT_OK


def study_ls(client: Client, as_json: bool) -> int:
    return _listing(client, "studies", as_json, ["ID", "NAME", "STATE", "HALTED BECAUSE", "CREATED"],
                    lambda s: [s["state"], s.get("halt_reason") or ""])


def _listing(client: Client, what: str, as_json: bool, header: list[str],
             middle: Callable[[dict[str, Any]], list[str]]) -> int:
    """``GET /api/<what>`` as a table: id, name, ``middle``'s columns, created."""
    reply = answer(client.request("GET", f"/api/{what}"), f"listing {what}")
    if as_json:
        print(json.dumps(reply, indent=2))
        return EXIT_OK
    rows = [[item["id"], item.get("name") or "", *middle(item), age(item.get("created_at"))] for item in reply[what]]
    print(table(rows, header) if rows else f"no {what} yet")
    return EXIT_OK


def study_show(client: Client, study_id: str, as_json: bool) -> int:
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


def study_resume(client: Client, study_id: str, max_runs: int | None, max_active_seconds: float | None) -> int:
    budget = {k: v for k, v in (("max_runs", max_runs), ("max_active_seconds", max_active_seconds)) if v is not None}
    reply = answer(client.request("POST", f"/api/studies/{study_id}/resume", {"budget": budget}),
                   f"resuming study {study_id}")
    print(f"  Study   {reply['id']}  {reply['state']}")
    return EXIT_OK


def study_cancel(client: Client, study_id: str) -> int:
    reply = answer(client.request("POST", f"/api/studies/{study_id}/cancel"), f"cancelling study {study_id}")
    print(f"  Study   {reply['id']}  {reply['state']}")
    return EXIT_OK if reply["state"] == "cancelled" else EXIT_FAILED
