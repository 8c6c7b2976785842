"""``troupe tag / note / compare / workers / queues``: what a script or a person needs
beside the run list, without curl: marking runs, setting two runs side by side, and the
state of the machines and the lines (as ``sinfo`` and ``squeue`` show a cluster's)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from troupe.cli import code_facts
from troupe.cli.client import Client
from troupe.cli.errors import EXIT_OK, BadOption, CliError
from troupe.cli.runs_cmd import answer, get_run, table

# A series whose name says it measures an error is best when lowest; any other (an
# accuracy, a BLEU, a reward) when highest. ``compare`` says which it used.
_LOWER_IS_BETTER = ("loss", "error", "err", "mse", "mae", "rmse", "perplexity", "wer", "cer")


def tag(client: Client, run_id: str, changes: Sequence[str], as_json: bool) -> int:
    """``+name`` adds a tag, ``-name`` removes one, a bare name adds it."""
    run_id = client.full_id("runs", run_id)
    tags = set(get_run(client, run_id).get("tags") or ())
    for change in changes:
        name = change[1:] if change[:1] in "+-" else change
        if not name:
            raise CliError(f"{change!r} names no tag: write +name to add one, -name to remove one")
        if change.startswith("-"):
            tags.discard(name)
        else:
            tags.add(name)
    row = answer(client.request("PATCH", f"/api/runs/{run_id}", {"tags": sorted(tags)}), f"tagging run {run_id}")
    print(json.dumps({"id": run_id, "tags": row["tags"]}) if as_json else f"{run_id}  {' '.join(row['tags']) or '-'}")
    return EXIT_OK


def note(client: Client, run_id: str, text: str, as_json: bool) -> int:
    """The run's note; an empty text clears it."""
    run_id = client.full_id("runs", run_id)
    row = answer(client.request("PATCH", f"/api/runs/{run_id}", {"note": text or None}), f"noting run {run_id}")
    print(json.dumps({"id": run_id, "note": row["note"]}) if as_json else f"{run_id}  {row['note'] or '(no note)'}")
    return EXIT_OK


def compare(client: Client, run_ids: Sequence[str], as_json: bool) -> int:
    """The params that differ between the runs, and each series' last and best value
    with their steps, side by side."""
    if len(run_ids) < 2:  # a usage mistake (exit 2), before anything is asked of the server
        raise BadOption(f"compare takes two runs or more; {len(run_ids)} given (troupe show ID shows one)")
    ids = client.full_ids("runs", run_ids)
    runs = [get_run(client, run_id) for run_id in ids]
    series = [answer(client.request("GET", f"/api/runs/{run_id}/metrics"), f"metrics of {run_id}")["series"]
              for run_id in ids]
    params = [_params(run) for run in runs]
    differ = sorted(k for k in set().union(*params) if len({json.dumps(p.get(k), sort_keys=True) for p in params}) > 1)
    names = sorted(set().union(*series))
    differing: dict[str, list[Any]] = {key: [p.get(key) for p in params] for key in differ}
    summaries: dict[str, list[dict[str, Any]]] = {name: [_summary(name, s.get(name) or []) for s in series]
                                                  for name in names}
    ran = _ran(runs)
    found = {"runs": [{"id": run["id"], "name": run.get("name"), "status": run["status"]} for run in runs],
             "params": differing, "series": summaries, "code": ran}
    if as_json:
        print(json.dumps(found, indent=2))
        return EXIT_OK
    header = ["", *(run["id"][:8] for run in runs)]
    rows = [["status", *(run["status"] for run in runs)]]
    rows += [[key, *(json.dumps(v) if v is not None else "-" for v in values)] for key, values in differing.items()]
    for name, each in summaries.items():
        rows.append([f"{name} last", *(_at(s, "last") for s in each)])
        rows.append([f"{name} best ({each[0]['best_is']})", *(_at(s, "best") for s in each)])
    print(table(rows, header))
    if not differ:
        print("(their params are the same)")
    for run_id, items in ran.items():
        print(f"\n  What {run_id[:8]} ran, against {ids[0][:8]}")
        print("\n".join(f"    {code_facts.difference_text(item)}" for item in items) or "    the same code and packs")
    return EXIT_OK


