"""What a session may change (issue 62): a class session cancels, deletes, renames,
retags and notes only its own runs, cancels only its own sweeps, cancels and resumes
only its own studies; anyone else's is 403 ``not_your_*`` and left as it was. The
teacher changes anyone's; a run stored without a submitter is the teacher's. Through
the real server, and the terminal of a student logged in with ``troupe login``."""

from __future__ import annotations

import subprocess
from pathlib import Path

import apsw
import pytest

import troupe
from tests.helpers import REPO, Server, base_env, hello, sleeper, troupe_cmd
from troupe.cli.client import Client

pytestmark = pytest.mark.timeout(180)
ACTIVE = ("queued", "running")


def finished(server: Server, who: Client, graph: dict) -> str:
    status, made = who.request("POST", "/api/runs", {"graph": graph})
    assert status == 201, made
    server.wait_status(made["run_id"], "succeeded")
    return str(made["run_id"])


def queued(who: Client, seconds: float = 60) -> str:
    status, made = who.request("POST", "/api/runs", {"graph": sleeper(seconds)})
    assert status == 201, made
    return str(made["run_id"])


def refused(reply: tuple[int, dict], code: str) -> str:
    status, body = reply
    assert status == 403 and body["error"]["code"] == code, reply
    return str(body["error"]["message"])


def exists(server: Server, run_id: str) -> bool:
    return server.client.request("GET", f"/api/runs/{run_id}")[0] == 200


def sweep(who: Client, seconds: float) -> str:
    body = {"base_graph": sleeper(seconds), "name": "naps", "objective": {"metric": "loss", "direction": "minimize"},
            "sweep_spec": {"method": "grid", "params": [{"node_id": "z", "param": "seconds", "values": [seconds]}]}}
    status, made = who.request("POST", "/api/sweeps", body)
    assert status == 201, made
    return str(made["sweep_id"])


def study(who: Client, **budget: int) -> str:
    body = {"base_graph": sleeper(60), "budget": budget, "objective": {"metric": "loss", "direction": "minimize"},
            "variants": [{"name": "v", "params": [{"node_id": "z", "param": "seconds", "value": 60}]}]}
    status, made = who.request("POST", "/api/studies", body)
    assert status == 201, made
    return str(made["id"])


def test_a_class_session_changes_its_own_runs_only_and_the_teacher_anyones(make_server):
    server = make_server(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="4")
    teacher = server.client
    ann, bob = server.session(uses=1), server.session(uses=1)
    assert ann.request("PUT", "/api/sessions/me", {"name": "Ann"})[0] == 200
    assert bob.request("PUT", "/api/sessions/me", {"name": "Bob"})[0] == 200
    demo, anns, bobs = (finished(server, who, hello()) for who in (teacher, ann, bob))
    assert teacher.request("PATCH", f"/api/runs/{demo}", {"tags": ["keep"], "note": "the demo"})[0] == 200

    # Ann may not delete, retag, rename or note the teacher's run nor Bob's: 403, nothing changed.
    for other, whose in ((demo, "the teacher's (submitted with the server's token)"), (bobs, "Bob's")):
        message = refused(ann.request("DELETE", f"/api/runs/{other}"), "not_your_run")
        assert f"run {other} is {whose}" in message and "the teacher may delete it" in message, message
        refused(ann.request("PATCH", f"/api/runs/{other}", {"tags": []}), "not_your_run")
        refused(ann.request("PATCH", f"/api/runs/{other}", {"name": "mine now", "note": None}), "not_your_run")
        assert exists(server, other)
    assert "only Bob and the teacher" in refused(ann.request("DELETE", f"/api/runs/{bobs}"), "not_your_run")
    kept = server.get(f"/api/runs/{demo}")
    assert (kept["tags"], kept["note"], kept["name"]) == (["keep"], "the demo", "hello")  # keep stays on
    # ... nor cancel theirs, queued or running.
    demos_nap, bobs_nap, anns_nap = queued(teacher), queued(bob), queued(ann)
    for other in (demos_nap, bobs_nap):
        refused(ann.request("POST", f"/api/runs/{other}/cancel"), "not_your_run")
        assert server.get(f"/api/runs/{other}")["status"] in ACTIVE
    # A read session changes nothing, as before.
    guest = server.session(read_only=True)
    assert guest.request("DELETE", f"/api/runs/{anns}")[1]["error"]["code"] == "not_allowed"

    # Her own: each of them.
    assert ann.request("POST", f"/api/runs/{anns_nap}/cancel")[0] == 200
    server.wait_status(anns_nap, "cancelled")
    status, edited = ann.request("PATCH", f"/api/runs/{anns}", {"tags": ["mine"], "name": "ann's", "note": "ok"})
    assert status == 200 and (edited["tags"], edited["name"], edited["note"]) == (["mine"], "ann's", "ok"), edited
    assert ann.request("DELETE", f"/api/runs/{anns}")[0] == 200 and not exists(server, anns)
    # Running another's run again is open to her: the new run is hers.
    status, again = ann.request("POST", f"/api/runs/{demo}/rerun", {})
    assert status == 201, again
    assert server.get(f"/api/runs/{again['run_id']}")["submitted_by"] == server.get(
        f"/api/runs/{anns_nap}")["submitted_by"]

    # The teacher: each of them to a student's run.
    assert teacher.request("POST", f"/api/runs/{bobs_nap}/cancel")[0] == 200
    server.wait_status(bobs_nap, "cancelled")
    assert teacher.request("PATCH", f"/api/runs/{bobs}", {"tags": ["seen"], "note": "good"})[0] == 200
    assert teacher.request("DELETE", f"/api/runs/{bobs}")[0] == 200 and not exists(server, bobs)
    assert teacher.request("POST", f"/api/runs/{demos_nap}/cancel")[0] == 200
    # A teacher's session (a link, not the token) may as well.
    assert server.session().request("DELETE", f"/api/runs/{bobs_nap}")[0] == 200


