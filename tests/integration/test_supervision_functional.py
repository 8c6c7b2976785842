"""Supervision of a real control plane in this process: a queue key that crashes is
restarted and rebuilt; one that keeps crashing is quarantined, visibly."""

from __future__ import annotations

import asyncio

import aiohttp

from protocol.settings import Settings
from subprocess_runner.catalog import load_catalog
from supervisors.root import ControlPlane
from tests.helpers import hello, sleeper


class Garbage:
    """A message no actor defines."""


async def start_plane(tmp_path, **overrides):
    settings = Settings(home=tmp_path, port=0, **overrides)
    plane = ControlPlane(settings, load_catalog(), "test")
    await plane.start()
    session = aiohttp.ClientSession(f"http://127.0.0.1:{plane.port}",
                                    headers={"Authorization": f"Bearer {plane.token}"})
    return plane, session


async def submit(session, graph, expect=201):
    async with session.post("/api/runs", json={"graph": graph}) as response:
        body = await response.json()
        assert response.status == expect, body
        return body


async def status_of(session, run_id):
    async with session.get(f"/api/runs/{run_id}") as response:
        return (await response.json())["status"]


async def until(predicate, timeout=10.0):
    async with asyncio.timeout(timeout):
        while not await predicate():
            await asyncio.sleep(0.01)


async def test_a_crashed_queue_is_restarted_and_keeps_its_fifo(tmp_path):
    plane, session = await start_plane(tmp_path, run_queue_max_concurrent_cpu=1)
    try:
        first = (await submit(session, sleeper()))["run_id"]
        second = (await submit(session, hello()))["run_id"]
        await until(lambda: _is(session, first, "running"))
        old = plane.registry.lookup("queues/cpu")
        old.tell(Garbage())
        await old.wait()
        await until(lambda: _alive(plane, "queues/cpu", old))
        assert await status_of(session, second) == "queued"
        async with session.get("/api/queues") as response:
            (queue,) = (await response.json())["queues"]
        assert queue["running"] == 1 and queue["queued"] == 1 and queue["state"] == "ok"
        async with session.post(f"/api/runs/{first}/cancel"):
            pass
        await until(lambda: _is(session, second, "succeeded"))
    finally:
        await session.close()
        await plane.stop()


async def test_a_queue_that_keeps_crashing_is_quarantined_with_its_reason(tmp_path):
    plane, session = await start_plane(tmp_path)
    try:
        await submit(session, hello())
        for _ in range(6):
            ref = plane.registry.lookup("queues/cpu")
            if ref is None:
                break
            ref.tell(Garbage())
            await ref.wait()
            await asyncio.sleep(0.01)
        async with session.get("/api/queues") as response:
            (queue,) = (await response.json())["queues"]
        assert queue["state"] == "quarantined" and "unknown message" in queue["reason"]
        refused = await submit(session, hello(), expect=503)
        assert refused["error"]["code"] == "queue_quarantined"
        async with session.get("/api/info") as response:
            runtime = (await response.json())["runtime"]
        assert runtime["torch_imported"] is False
    finally:
        await session.close()
        await plane.stop()


async def _is(session, run_id, status):
    return await status_of(session, run_id) == status


async def _alive(plane, name, old):
    ref = plane.registry.lookup(name)
    return ref is not None and ref is not old
