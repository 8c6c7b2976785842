"""A worker socket that misbehaves in time rather than in shape: an ``ended`` frame numbered
below what its run applied ends nothing and the run's real end still counts; pings do not
hold an unauthenticated socket open past the hello's deadline; a peer that leaves before
its hello leaves no traceback behind."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.helpers import sleeper
from tests.integration.test_hardening_functional import forger
from tests.integration.test_workers_functional import enroll
from tests.integration.test_workers_functional import hello as agent_hello
from troupe.protocol import worker as wire


async def next_frame(ws, kind):
    while True:
        frame = wire.parse_frame((await ws.receive(timeout=10)).data)
        if isinstance(frame, kind):
            return frame


async def assigned(make_server):
    """A server, a same-machine agent socket ``w1`` and a run assigned to it."""
    server = make_server()
    session, ws = await forger(server, name="w1")
    run_id = server.submit(sleeper(30), target={"worker": "w1"})["run_id"]
    assert (await next_frame(ws, wire.Assign)).run_id == run_id
    return server, session, ws, run_id


@pytest.mark.timeout(60)
async def test_an_ended_frame_numbered_below_what_was_applied_ends_nothing(make_server):
    server, session, ws, run_id = await assigned(make_server)
    try:
        started = [("node_started", "z", "{}")] * 5
        await ws.send_str(wire.RunEvents(frame_no=1, run_id=run_id, counter=5, events=started).model_dump_json())
        await ws.send_str(wire.RunEnded(frame_no=2, run_id=run_id, counter=3, status="failed").model_dump_json())
        await ws.send_str(wire.RunEnded(frame_no=3, run_id=run_id, counter=6, status="succeeded").model_dump_json())
        assert server.events_until_finished(run_id)[-1]["payload"]["status"] == "succeeded"
    finally:
        await session.close()


# A credential is checked with the hello; a socket without any is refused before the upgrade (401).
UNCHECKED = {"Authorization": "Bearer not-checked-before-the-hello"}


@pytest.mark.timeout(60)
async def test_pings_do_not_hold_a_socket_that_never_says_hello(make_server):
    server = make_server()
    async with aiohttp.ClientSession() as session, session.ws_connect(
            server.url.replace("http://", "ws://") + "/ws/worker", autoping=True, headers=UNCHECKED) as ws:

        async def keep_pinging():
            while not ws.closed:
                await ws.ping()
                await asyncio.sleep(1)

        pinging = asyncio.ensure_future(keep_pinging())
        try:
            refused = await ws.receive(timeout=30)  # the hello's deadline is 10 s, pings or not
            assert refused.type == aiohttp.WSMsgType.TEXT
            assert wire.parse_frame(refused.data).code == "bad_handshake"
        finally:
            pinging.cancel()


async def test_a_peer_that_leaves_before_its_hello_leaves_no_traceback(make_server):
    server = make_server()
    for _ in range(3):
        async with aiohttp.ClientSession() as session:
            ws = await session.ws_connect(server.url.replace("http://", "ws://") + "/ws/worker", headers=UNCHECKED)
            await ws.close()
    assert server.client.request("GET", "/api/workers")[0] == 200
    server.stop()
    assert "Traceback" not in "".join(server.output), "".join(server.output)[-3000:]


@pytest.mark.timeout(60)
async def test_a_payload_written_over_several_lines_streams_as_one_event(make_server):
    server, session, ws, run_id = await assigned(make_server)
    try:
        text = '{"message":\n\r\n"on one line"}'  # line breaks between JSON tokens are JSON
        await ws.send_str(wire.RunEvents(frame_no=1, run_id=run_id, counter=1, events=[("log", None, text)])
                          .model_dump_json())
        await ws.send_str(wire.RunEnded(frame_no=2, run_id=run_id, counter=2, status="succeeded").model_dump_json())
        events = server.events_until_finished(run_id)  # a data: line cut in two would not parse
        assert [e["payload"]["message"] for e in events if e["type"] == "log"] == ["on one line"]
    finally:
        await session.close()


async def test_a_run_cancelled_while_its_worker_is_away_leaves_its_queue(make_server):
    server = make_server()
    token = enroll(server, name="w1")["token"]
    credential = server.anonymous.request("POST", "/api/workers/credentials",
                                          {"token": token, "machine_id": "m1"})[1]["credential"]
    async with aiohttp.ClientSession() as session, session.ws_connect(
            server.url.replace("http://", "ws://") + "/ws/worker",
            headers={"Authorization": f"Bearer {credential}"}) as ws:
        await ws.send_str(agent_hello(name="w1", machine_id="m1"))
        assert isinstance(wire.parse_frame((await ws.receive(timeout=10)).data), wire.Welcome)
    server.poll_until(lambda: next(w for w in server.get("/api/workers")["workers"] if w["name"] == "w1")["state"]
                      != "connected")

    def queued() -> int:
        return sum(q["queued"] for q in server.get("/api/queues")["queues"] if q["queue_key"].startswith("w1/"))

    run_id = server.submit(sleeper(1), target={"worker": "w1"})["run_id"]  # parked until w1 is back
    server.poll_until(lambda: queued() == 1)
    assert server.client.request("POST", f"/api/runs/{run_id}/cancel")[0] == 200
    server.wait_status(run_id, "cancelled")
    server.poll_until(lambda: queued() == 0, timeout=10)