def test_keep_is_the_teachers_to_give(make_server):
    """Retention never removes a run tagged keep: a class session that could tag its own
    kept as many as it liked (7 of 11 runs past a retention of 5). Only the teacher and
    the server's token put it on; a class session takes it off its own run."""
    server = make_server()
    ann = server.session(uses=1)
    own = finished(server, ann, hello())
    for tags in (["keep"], ["keep", "mine"]):
        message = refused(ann.request("PATCH", f"/api/runs/{own}", {"tags": tags}), "keep_is_the_teachers")
        assert "Ask the teacher" in message and own in message, message
    assert server.get(f"/api/runs/{own}")["tags"] == []
    assert ann.request("PATCH", f"/api/runs/{own}", {"tags": ["mine"]})[0] == 200
    # The teacher's token and a teacher's session put it on; beside it she adds her own tags,
    # and she may take it off her own run, not put it back.
    assert server.client.request("PATCH", f"/api/runs/{own}", {"tags": ["keep", "mine"]})[0] == 200
    assert ann.request("PATCH", f"/api/runs/{own}", {"tags": ["best", "keep", "mine"]})[0] == 200
    assert ann.request("PATCH", f"/api/runs/{own}", {"tags": ["best"]})[0] == 200
    refused(ann.request("PATCH", f"/api/runs/{own}", {"tags": ["best", "keep"]}), "keep_is_the_teachers")
    assert server.session().request("PATCH", f"/api/runs/{own}", {"tags": ["keep"]})[0] == 200
    assert server.get(f"/api/runs/{own}")["tags"] == ["keep"]
    # A notebook's client: Run.tag is refused with the code, and run(tags=["keep"]) before
    # it submits anything; the teacher's client tags as it likes.
    assert ann.request("PATCH", f"/api/runs/{own}", {"tags": []})[0] == 200
    with troupe.Client(server.url, token=ann.token) as notebook:
        with pytest.raises(troupe.Refused) as said:
            notebook.get(own).tag("keep")
        assert said.value.code == "keep_is_the_teachers" and said.value.status == 403
        assert notebook.get(own).tag("mine").detail().tags == ["mine"]
        before = len(server.get("/api/runs?limit=100")["runs"])
        with pytest.raises(troupe.Refused) as said:
            notebook.run(hello(), tags=["keep"])
        assert said.value.code == "keep_is_the_teachers"
        assert len(server.get("/api/runs?limit=100")["runs"]) == before
    with troupe.Client(server.url, token=server.token) as teacher:
        assert "keep" in teacher.get(own).tag("keep").detail().tags
        assert teacher.run(hello(), tags=["keep"]).detail().tags == ["keep"]


def test_a_run_stored_without_a_submitter_is_the_teachers(make_server, tmp_path):
    home = tmp_path / "home"
    server = make_server(home)
    ann = server.session(uses=1)
    older, mine = finished(server, ann, hello()), finished(server, ann, hello())
    server.stop()
    conn = apsw.Connection(str(home / "troupe.db"))  # as a troupe from before submitters stored it
    conn.execute("UPDATE runs SET submitted_by = NULL WHERE id = ?", (older,))
    conn.close()
    server = make_server(home)  # her session outlives the restart
    ann = Client(server.url, ann.token)
    message = refused(ann.request("DELETE", f"/api/runs/{older}"), "not_your_run")
    assert "stored without a submitter" in message, message
    assert ann.request("DELETE", f"/api/runs/{mine}")[0] == 200
    assert server.client.request("DELETE", f"/api/runs/{older}")[0] == 200


