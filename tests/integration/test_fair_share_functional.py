"""A class sharing one machine (issue 43): who submitted each run, fair order within a
queue key, quotas per session. Every test runs the real server with one cpu slot and
class sessions opened from class links, as students would."""

from __future__ import annotations

import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO, Server, base_env, graph, hello, node, sleeper, troupe_cmd
from tests.integration.test_shared_cards_functional import share, shared_card  # noqa: F401  # the fixture
from troupe.cli.client import Client

pytestmark = pytest.mark.timeout(180)

ONE_SLOT = {"TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU": "1", "TROUPE_FAIR_SHARE_HALF_LIFE_S": "1"}


def _nap(seconds: float, name: str) -> dict[str, Any]:
    return graph(node("z", "core.Sleep", seconds=seconds), device="cpu", name=name)


def _submit(client: Client, body: dict[str, Any], expect: int = 201) -> dict[str, Any]:
    status, reply = client.request("POST", "/api/runs", {"graph": body, "options": {}})
    assert status == expect, (status, reply)
    return reply  # type: ignore[no-any-return]  # a JSON object


def _students(server: Server, names: list[str], **link: Any) -> dict[str, Client]:
    """One class link good for every student; each logs in and names themselves."""
    status, made = server.client.request("POST", "/api/login-links", {"uses": len(names), **link})
    assert status == 201, made
    token = urllib.parse.urlsplit(made["login_url"]).query.removeprefix("token=")
    found = {}
    for name in names:
        status, reply = server.anonymous.request("POST", "/api/login", {"token": token})
        assert status == 201, reply
        found[name] = Client(server.url, reply["session"])
        assert found[name].request("PUT", "/api/sessions/me", {"name": name})[0] == 200
    return found


def _start_order(server: Server, run_ids: list[str]) -> list[str]:
    """The runs in the order they started; those that have not started yet last."""
    rows = [server.get(f"/api/runs/{run_id}") for run_id in run_ids]
    return [row["id"] for row in sorted(rows, key=lambda r: (r["started_at"] is None, r["started_at"] or ""))]


def _cancel_all(server: Server, run_ids: list[str]) -> None:
    for run_id in run_ids:
        server.client.request("POST", f"/api/runs/{run_id}/cancel")


def test_one_students_twenty_runs_do_not_hold_the_next_student_back(make_server):
    server = make_server(**ONE_SLOT)
    class_ = _students(server, ["ann", "bob"])
    ann = [_submit(class_["ann"], _nap(0.3, f"ann {i}"))["run_id"] for i in range(20)]
    bob = _submit(class_["bob"], _nap(0.3, "bob"))
    assert bob["queue_position"] == 1, bob  # next, not #20: ann holds the slot and has 19 waiting
    assert server.get(f"/api/runs/{ann[1]}")["queue_position"] == 2
    server.wait_status(bob["run_id"], "succeeded")
    order = _start_order(server, [*ann[:3], bob["run_id"]])
    _cancel_all(server, ann)
    assert order[:2] == [ann[0], bob["run_id"]], order  # the slot ann's first run freed went to bob
    rows = {r["id"]: r for r in server.get("/api/runs?limit=100")["runs"]}
    assert rows[bob["run_id"]]["submitted_label"] == "bob" and rows[ann[0]]["submitted_label"] == "ann"
    # Whose runs: each session's own, and the teacher's token's.
    status, mine = class_["bob"].request("GET", "/api/runs?mine=true")
    assert status == 200 and [r["id"] for r in mine["runs"]] == [bob["run_id"]]
    teacher = server.submit(_nap(0.01, "teacher"))["run_id"]
    assert [r["id"] for r in server.get("/api/runs?mine=true")["runs"]] == [teacher]
    assert server.get(f"/api/runs/{teacher}")["submitted_by"] == "server"
    status, bad = server.client.request("GET", "/api/runs?mine=yes")
    assert status == 400 and bad["error"]["pointer"] == "?mine"


def test_with_three_people_the_slot_rotates_and_positions_say_so(make_server):
    server = make_server(**ONE_SLOT)
    class_ = _students(server, ["ann", "bob", "cem"])
    blocker = server.submit(_nap(1.5, "teacher's"))["run_id"]
    server.wait_status(blocker, "running")
    queued = {name: [_submit(class_[name], _nap(0.3, f"{name} {i}"))["run_id"] for i in range(3)]
              for name in ("ann", "bob", "cem")}
    rotation = [queued[name][i] for i in range(3) for name in ("ann", "bob", "cem")]
    positions = {r["id"]: r["queue_position"] for r in server.get("/api/runs?status=queued&limit=100")["runs"]}
    assert [positions[run_id] for run_id in rotation] == list(range(1, 10)), positions
    reason = server.get(f"/api/runs/{queued['cem'][0]}")["queue_reason"]
    assert reason["message"].startswith("#3 in line"), reason
    server.wait_status(queued["cem"][2], "succeeded", timeout=60)
    assert _start_order(server, rotation) == rotation


