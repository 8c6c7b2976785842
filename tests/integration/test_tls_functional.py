"""Serving https (issue 28): ``troupe start --tls-cert --tls-key``; the printed links, the
join command and a terminal's login carry https; an agent and a terminal on another
machine (a namespace of the test's own) trust a self-signed certificate with ``--ca``
and refuse it without; plain http is not served."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO, base_env, hello, troupe_cmd
from tests.lan import HOST_SIDE, student


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate naming the test LAN's address of this machine (and loopback)."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    made = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                           "/CN=troupe-test", "-addext", f"subjectAltName=IP:{HOST_SIDE},IP:127.0.0.1",
                           "-keyout", str(key), "-out", str(cert)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"openssl could not make a certificate: {made.stderr.strip()[:200]}")
    return cert, key


def test_tls_needs_both_halves_and_a_pair_that_loads(tmp_path):
    cert, _ = self_signed(tmp_path)  # _: the key
    env = base_env(tmp_path / "home")
    half = subprocess.run(troupe_cmd("start", "--port", "0", "--tls-cert", str(cert)), cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert half.returncode == 1 and "--tls-cert and --tls-key go together" in half.stderr
    wrong = subprocess.run(troupe_cmd("start", "--port", "0", "--tls-cert", str(cert), "--tls-key", str(cert)),
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 1 and "cannot serve TLS" in wrong.stderr
    locked = tmp_path / "locked.pem"
    subprocess.run(["openssl", "pkey", "-in", str(_), "-out", str(locked), "-aes256", "-passout", "pass:secret"],
                   check=True, capture_output=True)
    encrypted = subprocess.run(troupe_cmd("start", "--port", "0", "--tls-cert", str(cert), "--tls-key", str(locked)),
                               cwd=REPO, env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert encrypted.returncode == 1 and "encrypted with a passphrase" in encrypted.stderr, encrypted.stderr


def test_https_on_a_lan_with_a_self_signed_certificate(make_server, lan, tmp_path):
    cert, key = self_signed(tmp_path)
    server = make_server(tmp_path / "teacher", TROUPE_HOST="0.0.0.0", TROUPE_TLS_CERT=str(cert),
                         TROUPE_TLS_KEY=str(key))
    port = server.url.rsplit(":", 1)[1]
    lan_url = f"https://{HOST_SIDE}:{port}"
    printed = server.printed("Reachable on this network at")
    assert lan_url in printed and "http://" not in printed
    assert server.url.startswith("https://") and server.get("/api/info")["name"] == "troupe"  # its own terminal
    local = subprocess.run(troupe_cmd("ls"), cwd=REPO, env=base_env(server.home), capture_output=True, text=True,
                           timeout=60)
    assert local.returncode == 0, local.stderr
    plain = student(lan, tmp_path / "plain", "login", f"http://{HOST_SIDE}:{port}/?token=x")
    assert plain.returncode != 0  # the port speaks TLS only

    made = subprocess.run(troupe_cmd("open", "--uses", "2", "--no-browser"), cwd=REPO, env=base_env(server.home),
                          capture_output=True, text=True, timeout=60)
    link = f"{lan_url}/?{made.stdout.strip().split('?', 1)[1]}"
    assert made.stdout.startswith("https://")
    refused = student(lan, tmp_path / "ann", "login", link)
    assert refused.returncode != 0 and "CERTIFICATE_VERIFY_FAILED" in refused.stderr
    assert "--ca FILE" in refused.stderr and "no troupe server answers" not in refused.stderr, refused.stderr
    logged = student(lan, tmp_path / "ann", "login", link, "--ca", str(cert))
    assert logged.returncode == 0, logged.stderr
    ran = student(lan, tmp_path / "ann", "run", str(REPO / "examples" / "hello.json"))
    assert ran.returncode == 0 and "Result          succeeded" in ran.stdout, ran.stderr

    # A worker on that machine: the join command carries https, the agent --ca.
    status, join = server.client.request("POST", "/api/workers/enrollments", {"name": "far", "uses": 2})
    assert status == 201 and join["command"].startswith("troupe agent start --url https://"), join
    token = join["command"].split("--token ")[1].split()[0]
    args = ("agent", "start", "--url", lan_url, "--token", token, "--foreground", "--one-shot", "--idle-timeout", "60")
    agent_home = tmp_path / "worker"
    untrusting = student(lan, agent_home, *args)
    assert untrusting.returncode != 0 and "CERTIFICATE_VERIFY_FAILED" in untrusting.stderr + untrusting.stdout
    env = {**base_env(agent_home), "XDG_CONFIG_HOME": str(agent_home / "config"), "HOME": str(agent_home),
           "XDG_STATE_HOME": str(agent_home / "state"),
           "TROUPE_SIMULATED_INVENTORY": json.dumps({"machine_id": "far-1", "cpus": 2, "cards": []})}
    agent = subprocess.Popen(["ip", "netns", "exec", lan, *troupe_cmd(*args, "--ca", str(cert))], cwd=REPO,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert agent.stdout is not None
        for line in agent.stdout:
            if "connected as far" in line:
                break
        run = server.submit(hello(), target={"worker": "far"})
        assert agent.wait(120) == 0, agent.stdout.read() if agent.stdout else ""
        done = server.get(f"/api/runs/{run['run_id']}")
        assert done["status"] == "succeeded" and done["worker"] == "far", done
    finally:
        if agent.poll() is None:
            agent.kill()
