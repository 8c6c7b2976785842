"""The terminal as a script meets it (issue 40), through a real server and the CLI: short
ids wherever an id is taken (an ambiguous one refused with the matches), machine-
readable answers (``-q``, ``--json``), tags, notes and compare without curl or jq, ``ls``
in 80 columns with what a waiting run waits for, ``wait --timeout`` telling "still
running" from "failed", and the workers and queues at a glance."""

from __future__ import annotations

import json
import subprocess
from collections import defaultdict

import pytest

from tests.helpers import EXAMPLES, REPO, base_env, hello, sleeper, troupe_cmd

HELLO = str(EXAMPLES / "hello.json")


def troupe(server, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(troupe_cmd(*args), cwd=REPO, env=base_env(server.home, **env), capture_output=True,
                          text=True, timeout=timeout)


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_newcomers_script_submits_waits_tags_compares_and_reads_the_best_run(shared_server, tmp_path):
    server = shared_server
    first = ok(troupe(server, "run", HELLO, "--detach", "-q")).strip()
    assert len(first) == 32 and int(first, 16) >= 0  # the id alone, like sbatch --parsable
    second = json.loads(ok(troupe(server, "run", HELLO, "--json", "--set", "a.value=7")))
    assert second["status"] == "succeeded" and second["id"] != first  # followed, then its record
    waited = json.loads(ok(troupe(server, "wait", first[:6], "--json")))
    assert waited == {"runs": [{"id": first, "status": "succeeded"}]}

    ok(troupe(server, "tag", first[:8], "+best", "+keep"))
    tagged = ok(troupe(server, "tag", first[:8], "-keep", "lr-0.1"))
    assert tagged.split() == [first, "best", "lr-0.1"], tagged
    ok(troupe(server, "note", second["id"][:5], "the one with a=7"))
    assert ok(troupe(server, "ls", "--tag", "best", "-q")).split() == [first]

    shown = ok(troupe(server, "show", first[:4] if _unique(server, first[:4]) else first[:10]))
    assert "Tags" in shown and "best lr-0.1" in shown, shown
    noted = ok(troupe(server, "show", second["id"][:8]))
    assert "the one with a=7" in noted and 'a.value=7' in noted, noted

    compared = json.loads(ok(troupe(server, "compare", first[:8], second["id"][:8], "--json")))
    assert compared["params"] == {"a.value": [2, 7]}, compared["params"]
    loss = compared["series"]["val_loss"]
    assert [s["last"]["value"] for s in loss] == [5.0, 10.0] and loss[0]["best_is"] == "lowest"
    table = ok(troupe(server, "compare", first[:8], second["id"][:8]))
    assert "a.value" in table and "val_loss best (lowest)" in table, table


def _unique(server, prefix: str) -> bool:
    return len(server.get(f"/api/ids?prefix={prefix}")["runs"]) == 1


@pytest.mark.timeout(180)
def test_an_ambiguous_prefix_is_refused_with_its_matches_and_an_unknown_one_too(make_server, tmp_path):
    server = make_server(TROUPE_MAX_SWEEP_RUNS="1500", TROUPE_MAX_SWEEP_DOMAIN="1500",
                         TROUPE_RUN_RETENTION_KEEP_LAST="5000")  # the cancelled runs stay
    # 1,200 runs: two share their first 4 hex characters but for a chance of 1 in 60,000.
    spec = {"base_graph": hello(), "objective": {"metric": "val_loss", "direction": "minimize"},
            "sweep_spec": {"method": "grid", "params": [
        {"node_id": "a", "param": "value", "values": list(range(1200))}]}}
    status, made = server.client.request("POST", "/api/sweeps", spec)
    assert status == 201, made
    server.client.request("POST", f"/api/sweeps/{made['sweep_id']}/cancel")
    by_prefix = defaultdict(list)
    for run in _all_runs(server):
        by_prefix[run["id"][:4]].append(run["id"])
    prefix, shared = next((p, ids) for p, ids in by_prefix.items() if len(ids) > 1)
    refused = troupe(server, "show", prefix)
    assert refused.returncode == 1 and f"{prefix} names more than one run" in refused.stderr, refused.stderr
    assert all(run_id[:12] in refused.stderr for run_id in shared)
    unknown = next(f"{n:04x}" for n in range(65536) if f"{n:04x}" not in by_prefix)
    missing = troupe(server, "cancel", unknown)
    assert missing.returncode == 1 and f"no run has an id starting with {unknown}" in missing.stderr
    sweep = ok(troupe(server, "sweep", "show", made["sweep_id"][:8]))
    assert made["sweep_id"] in sweep or "RANK" in sweep


def _all_runs(server) -> list[dict]:
    runs, cursor = [], ""
    while True:
        page = server.get(f"/api/runs?limit=500&cursor={cursor}")
        runs += page["runs"]
        if not page["next_cursor"]:
            return runs
        cursor = page["next_cursor"]


def test_ls_fits_80_columns_and_says_what_a_waiting_run_waits_for(make_server):
    server = make_server(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="1")
    busy = server.submit(sleeper(60))["run_id"]
    server.wait_status(busy, "running")
    waiting = server.submit(sleeper(1))["run_id"]
    narrow = ok(troupe(server, "ls", "--status", "queued,running", COLUMNS="80"))
    lines = narrow.splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[0].split()[:2] == ["ID", "STATUS"]
    row = next(line for line in lines if line.startswith(waiting[:8]))
    assert "queued" in row and "slots busy" in row, row  # the reason's words, not only a number
    assert not any(line.startswith(busy) for line in lines)  # 8 characters by default
    full = ok(troupe(server, "ls", "--full", COLUMNS="160"))
    assert any(line.startswith(busy) for line in full.splitlines()) and "WAITS FOR" in full

    timed_out = troupe(server, "wait", busy[:8], "--timeout", "0.5", "--json")
    assert timed_out.returncode == 1  # it cannot say a run it stopped watching succeeded
    assert json.loads(timed_out.stdout) == {"runs": [{"id": busy, "status": "running"}]}
    cancelled = json.loads(ok(troupe(server, "cancel", busy[:8], waiting[:8], "--json")))
    assert [r["id"] for r in cancelled["runs"]] == [busy, waiting]

    queues = ok(troupe(server, "queues"))
    assert queues.splitlines()[0].split()[:3] == ["QUEUE", "KEY", "BUSY"] and "cpu" in queues, queues
    assert "no workers" in ok(troupe(server, "workers"))


def test_logs_say_what_happened_and_a_failed_runs_logs_are_never_empty(shared_server):
    from tests.helpers import edge, graph, node

    server = shared_server
    failing = graph(node("c", "core.Constant", value=1), node("boom", "core.Fail", message="the data is gone"),
                    edges=(edge("c", "value", "boom", "x"),), name="failing")
    failed = server.submit(failing)["run_id"]
    server.wait_status(failed, "failed")
    said = ok(troupe(server, "logs", failed[:8]))
    assert "[node] c started" in said and "[failed] boom:" in said and "the data is gone" in said, said
    assert "Traceback (most recent call last)" not in said and "[run] failed" in said  # core.Fail's frames: troupe's
    assert "Traceback (most recent call last)" in ok(troupe(server, "logs", failed[:8], "--debug"))

    ticking = server.submit(graph(node("t", "core.Ticker", count=100, interval=0, name="tick"), name="ticks"))["run_id"]
    server.wait_status(ticking, "succeeded")
    points = [line for line in ok(troupe(server, "logs", ticking)).splitlines() if line.startswith("[metric]")]
    assert len(points) == 20 and "step 100" in points[-1], points[-3:]
    every = [line for line in ok(troupe(server, "logs", ticking, "--metrics")).splitlines()
             if line.startswith("[metric]")]
    assert len(every) == 100
    events = [json.loads(line) for line in ok(troupe(server, "logs", ticking, "--json", "--tail", "3")).splitlines()]
    assert [e["type"] for e in events][-1] == "run_finished"


def test_require_device_refuses_where_the_fallback_would_run_on_cpu(shared_server):
    server = shared_server
    refused = troupe(server, "run", HELLO, "--device", "cuda:7", "--require-device")
    assert refused.returncode == 1 and "device_unavailable" in refused.stderr, refused.stderr
    assert "cuda:7" in refused.stderr
    fell_back = troupe(server, "run", HELLO, "--device", "cuda:7")
    assert fell_back.returncode == 0 and "running on cpu" in fell_back.stdout, fell_back.stdout


def test_ls_sorts_by_a_metric_and_shows_a_sweeps_params(make_server):
    server = make_server()
    spec = {"base_graph": hello(), "objective": {"metric": "val_loss", "direction": "minimize"},
            "sweep_spec": {"method": "grid", "params": [{"node_id": "a", "param": "value", "values": [4, 1, 9]}]}}
    status, made = server.client.request("POST", "/api/sweeps", spec)
    assert status == 201, made
    for run in server.get(f"/api/runs?sweep_id={made['sweep_id']}")["runs"]:
        server.wait_status(run["id"], "succeeded")
    lowest = ok(troupe(server, "ls", "--sweep", made["sweep_id"][:6], "--sort", "val_loss", "--params",
                       COLUMNS="160")).splitlines()
    assert "VAL_LOSS" in lowest[0] and "a.value" in lowest[0], lowest[0]
    # VAL_LOSS and a.value, lowest loss first (the last column, PROGRESS, is "-").
    assert [line.split()[-3:-1] for line in lowest[1:]] == [["4", "1.0"], ["7", "4.0"], ["12", "9.0"]], lowest
    highest = json.loads(ok(troupe(server, "ls", "--sort", "val_loss", "--desc", "--json")))["runs"]
    assert [r["sort_value"] for r in highest] == [12.0, 7.0, 4.0]
    first = server.get("/api/runs?sort=val_loss&limit=2")
    rest = server.get(f"/api/runs?sort=val_loss&limit=2&cursor={first['next_cursor']}")
    assert [r["sort_value"] for r in first["runs"] + rest["runs"]] == [4.0, 7.0, 12.0] and not rest["next_cursor"]
