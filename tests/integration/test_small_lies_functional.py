"""The terminal's and the API's small lies (issue 62, section 6), through a real server
and the real CLI: a usage mistake exits 2 before anything is asked, a short id says how
long an id must be, ``cancel`` says the state the run went to, ``logs`` says what it
leaves out and ``--all`` leaves out nothing, ``--resume`` names scripts' checkpoints,
and the answers schemathesis found at odds with the document."""

from __future__ import annotations

import json
import subprocess
import urllib.request

import pytest

from tests.helpers import EXAMPLES, REPO, base_env, hello, sleeper, troupe_cmd
from troupe.protocol.version import __version__


def troupe(server, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(troupe_cmd(*args), cwd=REPO, env=base_env(server.home), capture_output=True, text=True,
                          timeout=timeout)


def test_version_is_printed(shared_server):
    version = troupe(shared_server, "--version")
    assert (version.returncode, version.stdout) == (0, f"troupe {__version__}\n"), version.stderr


def test_usage_mistakes_exit_2_before_anything_is_asked(shared_server):
    done = shared_server.submit(hello())["run_id"]
    shared_server.wait_status(done, "succeeded")
    before = len(shared_server.get("/api/runs?limit=500")["runs"])
    mistakes = {("compare", done): "two runs or more",
                ("ls", "--status", "bogus"): "'bogus' is none of them",
                ("ls", "--status", "queued,finished"): "'finished' is none of them",
                ("ls", "-q", "--json"): "give one of them",
                ("sweep", "ls", "-q", "--json"): "give one of them",
                ("study", "ls", "-q", "--json"): "give one of them",
                ("run", str(EXAMPLES / "hello.json"), "-q", "--json"): "give one of them",
                ("rerun", done, "-q", "--json"): "give one of them",
                ("show", done[:3]): "needs 4 or more characters",
                ("cancel", done[:2]): "needs 4 or more characters",
                ("show", "zzzz"): "'zzzz' is not a run id: an id is 32 hex characters",
                ("sweep", "show", "not-hex"): "is not a sweep id",
                ("rm", done + "0"): "is not a run id"}
    for args, words in mistakes.items():
        result = troupe(shared_server, *args)
        assert result.returncode == 2 and words in result.stderr, (args, result.returncode, result.stderr)
        assert result.stdout == "", (args, result.stdout)
    assert len(shared_server.get("/api/runs?limit=500")["runs"]) == before  # no run was made by a mistake
    assert troupe(shared_server, "show", done[:4]).returncode == 0  # four are enough


def test_cancel_says_the_state_the_run_went_to(shared_server):
    running = shared_server.submit(sleeper(60))["run_id"]
    shared_server.wait_status(running, "running")
    cancelled = troupe(shared_server, "cancel", running)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout == f"{running}  cancelled\n"  # not "running", what the server answered at once
    assert shared_server.get(f"/api/runs/{running}")["status"] == "cancelled"
    other = shared_server.submit(sleeper(60))["run_id"]
    shared_server.wait_status(other, "running")
    answered = json.loads(troupe(shared_server, "cancel", other, "--json").stdout)
    assert [(r["id"], r["status"]) for r in answered["runs"]] == [(other, "cancelled")]


def test_logs_json_says_what_it_leaves_out_and_all_gives_every_event(shared_server):
    helped = troupe(shared_server, "logs", "--help", timeout=60).stdout
    assert "--all" in helped and "leaves out" in helped, helped
    run_id = shared_server.submit(hello())["run_id"]
    every = shared_server.events_until_finished(run_id)
    shown = [json.loads(line) for line in troupe(shared_server, "logs", run_id, "--json").stdout.splitlines()]
    assert "run_queued" not in {e["type"] for e in shown}  # what its help says it leaves out
    whole = [json.loads(line) for line in troupe(shared_server, "logs", run_id, "--all", "--json").stdout.splitlines()]
    assert whole == every
    text = troupe(shared_server, "logs", run_id, "--all")
    assert text.returncode == 0 and text.stdout.splitlines()[0] == "[run] queued on cpu", text.stdout
    both = troupe(shared_server, "logs", run_id, "--all", "--console")
    assert both.returncode == 2 and "give one of them" in both.stderr


def test_resume_names_scripts_checkpoints_as_well_as_the_training_loops(shared_server):
    helped = troupe(shared_server, "rerun", "--help", timeout=60).stdout
    assert "TrainingLoop" in helped and "TROUPE_CHECKPOINT_DIR" in " ".join(helped.split()), helped
    run_id = shared_server.submit(hello())["run_id"]
    shared_server.wait_status(run_id, "succeeded")
    refused = troupe(shared_server, "rerun", run_id, "--resume")
    assert refused.returncode == 1 and "no_checkpoint" in refused.stderr, refused.stderr
    assert "TrainingLoop" in refused.stderr and "TROUPE_CHECKPOINT_DIR" in refused.stderr, refused.stderr


def raw(server, method: str, path: str, headers: dict[str, str] | None = None, body: bytes | None = None
        ) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(server.url + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as refused:
        return refused.code, dict(refused.headers), refused.read()


def test_an_empty_sort_is_refused_as_the_document_says(shared_server):
    status, _, body = raw(shared_server, "GET", "/api/runs?sort=")
    assert (status, json.loads(body)["error"]["pointer"]) == (400, "?sort")
    assert raw(shared_server, "GET", "/api/runs?sort=val_loss")[0] == 200


@pytest.mark.parametrize("target", [{"pool": None, "worker": None}, {"worker": None, "pool": "one-shot"}])
def test_a_target_naming_both_a_worker_and_a_pool_is_refused_even_as_nulls(shared_server, target):
    error = shared_server.submit(hello(), expect=400, target=target)["error"]
    assert (error["code"], error["pointer"]) == ("target_conflict", "/options/target/pool")
    assert shared_server.submit(hello(), target={"worker": None})["status"] == "queued"  # one of them: fine


def test_the_worker_socket_without_a_credential_answers_401(shared_server):
    status, _, body = raw(shared_server, "GET", "/ws/worker")
    assert (status, json.loads(body)["error"]["code"]) == (401, "unauthorized")
    upgrade = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
               "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
    assert raw(shared_server, "GET", "/ws/worker", {**upgrade, "Authorization": "Bearer "})[0] == 401


def test_options_of_a_sessions_own_name_offers_only_what_it_answers(shared_server):
    status, headers, _ = raw(shared_server, "OPTIONS", "/api/sessions/me")
    assert status == 405 and headers["Allow"] == "PUT", headers
    bearer = {"Authorization": f"Bearer {shared_server.token}"}
    status, headers, _ = raw(shared_server, "DELETE", "/api/sessions/me", bearer)
    assert status == 405 and headers["Allow"] == "PUT", headers
    status, _, body = raw(shared_server, "DELETE", "/api/sessions/0123456789abcdef", bearer)
    assert (status, json.loads(body)["error"]["code"]) == (404, "session_not_found")
