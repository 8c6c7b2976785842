"""Supervision of a real control plane in this process: a queue key that crashes is
restarted and rebuilt; one that keeps crashing is quarantined, visibly."""

from __future__ import annotations

import asyncio

import aiohttp

from tests.helpers import hello, sleeper
from troupe.protocol.settings import Settings
from troupe.subprocess_runner.catalog import load_catalog
from troupe.supervisors.root import ControlPlane


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

        async def queue_state():
            async with session.get("/api/queues") as response:
                (queue,) = (await response.json())["queues"]
            return queue

        for _ in range(6):
            ref = plane.registry.lookup("queues/cpu")
            assert ref is not None
            ref.tell(Garbage())
            await ref.wait()

            async def restarted_or_quarantined(old=ref):
                return await _alive(plane, "queues/cpu", old) or (await queue_state())["state"] == "quarantined"

            await until(restarted_or_quarantined)
        queue = await queue_state()
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


async def crash_until_gone(plane, name: str) -> None:
    """Sends garbage to the actor ``name`` (and to each restart of it) until its
    supervisor gives up and no actor of that name is left."""
    for _ in range(50):
        ref = plane.registry.lookup(name)
        if ref is None:
            return
        ref.tell(Garbage())
        await ref.wait()
        await asyncio.sleep(0.01)  # the supervisor restarts it, or gives up
    raise AssertionError(f"{name} was restarted forever")


async def test_a_worker_connection_that_keeps_crashing_shows_failed_with_its_reason(tmp_path):
    plane, session = await start_plane(tmp_path)
    try:
        async with session.post("/api/workers/enrollments", json={"name": "gpu-x"}) as response:
            token = (await response.json())["token"]
        async with session.post("/api/workers/credentials", json={"token": token, "machine_id": "m"}) as response:
            assert response.status == 201
        plane.start_worker("gpu-x")
        await crash_until_gone(plane, "workers/gpu-x")
        async with session.get("/api/workers") as response:
            (row,) = (await response.json())["workers"]
        assert row["state"] == "failed" and "crashed repeatedly" in row["failed_reason"]
    finally:
        await session.close()
        await plane.stop()


async def test_a_study_that_keeps_crashing_is_failed_with_its_reason(tmp_path):
    plane, session = await start_plane(tmp_path)
    body = {"name": "s", "base_graph": sleeper(30), "repeats": 1, "budget": {},
            "variants": [{"name": "v", "params": [{"node_id": "z", "param": "seconds", "value": 30}]}],
            "objective": {"metric": "val_loss", "direction": "minimize"}}
    try:
        async with session.post("/api/studies", json=body) as response:
            study = await response.json()
            assert response.status == 201, study
        await crash_until_gone(plane, f"studies/{study['id']}")
        await plane.store.drain()
        async with session.get(f"/api/studies/{study['id']}") as response:
            row = await response.json()
        assert row["state"] == "failed" and "crashed repeatedly" in row["halt_reason"]
    finally:
        await session.close()
        await plane.stop()


async def test_a_restarted_placer_rebuilds_lanes_and_the_seed_gate_before_admitting(tmp_path):
    plane, session = await start_plane(tmp_path, run_interactive_max_concurrent=1,
                                       run_queue_max_concurrent_cpu=4)
    try:
        interactive = {"graph": sleeper(30), "options": {"lane": "interactive", "editor_session": "e1"}}
        async with session.post("/api/runs", json=interactive) as response:
            first = await response.json()
        seeded = {"graph": sleeper(30), "options": {"seed": 7}}
        async with session.post("/api/runs", json=seeded) as response:
            gated = await response.json()
        while await status_of(session, first["run_id"]) != "running":
            await asyncio.sleep(0.05)
        placer = plane.registry.lookup("placer")
        placer.tell(Garbage())  # it crashes; the root restarts it
        await placer.wait()
        while plane.registry.lookup("placer") is None:
            await asyncio.sleep(0.01)
        async with session.post("/api/runs", json={**interactive, "options": {**interactive["options"],
                                                                              "editor_session": "e2"}}) as response:
            refused = await response.json()
        assert response.status == 503 and refused["error"]["code"] == "interactive_lane_full"
        # The seeded run still waits for the gate; nothing was started twice.
        assert await status_of(session, gated["run_id"]) == "queued"
        async with session.post(f"/api/runs/{first['run_id']}/cancel") as response:
            assert response.status == 200
        for _ in range(200):
            if await status_of(session, gated["run_id"]) == "running":
                break
            await asyncio.sleep(0.05)
        assert await status_of(session, gated["run_id"]) == "running"
    finally:
        await session.close()
        await plane.stop()
