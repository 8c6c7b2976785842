"""A classroom on a LAN (issue 28), on a LAN the test builds: a network namespace joined
to this one by a veth pair, with addresses of the test's own. The server binds 0.0.0.0,
prints where it is reached and admits those names; reads need a session there; a class
link is good for N students until it expires, each use its own session (shown,
revocable, surviving a restart); a class session runs but does not manage workers; a
read-only one only reads. Students use the terminal from inside the namespace."""

from __future__ import annotations

import json
import re
import subprocess

from tests.helpers import REPO, base_env, hello, troupe_cmd
from tests.lan import HOST_SIDE, fetch, student


def test_a_class_on_a_lan(make_server, lan, tmp_path):
    home = tmp_path / "teacher"
    server = make_server(home, TROUPE_HOST="0.0.0.0")
    printed = server.printed("Reachable on this network at")
    port = server.url.rsplit(":", 1)[1]
    lan_url = f"http://{HOST_SIDE}:{port}"
    reachable = re.search(r"Reachable on this network at: (.*)", printed).group(1).split()  # type: ignore[union-attr]  # no match fails the test here, as it should
    assert lan_url in reachable
    # Reached by its LAN address without any setting; reads there need a session.
    status, reply = fetch(lan, f"{lan_url}/api/runs")
    assert status == 401 and reply["error"]["code"] == "login_required", reply  # type: ignore[index]  # an error reply is a JSON object
    assert fetch(lan, f"{lan_url}/")[0] == 200  # the page, which says how to log in
    assert fetch(lan, f"{lan_url}/metrics")[0] == 401
    assert fetch(lan, f"{lan_url}/metrics", token=server.token)[0] == 200  # the session token as a bearer

    made = subprocess.run(troupe_cmd("open", "--uses", "2", "--expires", "1h", "--no-browser"), cwd=REPO,
                          env=base_env(home), capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    printed_link = made.stdout.strip()
    assert any(printed_link.startswith(f"{url}/?token=") for url in reachable)  # one of its network addresses
    link = f"{lan_url}/?{printed_link.split('?', 1)[1]}"  # as a student on the test's LAN reaches it
    ann, bob, carol = (tmp_path / name for name in ("ann", "bob", "carol"))
    for who in (ann, bob):
        logged = student(lan, who, "login", link)
        assert logged.returncode == 0 and "class session" in logged.stdout, logged.stderr
    refused = student(lan, carol, "login", link)  # two uses: spent
    assert refused.returncode == 1 and "used up" in refused.stderr

    ran = student(lan, ann, "run", str(REPO / "examples" / "hello.json"))
    assert ran.returncode == 0 and "Result          succeeded" in ran.stdout, ran.stderr
    run_id = ran.stdout.splitlines()[1].split()[-1]
    assert run_id in student(lan, bob, "ls", "--full").stdout  # everyone in a class sees every run
    secret = json.loads((ann / "config" / "troupe" / "logins.json").read_text())["servers"][lan_url]["secret"]
    status, reply = fetch(lan, f"{lan_url}/api/workers/enrollments", "POST", secret, {"name": "w"})
    assert status == 403 and reply["error"]["code"] == "not_allowed"  # type: ignore[index]  # an error reply is a JSON object

    # A read-only link: reads, never changes.
    guest_link = lan_url + "/?" + subprocess.run(
        troupe_cmd("open", "--read-only", "--no-browser"), cwd=REPO, env=base_env(home), capture_output=True,
        text=True, timeout=60).stdout.strip().split("?", 1)[1]
    guest = tmp_path / "guest"
    assert student(lan, guest, "login", guest_link).returncode == 0
    assert run_id in student(lan, guest, "ls", "--full").stdout
    cancelled = student(lan, guest, "rm", run_id)
    assert cancelled.returncode == 1 and "read session" in cancelled.stderr

    # Sessions are kept hashed: a restart mid-lesson logs nobody out.
    db_text = (home / "troupe.db").read_bytes()
    assert secret.encode() not in db_text
    server.stop()
    server = make_server(home, port=int(port), TROUPE_HOST="0.0.0.0")  # the same address as before
    assert run_id in student(lan, bob, "ls", "--full").stdout
    # Who is connected, and a session revoked.
    sessions = server.get("/api/sessions")["sessions"]
    assert sorted(s["kind"] for s in sessions) == ["class", "class", "read"]
    ann_session = next(s for s in sessions if s["kind"] == "class")
    assert server.client.request("DELETE", f"/api/sessions/{ann_session['id']}")[0] == 200
    logged_out = [who for who in (ann, bob) if student(lan, who, "ls").returncode == 1]
    assert len(logged_out) == 1
    assert student(lan, bob if logged_out == [ann] else ann, "logout").returncode == 0
    assert server.submit(hello())["status"] == "queued"