def _ran(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each later run's differences from the first in the code it ran: a file, a commit,
    a diff or a folder pack (runs not started yet have no record and are left out)."""
    first = (runs[0].get("execution_facts") or {}).get("fingerprint")
    if first is None:
        return {}
    return {run["id"]: code_facts.differences(first, run["execution_facts"]["fingerprint"])
            for run in runs[1:] if run.get("execution_facts")}


def _params(run: dict[str, Any]) -> dict[str, Any]:
    """``node.param`` -> value over the run's graph, with its seed and device."""
    found: dict[str, Any] = {"seed": run.get("seed"), "device": run.get("device")}
    for node in (run.get("graph") or {}).get("nodes", ()):
        for name, value in (node.get("params") or {}).items():
            found[f"{node['id']}.{name}"] = value
    return found


def _summary(name: str, points: list[dict[str, Any]]) -> dict[str, Any]:
    lower = any(word in name.lower() for word in _LOWER_IS_BETTER)
    finite = [p for p in points if isinstance(p.get("value"), int | float) and math.isfinite(p["value"])]
    best = (min if lower else max)(finite, key=lambda p: p["value"]) if finite else None
    last = points[-1] if points else None
    return {"points": len(points), "best_is": "lowest" if lower else "highest",
            "last": None if last is None else {"value": last.get("value"), "step": last.get("step")},
            "best": None if best is None else {"value": best["value"], "step": best.get("step")}}


def _at(summary: dict[str, Any], which: str) -> str:
    point = summary[which]
    if point is None:
        return "-"
    value = point["value"]
    shown = f"{value:.4g}" if isinstance(value, int | float) else str(value)
    return f"{shown} @{point['step']}" if point.get("step") is not None else shown


def workers(client: Client, as_json: bool) -> int:
    found = answer(client.request("GET", "/api/workers"), "listing workers")
    if as_json:
        print(json.dumps(found, indent=2))
        return EXIT_OK
    rows = []
    for worker in found["workers"]:
        slots = worker.get("slots") or []
        heard = worker.get("heard_s_ago")
        state = worker["state"] + (" degraded" if worker.get("degraded") else "") + \
            (" draining" if worker.get("draining") else "")
        rows.append([worker["name"], state, str(len(worker.get("cards") or [])),
                     " ".join(f"{s['device']} {s['running']}/{s['limit']}" for s in slots) or "-",
                     "-" if heard is None else f"{heard:.0f}s ago",
                     " ".join(r[:8] for r in worker.get("running_runs") or []) or "-"])
    if not rows:
        print("no workers (enroll one: troupe workers add NAME, or the Workers panel)")
        return EXIT_OK
    print(table(rows, ["WORKER", "STATE", "CARDS", "SLOTS BUSY", "HEARD", "RUNS"]))
    for worker in found["workers"]:
        if worker.get("missing_node_types"):
            print(f"{worker['name']} lacks {', '.join(worker['missing_node_types'])}")
    return EXIT_OK


def queues(client: Client, as_json: bool) -> int:
    """Each queue key: slots busy of its limit, runs waiting, and what the first one waits for."""
    rows_found = answer(client.request("GET", "/api/queues"), "listing queues")["queues"]
    waiting = answer(client.request("GET", "/api/runs?status=queued&limit=500"), "listing queued runs")["runs"]
    first: dict[str, dict[str, Any]] = {}
    for run in sorted(waiting, key=lambda r: (r.get("queue_position") or 0, r["created_at"])):
        first.setdefault(run["queue_key"], run)
    if as_json:
        print(json.dumps({"queues": [{**row, "first_waiting": _first(first.get(row["queue_key"]))}
                                     for row in rows_found]}, indent=2))
        return EXIT_OK
    rows = []
    for row in rows_found:
        head = first.get(row["queue_key"])
        why = (head.get("queue_reason") or {}).get("message", "") if head else ""
        rows.append([row["queue_key"], f"{row['running']}/{row['limit']}", str(row["queued"]),
                     row["state"] if row["state"] != "ok" else "", f"{head['id'][:8]}: {why}" if head else "-"])
    if not rows:
        print("no queues yet (a queue key appears with its first run)")
        return EXIT_OK
    print(table(rows, ["QUEUE KEY", "BUSY", "WAITING", "STATE", "FIRST WAITING"]))
    return EXIT_OK


def _first(run: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if run is None else {"id": run["id"], "queue_reason": run.get("queue_reason")}
