"""The agent's RunProcess, by messages: a run whose packs cannot be unpacked here (a full
disk under the pack cache) ends ``failed`` saying why, instead of a crashed actor and a run
the control plane waits on for ever."""

from __future__ import annotations

import asyncio
import errno

from troupe.actors.run_process import RunProcess
from troupe.protocol import worker as wire


class _FullDisk:
    """The agent's packs, on a disk with no room left."""

    def paths_for(self, packs):
        raise OSError(errno.ENOSPC, "No space left on device")


async def test_a_pack_that_cannot_be_unpacked_here_fails_the_run_saying_why():
    sent: list = []
    assign = wire.Assign(run_id="1" * 32, graph={}, devices=["cpu"], packs={"mine": "0" * 64})
    actor = RunProcess(assign, lambda *frames: sent.extend(frames), packs=_FullDisk())
    ref = actor.start()
    await asyncio.wait_for(ref.wait(), 10)
    (ended,) = sent
    assert isinstance(ended, wire.RunEnded) and ended.status == "failed"
    assert "could not be unpacked" in ended.error and "No space left" in ended.error
