"""``troupe workers add NAME``: a worker's one-time enrollment from the terminal, the same
call as ``troupe.Client.enroll_worker`` (``POST /api/workers/enrollments``). It prints the
command to run on the worker's machine; the token in it is spent by the agent's first
start (or by ``--uses`` of them, for an array of one-shot agents)."""

from __future__ import annotations

import json
from typing import Any

from troupe.cli.errors import EXIT_OK
from troupe.cli.runs_cmd import answer


def add(client: Any, name: str, uses: int, ttl_s: float, as_json: bool) -> int:
    found = answer(client.request("POST", "/api/workers/enrollments", {"name": name, "uses": uses, "ttl_s": ttl_s}),
                   f"enrolling worker {name}")
    if as_json:
        print(json.dumps(found, indent=2))
        return EXIT_OK
    uses_said = "once" if found["uses"] == 1 else f"{found['uses']} times"
    print(f"Run this on {name}'s machine (the token works {uses_said}, until {found['expires_at']}):\n")
    print(f"  {found['command']}\n")
    return EXIT_OK