@pytest.mark.parametrize("half_life", ["3600", "1e10"])  # ten half-lives of 1e10 s reach before 1970
def test_the_fair_order_survives_a_restart(make_server, tmp_path, half_life):
    home = tmp_path / "home"
    settings = {**ONE_SLOT, "TROUPE_FAIR_SHARE_HALF_LIFE_S": half_life, "TROUPE_RUN_QUEUE_RESTORE": "1"}
    server = make_server(home, **settings)
    class_ = _students(server, ["ann", "bob"])
    used = _submit(class_["ann"], _nap(0.5, "ann's first"))["run_id"]
    server.wait_status(used, "succeeded")
    blocker = server.submit(_nap(30, "teacher's"))["run_id"]
    server.wait_status(blocker, "running")
    ann = [_submit(class_["ann"], _nap(0.1, f"ann {i}"))["run_id"] for i in range(2)]
    bob = _submit(class_["bob"], _nap(0.1, "bob"))["run_id"]
    assert server.get(f"/api/runs/{bob}")["queue_position"] == 1  # ann used the slot already
    server.kill()
    server = make_server(home, **settings)  # the teacher's run is interrupted, the slot free
    server.wait_status(ann[1], "succeeded")
    assert _start_order(server, [*ann, bob])[0] == bob


def test_fifo_for_everyone_when_the_setting_says_so(make_server):
    server = make_server(**ONE_SLOT, TROUPE_QUEUE_ORDER="fifo")
    class_ = _students(server, ["ann", "bob"])
    ann = [_submit(class_["ann"], _nap(0.2, f"ann {i}"))["run_id"] for i in range(3)]
    bob = _submit(class_["bob"], _nap(0.2, "bob"))
    assert bob["queue_position"] == 3  # behind ann's two waiting runs
    server.wait_status(bob["run_id"], "succeeded")
    assert _start_order(server, [*ann, bob["run_id"]]) == [*ann, bob["run_id"]]


def test_quotas_refuse_with_the_counts_and_hold_runs_back(make_server):
    server = make_server(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="2")
    ann = _students(server, ["ann"], max_running=1, max_waiting=2)["ann"]
    first = _submit(ann, sleeper(30, device="cpu"))["run_id"]
    server.wait_status(first, "running")
    waiting = [_submit(ann, sleeper(30, device="cpu"))["run_id"] for _ in range(2)]
    # A free slot, but ann may run one at a time: the second waits.
    assert server.get(f"/api/runs/{waiting[0]}")["status"] == "queued"
    refused = _submit(ann, sleeper(1, device="cpu"), expect=429)["error"]
    assert refused["code"] == "quota_exceeded" and "2 runs waiting" in refused["message"], refused
    # (and the rate every class link gets unless told: the server's, 30 a minute)
    assert refused["details"] == {"running": 1, "waiting": 2, "asked": 1, "limit": "max_waiting", "max_running": 1,
                                  "max_waiting": 2, "max_submits_per_minute": 30}
    status, reply = ann.request("POST", "/api/sweeps", {
        "base_graph": graph(node("z", "core.Sleep", seconds=0.1), device="cpu"),
        "sweep_spec": {"method": "grid", "params": [{"node_id": "z", "param": "seconds", "values": [0.1, 0.2]}]},
        "objective": {"metric": "loss", "direction": "minimize"}})
    assert status == 429 and reply["error"]["details"]["asked"] == 2  # refused whole
    assert len(ann.request("GET", "/api/runs?mine=true")[1]["runs"]) == 3  # nothing of it stored
    # The teacher has no quota, and the class's queue did not hold the teacher back.
    teacher = server.submit(_nap(0.01, "teacher"))["run_id"]
    server.wait_status(teacher, "succeeded")
    server.client.request("POST", f"/api/runs/{first}/cancel")
    server.wait_status(waiting[0], "running")
    assert server.get(f"/api/runs/{waiting[1]}")["status"] == "queued"
    _cancel_all(server, waiting)
    links = server.get("/api/login-links")["links"]
    assert links[-1]["quotas"] == {"max_running": 1, "max_waiting": 2, "max_submits_per_minute": 30}