def test_sweeps_and_studies_are_their_starters_and_the_teachers(make_server):
    server = make_server(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="4")
    teacher = server.client
    ann, bob = server.session(uses=1), server.session(uses=1)
    demo_sweep, anns_sweep = sweep(teacher, 60), sweep(ann, 60)
    listed = {s["id"]: s["submitted_by"] for s in server.get("/api/sweeps")["sweeps"]}
    assert listed[demo_sweep] == "server" and listed[anns_sweep] not in (None, "server")
    assert server.get(f"/api/sweeps/{anns_sweep}")["submitted_by"] == listed[anns_sweep]
    message = refused(ann.request("POST", f"/api/sweeps/{demo_sweep}/cancel"), "not_your_sweep")
    assert "only the teacher may cancel it" in message, message
    refused(bob.request("POST", f"/api/sweeps/{anns_sweep}/cancel"), "not_your_sweep")
    assert all(v["status"] in ACTIVE for s in (demo_sweep, anns_sweep)
               for v in server.get(f"/api/sweeps/{s}")["variants"])
    assert ann.request("POST", f"/api/sweeps/{anns_sweep}/cancel")[1]["cancelled"] == 1
    assert teacher.request("POST", f"/api/sweeps/{demo_sweep}/cancel")[1]["cancelled"] == 1

    # A study: bob's halted one (its budget ran nothing) is his to cancel or resume, and the teacher's.
    bobs_study, anns_study = study(bob, max_runs=0), study(ann, max_runs=1)
    server.poll_until(lambda: server.get(f"/api/studies/{bobs_study}")["state"] == "halted")
    assert server.get(f"/api/studies/{bobs_study}")["submitted_by"] is not None
    for path, body in (("cancel", None), ("resume", {"budget": {"max_runs": 1}})):
        refused(ann.request("POST", f"/api/studies/{bobs_study}/{path}", body), "not_your_study")
    assert server.get(f"/api/studies/{bobs_study}")["state"] == "halted"
    refused(bob.request("POST", f"/api/studies/{anns_study}/cancel"), "not_your_study")
    assert server.get(f"/api/studies/{anns_study}")["state"] == "running"
    assert ann.request("POST", f"/api/studies/{anns_study}/cancel")[1]["state"] == "cancelled"
    assert teacher.request("POST", f"/api/studies/{bobs_study}/cancel")[1]["state"] == "cancelled"


def test_the_terminal_of_a_student_says_whose_it_is(make_server, tmp_path):
    server = make_server(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="4")
    status, made = server.client.request("POST", "/api/login-links", {"uses": 1})
    assert status == 201, made
    laptop = tmp_path / "ann"
    laptop.mkdir()
    env = {**base_env(laptop), "XDG_CONFIG_HOME": str(laptop / "config"), "HOME": str(laptop)}

    def ann(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(troupe_cmd(*args), cwd=REPO, env=env, capture_output=True, text=True, timeout=120)

    assert ann("login", made["login_url"], "--name", "Ann").returncode == 0
    demo = finished(server, server.client, hello())
    assert server.client.request("PATCH", f"/api/runs/{demo}", {"tags": ["keep"]})[0] == 200
    nap, demo_sweep = queued(server.client), sweep(server.client, 60)
    demo_study = study(server.client, max_runs=1)
    for args in (("rm", demo), ("cancel", nap), ("tag", demo, "-keep"), ("note", demo, "mine"),
                 ("sweep", "cancel", demo_sweep), ("study", "cancel", demo_study)):
        said = ann(*args)
        assert said.returncode == 1, (args, said.stdout, said.stderr)
        assert "is the teacher's" in said.stderr and "only the teacher may" in said.stderr, (args, said.stderr)
    assert server.get(f"/api/runs/{demo}")["tags"] == ["keep"] and server.get(f"/api/runs/{demo}")["note"] is None
    assert server.get(f"/api/runs/{nap}")["status"] in ACTIVE
    assert server.get(f"/api/studies/{demo_study}")["state"] == "running"
    # Her own run: each of them.
    ran = ann("run", str(Path(REPO) / "examples" / "hello.json"))
    assert ran.returncode == 0, ran.stderr
    own = next(r["id"] for r in server.get("/api/runs?limit=100")["runs"] if r["submitted_label"] == "Ann")
    assert ann("tag", own, "+mine").returncode == 0 and ann("note", own, "mine").returncode == 0
    assert server.get(f"/api/runs/{own}")["tags"] == ["mine"]
    # keep is the teacher's to give, on her own run too: the terminal says to ask.
    said = ann("tag", own, "+keep")
    assert said.returncode == 1 and "keep_is_the_teachers" in said.stderr and "Ask the teacher" in said.stderr, said
    assert server.get(f"/api/runs/{own}")["tags"] == ["mine"]
    assert ann("rm", own).returncode == 0 and not exists(server, own)
    for path in (f"/api/runs/{nap}/cancel", f"/api/sweeps/{demo_sweep}/cancel", f"/api/studies/{demo_study}/cancel"):
        server.client.request("POST", path)
