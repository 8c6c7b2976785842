"""A worker's artifact outbox against a real server (the actor driven by messages, its
uploads real HTTP): a name near 255 bytes is stored, a file refused each time it is sent
is given up and its row says ``failed`` with the reason, and neither holds up the files
behind it; the outbox says ``full`` once the next file like those it keeps cannot fit."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.helpers import sleeper
from tests.integration.test_hardening_functional import assigned, forger
from troupe.actors.artifact_outbox import ArtifactOutbox, Usage, Wake
from troupe.subprocess_runner import outbox


async def _artifacts(server, run_id: str) -> dict[str, dict]:
    row = await asyncio.to_thread(server.get, f"/api/runs/{run_id}")
    return {a["path"]: a for a in row["artifacts"]}


async def _until(server, run_id: str, predicate, timeout: float = 40.0) -> dict[str, dict]:
    deadline = time.monotonic() + timeout
    while True:
        found = await _artifacts(server, run_id)
        if predicate(found):
            return found
        assert time.monotonic() < deadline, found
        await asyncio.sleep(0.1)


@pytest.mark.timeout(90)
async def test_a_refused_file_is_given_up_as_failed_without_holding_up_the_others(shared_server, tmp_path):
    session, ws = await forger(shared_server, "outboxer")
    try:
        run_id = shared_server.submit(sleeper(60), target={"worker": "outboxer"})["run_id"]
        await assigned(ws)
        folder, run_dir = tmp_path / "outbox", tmp_path / "run"
        (run_dir / "checkpoints").mkdir(parents=True)
        long_name = "checkpoints/" + "c" * 250  # 250 bytes: allowed, and once a 500 for ever
        tampered, behind = "checkpoints/tampered.pt", "checkpoints/behind.pt"
        for path in (long_name, tampered, behind):
            (run_dir / path).write_bytes(path.encode() * 10)
            entry = outbox.put(folder, run_id, run_dir / path, path, "checkpoint", None, 10**9)
            if path == tampered:
                entry.data.write_bytes(b"x" * entry.size)  # not what its sha256 says: refused each time
            await asyncio.sleep(0.02)  # oldest first: the tampered file stands before the last one
        box = ArtifactOutbox(folder, 10**9, {"url": shared_server.url, "credential": shared_server.token}).start()
        found = await _until(shared_server, run_id, lambda rows: behind in rows)
        assert found[long_name]["state"] == "stored" and found[behind]["state"] == "stored"
        assert tampered not in found  # still being tried: it waits on its own, not in front of the others
        found = await _until(shared_server, run_id, lambda rows: tampered in rows)
        assert found[tampered]["state"] == "failed" and "refused 5 times" in found[tampered]["reason"], found
        assert outbox.entries(folder) == []
        box.stop()
        await box.wait()
    finally:
        await session.close()
        shared_server.client.request("POST", f"/api/runs/{run_id}/cancel")


async def test_the_outbox_is_full_once_the_next_file_like_its_own_cannot_fit(tmp_path):
    folder = tmp_path / "outbox"
    source = tmp_path / "weights.pt"
    source.write_bytes(b"w" * 600)
    box = ArtifactOutbox(folder, 1000, {"url": "http://127.0.0.1:9"}).start()  # nothing answers there
    assert await box.ask(Usage()) == (0, 0, False)
    outbox.put(folder, "a" * 32, source, "checkpoints/1.pt", "checkpoint", None, 1000)
    with pytest.raises(outbox.OutboxFull):  # a second one is refused by the child...
        outbox.put(folder, "a" * 32, source, "checkpoints/2.pt", "checkpoint", None, 1000)
    box.tell(Wake())
    assert await box.ask(Usage()) == (600, 1, True)  # ...so the agent must say it takes no runs
    box.stop()
    await box.wait()
