"""Logging out logs out: ``troupe logout`` ends the session on the server, a session
lives no longer than its link allowed (a restart changes nothing), and the teacher lists
login links and revokes one, which ends the sessions it opened."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.helpers import REPO, base_env, hello, troupe_cmd
from troupe.cli.client import Client


def terminal(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A terminal with no server in its TROUPE_HOME, and a config folder of its own."""
    env = {**base_env(home), "XDG_CONFIG_HOME": str(home / "config"), "HOME": str(home)}
    return subprocess.run(troupe_cmd(*args), cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def class_link(server, uses: int = 2, expires_s: float = 3600) -> str:
    status, reply = server.client.request("POST", "/api/login-links", {"uses": uses, "expires_s": expires_s})
    assert status == 201, reply
    return str(reply["login_url"])


def session_of(server, link: str) -> str:
    token = urlsplit(link).query.removeprefix("token=")
    status, reply = server.anonymous.request("POST", "/api/login", {"token": token})
    assert status == 201, reply
    return str(reply["session"])


def submits(server, secret: str) -> int:
    return Client(server.url, secret).request("POST", "/api/runs", {"graph": hello()})[0]


def test_troupe_logout_ends_the_session_on_the_server(make_server, tmp_path):
    server = make_server()
    ann = tmp_path / "ann"
    assert terminal(ann, "login", class_link(server)).returncode == 0
    secret = (ann / "config" / "troupe" / "logins.json").read_text().split('"secret": "')[1].split('"')[0]
    assert submits(server, secret) == 201
    out = terminal(ann, "logout")
    assert out.returncode == 0 and "logged out" in out.stdout, out.stderr
    assert submits(server, secret) == 401  # the secret opens nothing any more
    sessions = server.get("/api/sessions")["sessions"]
    assert [s["revoked"] for s in sessions] == [True]
    assert terminal(ann, "ls").returncode != 0  # and this terminal has no session left


@pytest.mark.timeout(120)
def test_a_session_lives_no_longer_than_its_link_even_across_a_restart(make_server, tmp_path):
    home = tmp_path / "home"
    server = make_server(home)
    short = session_of(server, class_link(server, expires_s=2))
    kept = session_of(server, class_link(server))
    assert submits(server, short) == 201
    rows = {s["id"]: s for s in server.get("/api/sessions")["sessions"]}
    ends = min(s["expires_at"] for s in rows.values())
    time.sleep(max(0.0, ends - time.time()) + 0.2)  # the behaviour is time passing: nothing to wait on
    assert submits(server, short) == 401
    server.stop()
    server = make_server(home)
    assert submits(server, short) == 401 and submits(server, kept) == 201


def test_links_are_listed_and_a_revoked_link_ends_its_sessions(make_server, tmp_path):
    server = make_server()
    link = class_link(server, uses=3)
    first, second = session_of(server, link), session_of(server, link)
    listed = terminal(server.home, "links")
    assert listed.returncode == 0, listed.stderr
    found = server.get("/api/login-links")["links"]
    class_links = [f for f in found if f["kind"] == "class"]
    assert len(class_links) == 1 and class_links[0]["uses_left"] == 1 and class_links[0]["sessions"] == 2
    link_id = class_links[0]["id"]
    assert link_id in listed.stdout and urlsplit(link).query.removeprefix("token=") not in listed.stdout
    status, reply = Client(server.url, first).request("GET", "/api/login-links")
    assert status == 401 and reply["error"]["code"] == "teacher_only"  # a class session does not see them
    status, reply = Client(server.url, first).request("DELETE", f"/api/login-links/{link_id}")
    assert status == 403  # nor revokes them
    revoked = terminal(server.home, "links", "--revoke", link_id)
    assert revoked.returncode == 0 and "2 session(s)" in revoked.stdout, revoked.stderr
    assert submits(server, first) == 401 and submits(server, second) == 401
    token = urlsplit(link).query.removeprefix("token=")
    status, reply = server.anonymous.request("POST", "/api/login", {"token": token})
    assert status == 401 and reply["error"]["code"] == "link_not_valid"
    missing = terminal(server.home, "links", "--revoke", "0" * 16)
    assert missing.returncode == 1 and "link_not_found" in missing.stderr
