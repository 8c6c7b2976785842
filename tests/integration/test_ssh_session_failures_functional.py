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
