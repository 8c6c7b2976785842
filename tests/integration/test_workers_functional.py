"""Worker agents against a real control plane: enrollment, handshake, liveness, revoke.
Agents are real processes with simulated inventories; they dial out and never listen."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import aiohttp
import pytest

from tests.helpers import REPO, base_env, run_event, troupe_cmd
from troupe.protocol import worker as wire
from troupe.protocol.version import __version__

CARD = {"uuid": "GPU-aaaa", "name": "Fake 16G", "index": 0, "memory_total_mib": 16000, "memory_free_mib": 15000}


def agent_env(server, tmp_path: Path, machine: str = "machine-1", cards: tuple[dict, ...] = (CARD,),
              mps: bool = False, **settings: str) -> dict[str, str]:
    env = base_env(server.home, **settings)
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # fetched uploads: each agent its own
    env["TROUPE_SIMULATED_INVENTORY"] = json.dumps({"machine_id": machine, "cpus": 2, "cards": list(cards),
                                                    "mps": mps})
    return env


def enroll(server, **body):
    status, reply = server.client.request("POST", "/api/workers/enrollments", body)
    assert status == 201, reply
    return reply


def start_agent(server, tmp_path, command: str, machine: str = "machine-1", **env_options):
    args = [*command.split()[1:], "--foreground"]  # drop "troupe"; keep it attached to read its output
    return subprocess.Popen(troupe_cmd(*args), cwd=REPO, env=agent_env(server, tmp_path, machine, **env_options),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def worker_state(server, name):
    rows = {w["name"]: w for w in server.get("/api/workers")["workers"]}
    return rows.get(name)


def read_until(proc, text):
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError("".join(lines))


def listening_inodes() -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A":  # LISTEN
                inodes.add(fields[9])
    return inodes


def socket_inodes(pid: int) -> set[str]:
    found = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(target[8:-1])
    return found


def test_an_agent_enrolls_once_connects_and_never_listens(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    join = enroll(server, name="gpu-a")
    assert join["command"] == f"troupe agent start --url {server.url} --token {join['token']} --name gpu-a"
    agent = start_agent(server, tmp_path, join["command"])
    try:
        read_until(agent, "connected as gpu-a")
        worker = worker_state(server, "gpu-a")
        assert worker["state"] == "connected" and worker["version"] == __version__
        assert worker["machine_id"] == "machine-1" and worker["devices"] == ["cpu", "cuda:0"]
        assert worker["degraded"] is False and worker["cards"][0]["uuid"] == "GPU-aaaa"
        assert not socket_inodes(agent.pid) & listening_inodes()
        stored = json.loads((tmp_path / "config" / "troupe" / "agent-credentials.json").read_text())
        assert list(stored) == [f"{server.url}|gpu-a"]
        assert oct((tmp_path / "config" / "troupe" / "agent-credentials.json").stat().st_mode & 0o777) == "0o600"
        # The token was for one use only.
        status, reply = server.anonymous.request("POST", "/api/workers/credentials",
                                                 {"token": join["token"], "machine_id": "other"})
        assert status == 401 and reply["error"]["code"] == "enrollment_refused" and "already used" in reply[
            "error"]["message"]
    finally:
        agent.terminate()
        agent.wait(30)


def test_a_killed_agent_becomes_disconnected_and_a_restart_reuses_its_credential(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    join = enroll(server, name="gpu-b")
    agent = start_agent(server, tmp_path, join["command"])
    read_until(agent, "connected as gpu-b")
    agent.kill()
    agent.wait(10)
    # The socket closing marks the worker disconnected (a killed process's socket is closed by the kernel).
    for _ in range(200):
        if worker_state(server, "gpu-b")["state"] == "disconnected":
            break
        subprocess.run(["sleep", "0.05"])
    assert worker_state(server, "gpu-b")["state"] == "disconnected"
    again = start_agent(server, tmp_path, f"troupe agent start --url {server.url}")
    try:
        read_until(again, "connected as gpu-b")
        assert worker_state(server, "gpu-b")["state"] == "connected"
    finally:
        again.terminate()
        again.wait(30)


def test_an_expired_or_unknown_token_makes_the_agent_exit_1_at_once(make_server, tmp_path):
    server = make_server()
    join = enroll(server, ttl_s=0.001)
    agent = start_agent(server, tmp_path, join["command"])
    output, _ = agent.communicate(timeout=60)
    assert agent.returncode == 1 and "expired" in output
    agent = start_agent(server, tmp_path, f"troupe agent start --url {server.url} --token nope")
    output, _ = agent.communicate(timeout=60)
    assert agent.returncode == 1 and "unknown" in output


def test_revoking_a_worker_stops_its_agent(make_server, tmp_path):
    server = make_server()
    join = enroll(server, name="gpu-c")
    agent = start_agent(server, tmp_path, join["command"])
    read_until(agent, "connected as gpu-c")
    status, _ = server.client.request("DELETE", "/api/workers/gpu-c")
    assert status == 200
    output, _ = agent.communicate(timeout=60)
    assert agent.returncode == 1 and "revoked" in output
    assert worker_state(server, "gpu-c") is None
    status, reply = server.client.request("DELETE", "/api/workers/gpu-c")
    assert status == 404 and reply["error"]["code"] == "worker_not_found"


def hello(**overrides) -> str:
    from troupe.subprocess_runner.catalog import load_catalog
    from troupe.subprocess_runner.devices import host_machine_id

    catalog = load_catalog()
    # The server's own machine id: the session token is accepted only from this machine.
    frame = wire.Hello(version=__version__, name="probe", machine_id=host_machine_id(), catalog_digest=catalog.digest,
                       node_types=sorted(catalog.types), inventory=wire.Inventory(cpus=1))
    return frame.model_copy(update=overrides).model_dump_json()


async def handshake(server, frame: str, token: str | None = None) -> object:
    url = server.url.replace("http://", "ws://") + "/ws/worker"
    headers = {"Authorization": f"Bearer {token or server.token}"}
    async with aiohttp.ClientSession() as session, session.ws_connect(url, headers=headers) as ws:
        await ws.send_str(frame)
        message = await ws.receive(timeout=10)
        return wire.parse_frame(message.data)


async def test_another_version_is_refused_with_both_versions(shared_server):
    answer = await handshake(shared_server, hello(version="0.0.1"))
    assert isinstance(answer, wire.Refused) and answer.code == "version_mismatch"
    assert __version__ in answer.reason and "0.0.1" in answer.reason


async def test_another_catalog_is_degraded_and_names_what_it_lacks(shared_server):
    answer = await handshake(shared_server, hello(catalog_digest="different", node_types=["core.Constant"]))
    assert isinstance(answer, wire.Welcome) and answer.degraded is True
    assert "core.Add" in answer.missing_node_types and "core.Constant" not in answer.missing_node_types


async def test_a_bad_credential_or_frame_is_refused(shared_server):
    answer = await handshake(shared_server, hello(), token="not-a-credential")
    assert isinstance(answer, wire.Refused) and "unknown" in answer.reason
    answer = await handshake(shared_server, '{"type": "nonsense"}')
    assert isinstance(answer, wire.Refused) and answer.code == "bad_handshake"


@pytest.mark.parametrize("body, pointer", [({"ttl_s": 0}, "/ttl_s"), ({"uses": 0}, "/uses"),
                                           ({"name": "Bad Name"}, "/name")])
def test_bad_enrollment_requests_are_400(shared_server, body, pointer):
    status, reply = shared_server.client.request("POST", "/api/workers/enrollments", body)
    assert status == 400 and reply["error"]["pointer"] == pointer


def test_agent_forget_and_stop(make_server, tmp_path):
    server = make_server()
    join = enroll(server, name="gpu-d")
    agent = start_agent(server, tmp_path, join["command"])
    read_until(agent, "connected as gpu-d")
    env = agent_env(server, tmp_path)
    stopped = subprocess.run(troupe_cmd("agent", "stop", "--name", "gpu-d"), cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    assert agent.wait(30) == 0
    forgot = subprocess.run(troupe_cmd("agent", "forget", "--name", "gpu-d"), cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=60)
    assert forgot.returncode == 0 and "gpu-d" in forgot.stdout
    again = subprocess.run(troupe_cmd("agent", "start", "--url", server.url), cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "no stored credential" in again.stderr


async def test_a_worker_cannot_send_the_events_the_control_plane_owns(shared_server):
    url = shared_server.url.replace("http://", "ws://") + "/ws/worker"
    headers = {"Authorization": f"Bearer {shared_server.token}"}
    async with aiohttp.ClientSession() as session, session.ws_connect(url, headers=headers) as ws:
        await ws.send_str(hello(name="forger"))
        assert isinstance(wire.parse_frame((await ws.receive(timeout=10)).data), wire.Welcome)
        await ws.send_str(run_event("0" * 32, 1, "run_finished", {"status": "succeeded"}))
        closing = await ws.receive(timeout=10)
        assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        assert ws.close_code == wire.CLOSE_PROTOCOL


async def test_heartbeats_are_acked_and_a_frame_sent_twice_is_dropped(shared_server):
    url = shared_server.url.replace("http://", "ws://") + "/ws/worker"
    headers = {"Authorization": f"Bearer {shared_server.token}"}
    async with aiohttp.ClientSession() as session, session.ws_connect(url, headers=headers) as ws:
        await ws.send_str(hello(name="numbered", frame_no=1))
        welcome = wire.parse_frame((await ws.receive(timeout=10)).data)
        assert isinstance(welcome, wire.Welcome) and welcome.frame_no == 1
        await ws.send_str(wire.dump_frame(wire.Heartbeat(), 2))
        first = wire.parse_frame((await ws.receive(timeout=10)).data)
        assert isinstance(first, wire.Ack) and first.upto == 2
        await ws.send_str(wire.dump_frame(wire.Heartbeat(), 2))  # a duplicate: no answer
        await ws.send_str(wire.dump_frame(wire.Heartbeat(), 3))
        second = wire.parse_frame((await ws.receive(timeout=10)).data)
        assert isinstance(second, wire.Ack) and second.upto == 3 and second.frame_no > first.frame_no
