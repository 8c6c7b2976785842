"""A class session's limits against what could go round them: an interactive run starts at
once, so ``max_running`` is checked when it is submitted; a study resumed with a larger
budget is checked as a new one; studies submitted at once are checked one at a time until
their first runs are stored; a session revoked while it follows the list gets nothing
more on the stream it had open."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.helpers import sleeper
from troupe.cli.client import Client

pytestmark = pytest.mark.timeout(90)
LIMITS = {"max_running": 1, "max_waiting": 1}


def study(runs: int, **budget) -> dict:
    variants = [{"name": f"v{i}", "params": [{"node_id": "z", "param": "seconds", "value": 30 + i}]}
                for i in range(runs)]
    return {"base_graph": sleeper(30), "variants": variants, "budget": budget,
            "objective": {"metric": "loss", "direction": "minimize"}}


def session_runs(server, client: Client) -> list[dict]:
    me = client.request("GET", "/api/runs?mine=true&limit=100")[1]["runs"]
    return [r for r in me if r["status"] in ("queued", "running")]


def test_an_interactive_run_past_max_running_is_refused(make_server):
    server = make_server()
    student = server.session(uses=1, **LIMITS)
    assert student.request("POST", "/api/runs", {"graph": sleeper(30)})[0] == 201
    server.poll_until(lambda: [r["status"] for r in session_runs(server, student)] == ["running"])
    status, reply = student.request("POST", "/api/runs", {"graph": sleeper(30), "options": {
        "lane": "interactive", "editor_session": "e0"}})
    assert status == 429 and reply["error"]["details"]["limit"] == "max_running", reply
    for run in session_runs(server, student):
        server.client.request("POST", f"/api/runs/{run['id']}/cancel")


def test_a_run_held_back_by_max_running_says_so_and_so_does_the_prediction(make_server):
    server = make_server(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="4")
    student = server.session(uses=1, max_running=1, max_waiting=2)
    assert student.request("GET", "/api/queue-prediction?queue_key=cpu")[1]["starts"] is True
    first = student.request("POST", "/api/runs", {"graph": sleeper(30)})[1]["run_id"]
    second = student.request("POST", "/api/runs", {"graph": sleeper(30)})[1]["run_id"]
    server.poll_until(lambda: server.get(f"/api/runs/{first}")["status"] == "running")
    server.poll_until(lambda: server.get(f"/api/runs/{second}")["queue_reason"] is not None)
    reason = server.get(f"/api/runs/{second}")["queue_reason"]
    assert reason["code"] == "session_at_limit" and "max_running" in reason["message"], reason
    predicted = student.request("GET", "/api/queue-prediction?queue_key=cpu")[1]
    assert predicted["starts"] is False and predicted["reason"]["code"] == "session_at_limit", predicted
    # Another session's run goes past the one held back: it would start at once.
    teacher = server.client.request("GET", "/api/queue-prediction?queue_key=cpu")[1]
    assert teacher["starts"] is True, teacher
    for run_id in (first, second):
        server.client.request("POST", f"/api/runs/{run_id}/cancel")


def test_a_resumed_study_is_checked_as_a_new_one(make_server):
    server = make_server()
    student = server.session(uses=1, **LIMITS)
    status, made = student.request("POST", "/api/studies", study(20, max_runs=0))  # admitted: it runs nothing
    assert status == 201, made
    server.poll_until(lambda: server.get(f"/api/studies/{made['id']}")["state"] == "halted")
    # Its runs count for its submitter whoever resumes it: the teacher is held to the
    # submitter's limits too. Another student may not resume it at all (its budget is its
    # submitter's and the teacher's to raise: troupe/web/change_rights.py).
    for resumer in (student, server.client):
        status, reply = resumer.request("POST", f"/api/studies/{made['id']}/resume", {"budget": {"max_runs": None}})
        assert status == 429 and reply["error"]["code"] == "quota_exceeded", reply
    status, reply = server.session(uses=1, **LIMITS).request("POST", f"/api/studies/{made['id']}/resume",
                                                             {"budget": {"max_runs": None}})
    assert status == 403 and reply["error"]["code"] == "not_your_study", reply
    assert server.get(f"/api/studies/{made['id']}")["state"] == "halted" and session_runs(server, student) == []
    # Within them, the teacher may resume it.
    status, reply = server.client.request("POST", f"/api/studies/{made['id']}/resume", {"budget": {
        "max_runs": 21, "max_parallel_runs": 1}})
    assert status == 200 and reply["state"] == "running", reply
    server.client.request("POST", f"/api/studies/{made['id']}/cancel")


def test_studies_submitted_at_once_cannot_both_slip_under_the_limits(make_server):
    server = make_server()
    student = server.session(uses=1, **LIMITS)
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda _: student.request("POST", "/api/studies", study(2, max_parallel_runs=2)),
                                range(6)))
    made = [reply["id"] for status, reply in answers if status == 201]
    assert len(made) == 1 and all(status in (201, 429) for status, _ in answers), answers
    assert len(session_runs(server, student)) == 2
    student.request("POST", f"/api/studies/{made[0]}/cancel")


def test_a_revoked_session_gets_nothing_more_on_the_stream_it_had_open(make_server):
    server = make_server(TROUPE_HOST="0.0.0.0")  # reads need a session
    status, made = server.client.request("POST", "/api/login-links", {"uses": 1})
    token = made["login_url"].split("token=", 1)[1]
    status, opened = server.anonymous.request("POST", "/api/login", {"token": token})
    assert status == 201, opened
    student = Client(server.url, opened["session"])
    seen, following = [], threading.Event()

    def follow() -> None:
        for kind, data in student.stream("/api/stream", read_timeout=30):
            following.set()
            seen.append((kind, data))

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    assert following.wait(10)
    assert server.client.request("DELETE", f"/api/sessions/{opened['id']}")[0] == 200
    run_id = server.submit(sleeper(0))["run_id"]
    reader.join(20)  # the change that follows ends it, unsent
    assert not reader.is_alive()
    assert not [data for kind, data in seen if kind == "run" and data.get("run_id") == run_id], seen


def test_a_worker_credential_reads_only_what_its_runs_fetch(make_server):
    server = make_server(TROUPE_HOST="0.0.0.0")  # reads need a session, or a worker's credential for its files
    status, enrolled = server.client.request("POST", "/api/workers/enrollments", {"name": "w1"})
    assert status == 201, enrolled
    status, redeemed = server.anonymous.request("POST", "/api/workers/credentials",
                                                {"token": enrolled["token"], "machine_id": "m-other"})
    assert status == 201, redeemed
    worker = Client(server.url, redeemed["credential"])
    from tests.integration.test_uploads_functional import ROWS, upload

    made = upload(server, ROWS)[1]
    fetch = urllib.request.Request(f"{server.url}/api/files/{made['file_id']}/content",
                                   headers={"Authorization": f"Bearer {redeemed['credential']}"})
    with urllib.request.urlopen(fetch, timeout=30) as answer:  # what a run on that worker fetches
        assert answer.read() == ROWS
    socket = urllib.request.Request(f"{server.url}/ws/worker",
                                    headers={"Authorization": f"Bearer {redeemed['credential']}"})
    with pytest.raises(urllib.error.HTTPError) as refused:  # not an upgrade: the route itself refuses it
        urllib.request.urlopen(socket, timeout=30)
    assert refused.value.code == 400  # past the read check: the agent's socket is what the credential is for
    for path in ("/api/runs", "/api/stream", "/api/workers", "/api/login-links"):
        status, reply = worker.request("GET", path)
        assert (status, reply["error"]["code"]) == (401, "login_required"), (path, reply)


def test_a_sessions_interactive_run_counts_against_max_running_on_its_queue(make_server):
    server = make_server(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="4")
    student = server.session(uses=1, max_running=1, max_waiting=3)
    status, interactive = student.request("POST", "/api/runs", {"graph": sleeper(30), "options": {
        "lane": "interactive", "editor_session": "e0"}})
    assert status == 201, interactive
    server.wait_status(interactive["run_id"], "running")
    queued = student.request("POST", "/api/runs", {"graph": sleeper(30)})[1]["run_id"]
    # Slots are free, but the session already runs one run, its most: the queued one waits.
    server.poll_until(lambda: server.get(f"/api/runs/{queued}")["queue_reason"] is not None)
    reason = server.get(f"/api/runs/{queued}")["queue_reason"]
    assert reason["code"] == "session_at_limit", reason
    server.client.request("POST", f"/api/runs/{interactive['run_id']}/cancel")
    server.wait_status(queued, "running")
    server.client.request("POST", f"/api/runs/{queued}/cancel")
