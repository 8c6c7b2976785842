"""Who a session says it is (issue 62): a student's name cannot pass for the teacher's or
for another live session's, nor hide characters; a terminal names itself with ``troupe
login --name``; a login link is not left live where it was shown (a browser that has a
session already, the link the last ``troupe start`` printed)."""

from __future__ import annotations

import http.client
import json
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

from tests.helpers import EXAMPLES, REPO, base_env, troupe_cmd
from tests.integration.test_login_functional import browser_login
from troupe.cli.client import Client


def rename(client: Client, name: str) -> tuple[int, dict]:
    return client.request("PUT", "/api/sessions/me", {"name": name})


def refused(answer: tuple[int, dict]) -> tuple[int, str, str]:
    status, reply = answer
    return status, reply["error"]["code"], reply["error"]["pointer"]


def test_a_name_cannot_pass_for_the_teacher_or_a_live_session_nor_hide_characters(make_server):
    server = make_server()
    ann, bob = server.session(uses=2), server.session(uses=1)
    status, named = rename(ann, " Ann Lee ")
    assert (status, named["label"]) == (200, "Ann Lee"), named
    for taken in ("ann  lee", "ANN LEE", "Ａｎｎ Ｌｅｅ"):  # after NFKC, case folding, one space
        assert refused(rename(bob, taken)) == (409, "name_taken", "/name"), taken
    for reserved in ("teacher", "Server", "server token", "ｔｅａｃｈｅｒ"):
        assert refused(rename(bob, reserved)) == (400, "name_reserved", "/name"), reserved
    for hidden in ("Bob\u202egnp.exe", "Bo\u200bb", "\u2066Bob\u2069", "Bob\ufeff", "Bob\u2028Lee",
                   # default-ignorable marks and letters: a variation selector, the grapheme joiner, a Hangul filler
                   "Ann Lee\ufe0f", "Ann\u034f Lee", "\u3164", "Ann\U000e0041 Lee"):
        assert refused(rename(bob, hidden)) == (400, "name_hidden_character", "/name"), hidden
    assert refused(rename(bob, "x" * 41)) == (400, "name_too_long", "/name")
    assert rename(bob, " " + "x" * 40 + " ")[0] == 200  # 40 once trimmed
    assert rename(ann, "ann lee")[0] == 200  # her own name, written otherwise
    listed = {s["label"] for s in server.get("/api/sessions")["sessions"]}
    assert {"ann lee", "x" * 40} <= listed and not listed & {"ANN LEE", "teacher"}
    assert ann.request("POST", "/api/logout")[0] == 200
    assert rename(bob, "Ann Lee")[0] == 200  # a session that ended holds no name
    teacher = server.session()
    assert rename(teacher, "Teacher")[0] == 200  # the teacher may call herself so


def test_a_terminal_names_itself_at_login_and_a_refused_name_spends_no_use(make_server, tmp_path):
    server = make_server()
    status, made = server.client.request("POST", "/api/login-links", {"uses": 3})
    assert status == 201, made

    def terminal(name: str, *args: str) -> subprocess.CompletedProcess[str]:
        home = tmp_path / name
        home.mkdir(exist_ok=True)
        env = {**base_env(home), "XDG_CONFIG_HOME": str(home / "config"), "HOME": str(home)}
        return subprocess.run(troupe_cmd(*args), cwd=REPO, env=env, capture_output=True, text=True, timeout=120)

    ann = terminal("ann", "login", made["login_url"], "--name", "Ann")
    assert ann.returncode == 0 and "as Ann" in ann.stdout, ann.stderr
    again = terminal("bob", "login", made["login_url"], "--name", "ann")
    assert again.returncode == 1 and "refused the name" in again.stderr and "409" in again.stderr, again.stderr
    assert terminal("bob", "login", made["login_url"], "--name", "Bob").returncode == 0
    link = next(link for link in server.get("/api/login-links")["links"] if link["kind"] == "class")
    assert (link["uses_left"], link["sessions"]) == (1, 2)  # the refused name spent none
    assert terminal("ann", "run", str(EXAMPLES / "hello.json")).returncode == 0
    assert terminal("bob", "run", str(EXAMPLES / "hello.json")).returncode == 0
    by = sorted(run["submitted_label"] for run in server.get("/api/runs")["runs"])
    assert by == ["Ann", "Bob"]  # two terminals on one machine, told apart
    token = terminal("carl", "login", server.url, "--token", server.token, "--name", "Carl")
    assert token.returncode == 2 and "--name" in token.stderr


def test_a_link_opened_in_a_browser_with_a_session_is_not_left_in_the_address(make_server):
    server = make_server()
    cookie = browser_login(server.url, urlsplit(server.login_url).query.removeprefix("token="))
    status, made = server.client.request("POST", "/api/login-links", {"uses": 1})
    assert status == 201, made
    parts = urlsplit(made["login_url"])
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("GET", f"/?{parts.query}", headers={"Cookie": cookie})
    answer = conn.getresponse()
    answer.read()
    assert answer.status == 303 and answer.getheader("Location") == "/?link-unspent"
    assert "token" not in answer.getheader("Location")
    link = next(link for link in server.get("/api/login-links")["links"] if link["kind"] == "class")
    assert link["uses_left"] == 1  # unspent: the browser keeps the session it has


def _login(server, url: str) -> tuple[int, dict]:
    token = urlsplit(url).query.removeprefix("token=")
    return server.anonymous.request("POST", "/api/login", {"token": token})


def test_a_start_revokes_the_link_the_last_start_printed_if_nobody_used_it(make_server, tmp_path):
    home: Path = tmp_path / "home"
    first = make_server(home=home)
    unused = first.login_url
    assert first.stop() == 0
    second = make_server(home=home)
    status, reply = _login(second, unused)
    assert (status, reply["error"]["code"]) == (401, "link_not_valid")  # five restarts: one live link, not five
    status, used = _login(second, second.login_url)
    assert status == 201, used
    assert second.stop() == 0
    third = make_server(home=home)
    teacher = Client(third.url, used["session"])
    assert teacher.request("GET", "/api/sessions")[0] == 200  # a used link is left alone: its session goes on
    links = third.get("/api/login-links")["links"]  # oldest first
    assert [(link["revoked"], link["sessions"]) for link in links] == [(True, 0), (False, 1), (False, 0)]
    assert _login(third, third.login_url)[0] == 201
    assert json.loads((home / "session.json").read_text())["login_url"] == third.login_url
