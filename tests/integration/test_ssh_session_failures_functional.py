"""An SSH session that cannot even start says so (no private sshd needed): the worker of
a control plane with no ssh client shows ``failed`` with the reason rather than staying
``connecting``, and what ssh prints is read whatever its lines' length, so that a final
reason after a 100 KB line without a newline still ends the session."""

from __future__ import annotations

import os

import pytest


def row(server, name="far"):
    return next((w for w in server.get("/api/workers")["workers"] if w["name"] == name), None)


@pytest.mark.timeout(60)
def test_no_ssh_client_shows_failed_with_the_reason(make_server, tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    server = make_server(PATH=str(empty))
    assert server.client.request("POST", "/api/workers/ssh", {"name": "far", "host": "127.0.0.1"})[0] == 201
    server.poll_until(lambda: (row(server) or {}).get("state") == "failed", timeout=30)
    assert "cannot run ssh" in row(server)["failed_reason"]
    assert server.client.request("DELETE", "/api/workers/far")[0] == 200
    assert row(server) is None


@pytest.mark.timeout(60)
def test_a_line_past_the_stream_limit_is_read_and_the_reason_after_it_still_counts(make_server, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "ssh"
    fake.write_text("#!/bin/sh\nhead -c 100000 /dev/zero | tr '\\0' '#'\n"
                    "echo\necho 'root@127.0.0.1: Permission denied (publickey).'\nexit 255\n")
    fake.chmod(0o755)
    server = make_server(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    assert server.client.request("POST", "/api/workers/ssh", {"name": "far", "host": "127.0.0.1"})[0] == 201
    server.poll_until(lambda: (row(server) or {}).get("state") == "failed", timeout=30)
    assert "refused the authentication" in row(server)["failed_reason"]


def fake_ssh(tmp_path, script: str) -> str:
    """A PATH whose ``ssh`` runs ``script`` (sh; ``$last`` is the remote command)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "ssh"
    fake.write_text("#!/bin/sh\nfor last; do :; done\n" + script)
    fake.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"


@pytest.mark.timeout(60)
def test_a_line_an_earlier_session_printed_never_makes_a_dropped_connection_final(make_server, tmp_path):
    # A remote .bashrc's complaint, then the connection drops (ssh's 255): a retry can help.
    path = fake_ssh(tmp_path, "echo 'bash: /root/.cargo/env: No such file or directory'\n"
                              "echo 'Connection to 127.0.0.1 closed by remote host.'\nexit 255\n")
    server = make_server(PATH=path)
    assert server.client.request("POST", "/api/workers/ssh", {"name": "far", "host": "127.0.0.1"})[0] == 201

    def retried() -> bool:
        found = row(server)
        assert found is not None and found["state"] != "failed", found
        return (found["ssh"] or {}).get("attempts", 0) >= 2

    server.poll_until(retried, timeout=30)
    assert server.client.request("DELETE", "/api/workers/far")[0] == 200


@pytest.mark.timeout(60)
def test_a_remote_command_the_shell_cannot_read_fails_and_never_shows_the_join_token(make_server, tmp_path):
    # What bash -c prints for `~/venv/bin/troupe) agent start ... --token T ...`: the line, token and all.
    path = fake_ssh(tmp_path, "echo \"bash: -c: line 1: syntax error near unexpected token \\`)'\"\n"
                              "echo \"bash: -c: line 1: \\`$last'\"\nexit 2\n")
    server = make_server(PATH=path)
    far = {"name": "far", "host": "127.0.0.1", "remote_command": "~/venv/bin/troupe)"}
    assert server.client.request("POST", "/api/workers/ssh", far)[0] == 201
    server.poll_until(lambda: (row(server) or {}).get("state") == "failed", timeout=30)
    failed = row(server)
    assert "cannot read remote_command" in failed["failed_reason"], failed
    assert "--token (the join token)" in failed["failed_reason"], failed
    listed = server.client.request("GET", "/api/workers")[1]
    shown = [line for worker in listed["workers"] for line in (worker.get("ssh") or {}).get("output", [])]
    shown.append(failed["failed_reason"])
    assert all(line.count("--token ") == line.count("--token (the join token)") for line in shown), shown


def test_hosts_ssh_cannot_take_and_control_characters_are_refused_with_a_pointer(make_server):
    server = make_server()
    for bad, pointer in (({"name": "x", "host": "127.0.0.1:22"}, "/host"), ({"name": "x", "host": "[::1]"}, "/host"),
                         ({"name": "x", "host": "gpu%1"}, "/host"),
                         ({"name": "x", "host": "h", "remote_command": "troupe\u0000 more"}, "/remote_command"),
                         ({"name": "x", "host": "h", "identity_file": "/tmp/a\nb"}, "/identity_file"),
                         ({"name": "x", "host": "h", "known_hosts_file": "/tmp/k\tb"}, "/known_hosts_file")):
        status, reply = server.client.request("POST", "/api/workers/ssh", bad)
        assert (status, reply["error"]["pointer"]) == (400, pointer), reply
    assert server.client.request("POST", "/api/workers/ssh", {"name": "x6", "host": "::1"})[0] == 201
    assert server.client.request("DELETE", "/api/workers/x6")[0] == 200


@pytest.mark.timeout(60)
def test_each_attempt_drops_the_join_token_of_the_one_before(make_server, tmp_path):
    said = tmp_path / "remote-commands"
    path = fake_ssh(tmp_path, f"echo \"$last\" >> {said}\necho 'ssh: connect to host 127.0.0.1 port 22: "
                              "Connection refused'\nexit 255\n")
    server = make_server(PATH=path)
    assert server.client.request("POST", "/api/workers/ssh", {"name": "far", "host": "127.0.0.1"})[0] == 201
    server.poll_until(lambda: said.exists() and len(said.read_text().splitlines()) >= 3, timeout=30)
    tokens = [line.split("--token ")[1].split()[0].strip("'") for line in said.read_text().splitlines()]
    assert server.client.request("DELETE", "/api/workers/far")[0] == 200
    status, reply = server.anonymous.request("POST", "/api/workers/credentials",
                                             {"token": tokens[0], "machine_id": "intruder"})
    assert status == 401 and "unknown" in reply["error"]["message"], reply
