"""DESIGN invariant 1: the default submission's event sequence, against a golden file.

Canonical form: the run-level events in order, and each node's own events in order
(independent nodes may interleave), with times, durations and ids left out. The golden
file changes only in a commit that means to change it: regenerate it with
``TROUPE_UPDATE_GOLDEN=1 pytest tests/integration/test_single_node_parity.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.helpers import hello

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "hello_events.json"
# Times, and the thread cap of a node (a share of this machine's cores).
_VOLATILE = {"duration_s", "traceback", "threads"}


def canonical(events):
    run_level = []
    by_node: dict[str, list] = {}
    for event in events:
        payload = {k: v for k, v in event["payload"].items() if k not in _VOLATILE}
        entry = {"type": event["type"], "payload": payload}
        if event["node_id"] is None:
            run_level.append(entry)
        else:
            by_node.setdefault(event["node_id"], []).append(entry)
    return {"run": run_level, "nodes": dict(sorted(by_node.items()))}


def test_default_submission_of_hello_matches_the_golden_snapshot(shared_server):
    run_id = shared_server.submit(hello())["run_id"]
    events = shared_server.events_until_finished(run_id)
    got = canonical(events)
    if os.environ.get("TROUPE_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    assert got == json.loads(GOLDEN.read_text())
