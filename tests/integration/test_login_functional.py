"""Logging a browser in with a one-time link (as Jupyter does): the page never carries
the session token, a page without the login cookie is read-only, and a mutation from a
page needs the cookie and a header a cross-site form cannot send."""

from __future__ import annotations

import http.client
import json
import subprocess
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


def test_the_login_link_sets_a_strict_http_only_cookie_once(shared_server):
    link = urlsplit(shared_server.login_url)
    assert link.query.startswith("token=") and f"http://{link.netloc}" == shared_server.url
    page = get(shared_server.url, "/").read().decode()
    assert shared_server.token not in page and 'name="troupe-login" content="out"' in page
    response = get(shared_server.url, f"/?{link.query}")
    assert response.status == 303 and response.getheader("Location") == "/"
    cookie = response.getheader("Set-Cookie")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    name_value = cookie.split(";")[0]
    logged_in = get(shared_server.url, "/", {"Cookie": name_value}).read().decode()
    assert 'content="in"' in logged_in and shared_server.token not in logged_in
    again = get(shared_server.url, f"/?{link.query}")  # one use only
    assert again.status == 200 and 'content="used"' in again.read().decode()
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
    assert get(shared_server.url, "/?" + urlsplit(link).query).status == 303
    session = json.loads((shared_server.home / "session.json").read_text())
    assert session["login_url"] == shared_server.login_url  # what `troupe start` printed