def test_the_terminal_lists_its_own_runs_and_who_ran_what(make_server, tmp_path):
    server = make_server(**ONE_SLOT)
    made = subprocess.run(troupe_cmd("open", "--uses", "2", "--max-waiting", "5", "--no-browser"), cwd=REPO,
                          env=base_env(server.home), capture_output=True, text=True, timeout=60)
    assert made.returncode == 0 and "max waiting 5" in made.stderr, made.stderr
    for value in ("inf", "Infinity"):  # JSON has no such number: said here, not "the body is not valid JSON"
        refused = subprocess.run(troupe_cmd("open", "--uses", "2", "--max-memory-gib", value, "--no-browser"),
                                 cwd=REPO, env=base_env(server.home), capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2 and refused.stderr == "troupe: --max-memory-gib is a number of GiB, not " \
            "inf\n", refused.stderr
    student = tmp_path / "student"
    env = {**base_env(student), "XDG_CONFIG_HOME": str(student / "config"), "HOME": str(student),
           "COLUMNS": "200"}

    def troupe(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(troupe_cmd(*args), cwd=REPO, env=env, capture_output=True, text=True, timeout=60)

    assert troupe("login", made.stdout.strip()).returncode == 0
    student_ann = _students(server, ["ann"])["ann"]
    ann = [_submit(student_ann, _nap(2, f"ann {i}"))["run_id"] for i in range(5)]
    ran = troupe("run", str(Path(REPO) / "examples" / "hello.json"))
    assert ran.returncode == 0, ran.stderr
    assert "queued  position 1 on cpu" in ran.stdout, ran.stdout  # next, ahead of ann's four waiting
    mine_id = next(line.split()[-1] for line in ran.stdout.splitlines() if "Run ID" in line)
    assert _start_order(server, [*ann[:2], mine_id])[:2] == [ann[0], mine_id]
    _cancel_all(server, ann)
    teacher = server.submit(_nap(0.01, "teachers"))["run_id"]
    server.wait_status(teacher, "succeeded")
    mine = troupe("ls", "--mine", "--full")
    assert mine.returncode == 0 and teacher not in mine.stdout and "hello" in mine.stdout, mine.stdout
    everyone = troupe("ls", "--full").stdout
    assert "BY" in everyone.splitlines()[0] and "server token" in everyone and teacher in everyone, everyone


def test_a_card_shared_by_memory_takes_its_waiting_runs_in_fair_order(shared_card):  # noqa: F811  # the fixture
    server = shared_card
    share(server)
    class_ = _students(server, ["ann", "bob"])

    def submit(who: str, body: dict[str, Any], gib: float) -> str:
        options = {"device": "cuda:0", "target": {"worker": "gpu-a", "memory_gib": gib, "wait": True}}
        status, reply = class_[who].request("POST", "/api/runs", {"graph": body, "options": options})
        assert status == 201, reply
        return str(reply["run_id"])

    server.wait_status(submit("ann", hello(), 1), "succeeded")  # ann has used the card
    packed = [server.submit(sleeper(60), device="cuda:0", target={"worker": "gpu-a", "memory_gib": 7})["run_id"]
              for _ in range(3)]
    for run_id in packed:
        server.wait_status(run_id, "running")
    ann = [submit("ann", sleeper(60), 6) for _ in range(2)]  # no room: they wait for it, in her order
    bob = submit("bob", hello(), 6)
    server.client.request("POST", f"/api/runs/{packed[0]}/cancel")  # room for one 6 GiB run
    bob_started = server.wait_status(bob, "succeeded")["started_at"]
    ann_first = server.wait_status(ann[0], "running")["started_at"]
    assert bob_started < ann_first  # the one who had not used the card goes first
    _cancel_all(server, [*packed, *ann])


def test_a_memory_quota_counts_the_budgets_a_session_holds(shared_card):  # noqa: F811  # the fixture
    server = shared_card
    share(server)
    ann = _students(server, ["ann"], max_memory_gib=10)["ann"]
    options = {"device": "cuda:0", "target": {"worker": "gpu-a", "memory_gib": 6}}
    status, first = ann.request("POST", "/api/runs", {"graph": sleeper(60), "options": options})
    assert status == 201, first
    status, refused = ann.request("POST", "/api/runs", {"graph": sleeper(60), "options": options})
    assert status == 429 and refused["error"]["code"] == "quota_exceeded", refused
    details = refused["error"]["details"]
    assert details["limit"] == "max_memory_mib" and details["memory_mib"] == 6 * 1024
    assert details["asked_mib"] == 6 * 1024 and details["max_memory_mib"] == 10 * 1024
    server.client.request("POST", f"/api/runs/{first['run_id']}/cancel")
