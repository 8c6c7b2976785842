"""Retention that no session can turn against the others (issue 62): it keeps the newest
N runs of each submitter, so a class session's flood of quick runs prunes only its own;
a run tagged ``keep`` is never pruned; each pass is one log line with its counts per
submitter; and a class link limits how many runs a session submits a minute (429
``quota_exceeded`` with ``Retry-After``), a sweep counting each of its runs."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.error
import urllib.request
from typing import Any

import pytest

from tests.helpers import REPO, base_env, graph, hello, node, troupe_cmd
from troupe.cli.client import Client

pytestmark = pytest.mark.timeout(120)
CLASS = {"uses": 1, "max_running": 1, "max_waiting": 5}


def run_to_the_end(server, client: Client, graph_doc: dict[str, Any]) -> str:
    status, reply = client.request("POST", "/api/runs", {"graph": graph_doc})
    assert status == 201, reply
    server.events_until_finished(reply["run_id"])
    return str(reply["run_id"])


def exists(server, run_id: str) -> bool:
    status, _ = server.client.request("GET", f"/api/runs/{run_id}")
    assert status in (200, 404)
    return status == 200


def own_runs(client: Client) -> list[str]:
    return [r["id"] for r in client.request("GET", "/api/runs?mine=true&limit=100")[1]["runs"]]


def pruned_per_pass(printed: str, name: str) -> list[int]:
    """What each retention line of the server's log says it removed of ``name``'s runs."""
    lines = [line for line in printed.splitlines() if "retention removed" in line]
    return [int(found[1]) for line in lines if (found := re.search(rf"{re.escape(name)}(?: \([^)]*\))? (\d+)", line))]


def test_a_class_sessions_flood_prunes_only_its_own_runs(make_server):
    server = make_server(TROUPE_RUN_RETENTION_KEEP_LAST="3")
    teacher = run_to_the_end(server, server.client, hello())
    bob = server.session(**CLASS)
    bobs = run_to_the_end(server, bob, hello())
    ann = server.session(**CLASS)
    anns = [run_to_the_end(server, ann, hello()) for _ in range(8)]
    server.wait_until(lambda: len(own_runs(ann)) == 3)
    # The server keeps three runs of each: ann's newest, and the teacher's and bob's runs,
    # older than all of hers (before, the newest three of the whole server: ann's alone).
    assert own_runs(ann) == anns[:-4:-1]
    assert exists(server, teacher) and exists(server, bobs)
    assert own_runs(bob) == [bobs]
    assert not exists(server, anns[0])
    # One line a pass of retention, its counts per submitter: only ann's session is named,
    # and what the lines add up to is what was removed, each run said once.
    session = server.get(f"/api/runs/{anns[-1]}")["submitted_by"]
    server.poll_until(lambda: sum(pruned_per_pass("".join(server.output), f"session {session}")) >= 5)
    printed = "".join(server.output)
    assert sum(pruned_per_pass(printed, f"session {session}")) == 5, printed
    assert "keeping the newest 3 of each submitter" in printed
    assert not [line for line in printed.splitlines() if "retention removed" in line
                and ("server token" in line or session not in line)], printed
    # The run's detail says how long it is kept the same way (GET /api/info too).
    assert server.get("/api/info")["limits"]["run_retention_per"] == "submitter"


def test_a_run_tagged_keep_outlives_its_sessions_flood(make_server):
    server = make_server(TROUPE_RUN_RETENTION_KEEP_LAST="2")
    ann = server.session(**CLASS)
    best = run_to_the_end(server, ann, hello())
    tagged = subprocess.run(troupe_cmd("tag", best, "+keep"), cwd=REPO, env=base_env(server.home),
                            capture_output=True, text=True, timeout=60)
    assert tagged.returncode == 0 and "keep" in tagged.stdout, tagged.stderr
    later = [run_to_the_end(server, ann, hello()) for _ in range(4)]
    server.wait_until(lambda: not exists(server, later[1]))
    # The tagged run stays and takes no place: the newest two untagged runs stay beside it.
    assert own_runs(ann) == [later[3], later[2], best]
    # Untagged, it is one of the session's runs again, and the next pass takes it.
    assert subprocess.run(troupe_cmd("tag", best, "-keep"), cwd=REPO, env=base_env(server.home),
                          capture_output=True, text=True, timeout=60).returncode == 0
    newest = run_to_the_end(server, ann, hello())
    server.wait_until(lambda: not exists(server, best))
    assert own_runs(ann) == [newest, later[3]]


def _post(server, secret: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    """A request as a session sends it, with the reply's headers (Retry-After)."""
    request = urllib.request.Request(server.url + path, json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, dict(reply.headers), json.loads(reply.read())
    except urllib.error.HTTPError as refused:
        return refused.code, dict(refused.headers), json.loads(refused.read())


def _sweep(values: list[float]) -> dict[str, Any]:
    return {"base_graph": graph(node("z", "core.Sleep", seconds=0.01), device="cpu"),
            "sweep_spec": {"method": "grid", "params": [{"node_id": "z", "param": "seconds", "values": values}]},
            "objective": {"metric": "loss", "direction": "minimize"}}


def test_a_class_link_limits_the_runs_a_session_submits_a_minute(make_server, tmp_path):
    server = make_server()
    # A class link gets the server's rate unless the teacher gives one; the teacher's CLI
    # shows it with the link's other limits.
    made = subprocess.run(troupe_cmd("open", "--uses", "1", "--max-waiting", "50", "--max-submits-per-minute", "4",
                                     "--no-browser"), cwd=REPO, env=base_env(server.home), capture_output=True,
                          text=True, timeout=60)
    assert made.returncode == 0 and "max waiting 50, max submits per minute 4" in made.stderr, made.stderr
    server.session(uses=3)  # no limits given: the server's, 30 a minute
    links = server.get("/api/login-links")["links"]
    assert sorted(link["quotas"].get("max_submits_per_minute") for link in links if link["kind"] == "class") == [4, 30]
    status, login = server.anonymous.request("POST", "/api/login", {"token": made.stdout.strip().split("token=")[1]})
    assert status == 201, login
    secret = login["session"]
    sessions = server.get("/api/sessions")["sessions"]
    assert [s["quotas"] for s in sessions if s["id"] == login["id"]] == [{"max_waiting": 50,
                                                                          "max_submits_per_minute": 4}]

    first = _post(server, secret, "/api/runs", {"graph": hello()})
    assert first[0] == 201, first
    server.events_until_finished(first[2]["run_id"])
    rerun = _post(server, secret, f"/api/runs/{first[2]['run_id']}/rerun", {})  # a rerun counts too
    assert rerun[0] == 201, rerun
    # Two submitted this minute: a sweep of three would make five, and is refused whole,
    # with when to try again, though all the runs have finished.
    server.events_until_finished(rerun[2]["run_id"])
    status, headers, reply = _post(server, secret, "/api/sweeps", _sweep([0.01, 0.02, 0.03]))
    assert status == 429 and reply["error"]["code"] == "quota_exceeded", reply
    details = reply["error"]["details"]
    assert details["limit"] == "max_submits_per_minute" and details["asked"] == 3, details
    assert details["submitted_last_minute"] == 2 and details["max_submits_per_minute"] == 4, details
    assert 1 <= details["retry_after_s"] <= 60 and headers["Retry-After"] == str(details["retry_after_s"]), headers
    assert "Try again in" in reply["error"]["message"]
    assert len(server.get("/api/sweeps")["sweeps"]) == 0
    # A sweep of two fits, and counts as two.
    status, _, swept = _post(server, secret, "/api/sweeps", _sweep([0.01, 0.02]))
    assert status == 201, swept
    status, headers, reply = _post(server, secret, "/api/runs", {"graph": hello()})
    assert status == 429 and reply["error"]["details"]["submitted_last_minute"] == 4, reply
    assert "Retry-After" in headers
    # More at once than a minute allows: no wait helps, and no Retry-After says otherwise.
    status, headers, reply = _post(server, secret, "/api/sweeps", _sweep([0.01, 0.02, 0.03, 0.04, 0.05]))
    assert status == 429 and reply["error"]["details"]["retry_after_s"] is None, reply
    assert "Retry-After" not in headers
    # The student's terminal says it in words; the teacher has no such limit.
    student = tmp_path / "student"
    env = {**base_env(student), "XDG_CONFIG_HOME": str(student / "config"), "HOME": str(student)}
    logins = student / "config" / "troupe" / "logins.json"
    logins.parent.mkdir(parents=True)
    logins.write_text(json.dumps({"servers": {server.url: {"secret": secret, "kind": "class", "ca": None}},
                                  "current": server.url}))
    ran = subprocess.run(troupe_cmd("run", str(REPO / "examples" / "hello.json")), cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode != 0 and "quota_exceeded" in ran.stderr and "runs a minute" in ran.stderr, ran.stderr
    for _ in range(6):
        server.submit(hello())


def _study(repeats: int, **budget: int) -> dict[str, Any]:
    return {"name": "repeats", "base_graph": hello(), "repeats": repeats, "budget": {"max_parallel_runs": 1, **budget},
            "variants": [{"name": "one", "params": [{"node_id": "a", "param": "value", "value": 1}]}],
            "objective": {"metric": "val_loss", "direction": "minimize"}}


def test_a_study_counts_every_run_it_may_start_against_the_minute(make_server):
    """A study starts its runs over time, one at a time here: the per-minute limit counts
    every run it may start all the same, or a study of quick repeats floods the server
    at whatever pace the queue allows (1000 runs in 30 s) past a limit of 5 a minute."""
    server = make_server()
    ann = server.session(uses=1, max_submits_per_minute=5)
    status, reply = ann.request("POST", "/api/studies", _study(20))
    assert status == 429 and reply["error"]["details"]["asked"] == 20, reply
    assert server.get("/api/studies")["studies"] == []
    # max_runs bounds what it may start: one run counted.
    status, halted = ann.request("POST", "/api/studies", _study(2, max_runs=1))
    assert status == 201, halted
    server.wait_until(lambda: server.get(f"/api/studies/{halted['id']}")["state"] == "halted")
    status, reply = ann.request("POST", "/api/studies", _study(4))
    assert status == 201, reply
    # Five counted: resuming the first, which owes one more run, would make six.
    status, reply = ann.request("POST", f"/api/studies/{halted['id']}/resume", {"budget": {"max_runs": 2}})
    assert status == 429 and reply["error"]["details"]["submitted_last_minute"] == 5, reply
    assert reply["error"]["details"]["asked"] == 1, reply
