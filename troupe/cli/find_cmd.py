"""``troupe ls --group-by KEY [--metric SERIES]`` and ``troupe ls --keys``: the runs a
filter finds folded into a row per value of a key, and the keys a filter can name
(``GET /api/runs?group_by=``, ``GET /api/runs/keys``)."""

from __future__ import annotations

import json
import sys
import urllib.parse
from typing import Any

from troupe.cli.client import Client
from troupe.cli.errors import EXIT_OK, BadOption
from troupe.cli.runs_cmd import Listing, answer, list_query, table
from troupe.protocol.errors import WhereInvalid
from troupe.protocol.where import key_of


def group_runs(client: Client, asked: Listing, group_by: str, metric: str | None) -> int:
    """A row per value of ``group_by`` with its run count and, with ``metric``, the mean,
    min, max and standard deviation of its runs' newest values of that series."""
    if asked.sort or asked.params:
        raise BadOption("--group-by prints groups, not runs: it takes no --sort or --params")
    try:
        key_of(group_by)
    except WhereInvalid as exc:
        raise BadOption(f"--group-by: {exc.message}") from None
    query = {**list_query(client, asked), "group_by": group_by, **({"metric": metric} if metric else {})}
    reply = answer(client.request("GET", f"/api/runs?{urllib.parse.urlencode(query)}"), "grouping runs")
    groups = reply["groups"]
    if asked.form == "json":
        print(json.dumps(reply, indent=2))
    elif asked.form == "ids":
        print("\n".join(_value(group) for group in groups))
    elif not groups:
        print("no runs match")
    else:
        header = [group_by.upper(), "RUNS"] + ([f"{metric.upper()} RUNS", "MEAN", "MIN", "MAX", "STD"]
                                                if metric else [])
        print(table([_row(group, metric) for group in groups], header))
    if reply.get("next_cursor") and asked.form == "table":
        print(f"next page: troupe ls --group-by {group_by} --cursor {reply['next_cursor']}", file=sys.stderr)
    return EXIT_OK


def _value(group: dict[str, Any]) -> str:
    value = group["value"]
    if value is None:
        return "(none)"
    text = value if isinstance(value, str) else json.dumps(value)
    return f"{group['label']} ({text[:8]})" if group.get("label") else text


def _row(group: dict[str, Any], metric: str | None) -> list[str]:
    row = [_value(group), str(group["runs"])]
    if metric:
        stats = group.get("metric") or {}
        row += [str(stats.get("runs", 0)), *("-" if stats.get(k) is None else f"{stats[k]:.4g}"
                                             for k in ("mean", "min", "max", "std"))]
    return row


def list_keys(client: Client, form: str) -> int:
    """Every key a ``--where`` can name, with how many stored runs have it."""
    reply = answer(client.request("GET", "/api/runs/keys"), "listing keys")
    if form == "json":
        print(json.dumps(reply, indent=2))
    elif form == "ids":
        print("\n".join(key["key"] for key in reply["keys"]))
    else:
        print(table([[key["key"], key["kind"], str(key["runs"])] for key in reply["keys"]], ["KEY", "KIND", "RUNS"]))
        if reply["types"]:
            print("\ntype takes: " + ", ".join(t["name"] for t in reply["types"]))
    return EXIT_OK


def usage(message: str) -> int:
    """A mistake in how the options go together (exit 2)."""
    raise BadOption(message)
