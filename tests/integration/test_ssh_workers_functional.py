"""Workers served over SSH (issue 15, point 3), against a private sshd on loopback: the
control plane opens ``ssh -R``, the remote agent dials back through the forwarded Unix
socket and runs a graph; a refused key shows ``failed`` with the reason and no retry
loop; removing the worker ends the ssh process."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from tests.helpers import REPO, hello
from tests.integration.test_workers_functional import CARD
from tests.lan import STUDENT_SIDE, in_namespace
from tests.sshd import missing, start_sshd
from troupe.cli.client import Client

REASON = missing()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


@pytest.fixture
def sshd(tmp_path):
    running = start_sshd(tmp_path / "sshd")
    yield running
    running.stop()


def remote_troupe(tmp_path) -> str:
    """How the 'remote' shell starts troupe: this checkout, with a home of its own."""
    inventory = json.dumps({"machine_id": "far-machine", "cpus": 2, "cards": [CARD]})
    return (f"cd {shlex.quote(str(REPO))} && env XDG_CONFIG_HOME={tmp_path}/far/config "
            f"XDG_STATE_HOME={tmp_path}/far/state TROUPE_SIMULATED_INVENTORY={shlex.quote(inventory)} "
            f"{shlex.quote(sys.executable)} -m troupe.cli.main")


def body(sshd, tmp_path, key, **extra) -> dict:
    return {"name": "far", "host": "127.0.0.1", "user": "root", "port": sshd.port, "identity_file": str(key),
            "known_hosts_file": str(sshd.known_hosts), "remote_command": remote_troupe(tmp_path), **extra}


def row(server, name="far"):
    return next((w for w in server.get("/api/workers")["workers"] if w["name"] == name), None)


def ssh_processes(name: str, tmp_path) -> str:
    """This test's ssh sessions for the worker, and the remote shells they started: tests
    on other xdist workers use the same worker names, so a line counts only when it names
    this test's own folder (its sshd's known_hosts, the remote home)."""
    found = subprocess.run(["pgrep", "-af", f"troupe-{name}-"], capture_output=True, text=True).stdout
    return "".join(line + "\n" for line in found.splitlines() if f"{tmp_path}/" in line)


@pytest.mark.timeout(120)
def test_a_worker_over_ssh_connects_through_the_forward_runs_a_graph_and_ends_when_removed(sshd, make_server,
                                                                                         tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    status, reply = server.client.request("POST", "/api/workers/ssh", body(sshd, tmp_path, sshd.key))
    assert (status, reply["state"]) == (201, "connecting"), reply
    again = server.client.request("POST", "/api/workers/ssh", body(sshd, tmp_path, sshd.key))
    assert again[0] == 409 and again[1]["error"]["code"] == "ssh_session_open"
    server.poll_until(lambda: (row(server) or {}).get("state") == "connected", timeout=60)
    assert row(server)["machine_id"] == "far-machine"
    run_id = server.submit(hello(), target={"worker": "far"})["run_id"]
    assert server.events_until_finished(run_id)[-1]["payload"]["status"] == "succeeded"
    assert "ssh" in ssh_processes("far", tmp_path)
    assert server.client.request("DELETE", "/api/workers/far")[0] == 200
    server.poll_until(lambda: ssh_processes("far", tmp_path) == "", timeout=20)


@pytest.mark.timeout(60)
def test_a_refused_key_shows_failed_with_the_reason_and_is_not_retried(sshd, make_server, tmp_path):
    server = make_server()
    status, _ = server.client.request("POST", "/api/workers/ssh", body(sshd, tmp_path, sshd.wrong_key))
    assert status == 201
    server.poll_until(lambda: (row(server) or {}).get("state") == "failed", timeout=30)
    failed = row(server)
    assert "refused the authentication" in failed["failed_reason"]
    # No retry loop: the session ended (a retrying one stays, saying "retrying").
    assert failed["ssh"] is None and ssh_processes("far", tmp_path) == ""
    assert server.client.request("DELETE", "/api/workers/far")[0] == 200  # forgets the failure
    assert row(server) is None
    missing_troupe = body(sshd, tmp_path, sshd.key, name="far2", remote_command="no-such-troupe")
    assert server.client.request("POST", "/api/workers/ssh", missing_troupe)[0] == 201
    server.poll_until(lambda: (row(server, "far2") or {}).get("state") == "failed", timeout=30)
    assert "troupe is not found on the remote host" in row(server, "far2")["failed_reason"]


def test_a_host_name_that_does_not_resolve_is_retried_like_any_network_failure(make_server, lan):
    """The server runs on a machine of the test's own LAN, which has no name server: the
    name does not resolve, as on a laptop between networks, and the session is retried
    rather than failed."""
    server = make_server(preexec=in_namespace(lan), TROUPE_HOST="0.0.0.0")
    client = Client(f"http://{STUDENT_SIDE}:{server.url.rsplit(':', 1)[1]}", server.token)
    far = {"name": "far", "host": "gpu.lab.invalid", "user": "root", "remote_command": "troupe"}
    assert client.request("POST", "/api/workers/ssh", far)[0] == 201

    def retried() -> bool:
        found = next(w for w in client.request("GET", "/api/workers")[1]["workers"] if w["name"] == "far")
        assert found["state"] != "failed", found
        session = found["ssh"] or {}
        return session.get("attempts", 0) >= 2 and any("Could not resolve hostname" in line
                                                       for line in session.get("output", []))

    server.poll_until(retried, timeout=30)
    assert client.request("DELETE", "/api/workers/far")[0] == 200


def test_bad_bodies_are_refused_with_a_pointer(make_server):
    server = make_server()
    for bad, pointer in (({"name": "x", "host": "-oProxyCommand=evil"}, "/host"),
                         ({"name": "any", "host": "h"}, "/name"), ({"name": "x", "host": "h", "port": 0}, "/port"),
                         ({"host": "h"}, "/name"), ({"name": "x", "host": "h", "shell": "sh"}, "/shell")):
        status, reply = server.client.request("POST", "/api/workers/ssh", bad)
        assert (status, reply["error"]["pointer"]) == (400, pointer), reply
    assert server.anonymous.request("POST", "/api/workers/ssh", {"name": "x", "host": "h"})[0] == 401
