"""Logging a browser in with a one-time link (as Jupyter does): the page never carries
the session token, a page without the login cookie is read-only, and a mutation from a
page needs the cookie and a header a cross-site form cannot send."""

from __future__ import annotations

import http.client
import json
import subprocess
import urllib.request
from urllib.parse import urlsplit

from tests.helpers import REPO, base_env, hello, troupe_cmd


def get(url: str, path_and_query: str, headers: dict | None = None) -> http.client.HTTPResponse:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("GET", path_and_query, headers=headers or {})
    return conn.getresponse()


def post(url: str, path: str, body: dict, headers: dict) -> tuple[int, dict]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json", **headers})
    response = conn.getresponse()
    return response.status, json.loads(response.read() or b"{}")


def browser_login(url: str, token: str) -> str:
    """What the page does with a login link: one use of it for an HttpOnly cookie, whose
    ``name=value`` is returned."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("POST", "/api/login", body=json.dumps({"token": token, "browser": True}),
                 headers={"Content-Type": "application/json", "X-Troupe-Request": "1"})
    response = conn.getresponse()
    assert response.status == 201, response.read()
    cookie = response.getheader("Set-Cookie")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie and "Max-Age=" in cookie
    return cookie.split(";")[0]


def test_the_login_link_sets_a_strict_http_only_cookie_once(shared_server):
    link = urlsplit(shared_server.login_url)
    assert link.query.startswith("token=") and f"http://{link.netloc}" == shared_server.url
    page = get(shared_server.url, "/").read().decode()
    assert shared_server.token not in page and 'name="troupe-login" content="out"' in page
    for _ in range(3):  # a preview of the link (a chat app fetching it) spends no use
        opened = get(shared_server.url, f"/?{link.query}")
        assert opened.status == 200 and 'name="troupe-login" content="link"' in opened.read().decode()
        assert opened.getheader("Set-Cookie") is None
    token = link.query.removeprefix("token=")
    status, reply = post(shared_server.url, "/api/login", {"token": token, "browser": True}, {})
    assert status == 401  # only the page logs a browser in: no other site's form can
    name_value = browser_login(shared_server.url, token)
    logged_in = get(shared_server.url, "/", {"Cookie": name_value}).read().decode()
    assert 'content="in"' in logged_in and shared_server.token not in logged_in
    status, reply = post(shared_server.url, "/api/login", {"token": token, "browser": True},
                         {"X-Troupe-Request": "1"})
    assert status == 401 and reply["error"]["code"] == "link_not_valid"  # one use only
    body = {"graph": hello()}
    status, reply = post(shared_server.url, "/api/runs", body, {"Cookie": name_value})
    assert status == 401 and reply["error"]["code"] == "unauthorized"  # a form could send the cookie, not this
    status, reply = post(shared_server.url, "/api/runs", body, {"Cookie": name_value, "X-Troupe-Request": "1"})
    assert status == 201, reply
    status, _ = post(shared_server.url, "/api/runs", body, {"X-Troupe-Request": "1"})
    assert status == 401  # the header alone is nothing
    status, _ = post(shared_server.url, "/api/login-links", {}, {"Cookie": name_value})
    assert status == 401  # not from a form
    # The link `troupe start` printed is the teacher's: its page may hand out links (a
    # class session may not: test_classroom_functional).
    status, _ = post(shared_server.url, "/api/login-links", {}, {"Cookie": name_value, "X-Troupe-Request": "1"})
    assert status == 201


def test_troupe_open_prints_a_fresh_link_that_logs_in(shared_server):
    result = subprocess.run(troupe_cmd("open", "--no-browser"), cwd=REPO, env=base_env(shared_server.home),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    link = result.stdout.strip()
    assert link != shared_server.login_url and link.startswith(shared_server.url + "/?token=")
    assert browser_login(shared_server.url, urlsplit(link).query.removeprefix("token="))
    session = json.loads((shared_server.home / "session.json").read_text())
    assert session["login_url"] == shared_server.login_url  # what `troupe start` printed


def test_a_session_names_itself_and_the_server_token_has_no_name(make_server):
    server = make_server()
    student = server.session(uses=2)
    status, named = student.request("PUT", "/api/sessions/me", {"name": "  Bo Chen "})
    assert status == 200 and named["label"] == "Bo Chen", named
    listed = {s["id"]: s["label"] for s in server.get("/api/sessions")["sessions"]}
    assert listed[named["id"]] == "Bo Chen"
    for bad in ({"name": ""}, {"name": "a\nb"}, {"name": "x" * 61}, {"nom": "x"}):
        status, reply = student.request("PUT", "/api/sessions/me", bad)
        assert status == 400 and reply["error"]["pointer"] in ("/name", "/nom"), (bad, reply)
    status, reply = server.client.request("PUT", "/api/sessions/me", {"name": "root"})
    assert status == 409 and reply["error"]["code"] == "no_session"


def test_the_page_allows_scripts_from_its_server_only_and_no_framing(shared_server):
    with urllib.request.urlopen(shared_server.url + "/", timeout=30) as response:
        headers = response.headers
    policy = dict(part.strip().split(" ", 1) for part in headers["Content-Security-Policy"].split(";"))
    assert policy["script-src"] == "'self'" and policy["object-src"] == "'none'"
    assert policy["frame-ancestors"] == "'none'" and headers["X-Frame-Options"] == "DENY"
    assert headers["X-Content-Type-Options"] == "nosniff"
