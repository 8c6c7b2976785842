"""WorkerConnection by messages: it answers the hello, routes run frames only for runs
assigned to its worker, batches acknowledgements of persisted frames, and owns the
disconnect grace, rebind and adoption. Its peers are stand-ins that record what they get."""

from __future__ import annotations

import asyncio
import json

from tests.unit.stand_ins import Inbox
from troupe.actors.base import Registry, Shutdown, Snapshot
from troupe.actors.placer.messages import Reannounce, WorkerOffline, WorkerOnline
from troupe.actors.run_messages import WorkerBack, WorkerFrames, WorkerGone, WorkerLost
from troupe.actors.worker import (
    CLOSE,
    Adopted,
    AssignRun,
    Attached,
    CancelOnWorker,
    Detached,
    FromWorker,
    Persisted,
    WorkerConnection,
)
from troupe.protocol import worker as wire

CARD = wire.Card(uuid="GPU-1", name="Fake", index=0, memory_total_mib=16000, memory_free_mib=15000)



async def settle(connection, *inboxes) -> None:
    await connection.ask(Snapshot())
    for inbox in inboxes:
        await inbox.settled()


def hello(*runs: str, node_types=("core.Add", "core.Sleep"), digest="d1") -> wire.Hello:
    return wire.Hello(version="v", name="gpu-a", machine_id="m1", catalog_digest=digest, node_types=list(node_types),
                      inventory=wire.Inventory(cpus=4, cards=[CARD]), runs=list(runs))


def event(run_id: str, counter: int) -> wire.RunEvents:
    return wire.RunEvents(run_id=run_id, counter=counter, events=[("log", None, f'{{"message": "{counter}"}}')])


async def frames(outbox: asyncio.Queue, count: int, timeout: float = 5.0) -> list:
    return [await asyncio.wait_for(outbox.get(), timeout) for _ in range(count)]


async def setup(grace_s: float = 30.0, runs: tuple[str, ...] = ("r1", "r2"), heartbeat_s: float = 1.0):
    registry = Registry()
    placer = Inbox("placer")
    placer.start(registry)
    inboxes = {}
    for run_id in runs:
        inboxes[run_id] = Inbox(f"runs/{run_id}")
        inboxes[run_id].start(registry)
    connection = WorkerConnection("gpu-a", heartbeat_s=heartbeat_s, grace_s=grace_s, registry=registry,
                                  catalog_types=frozenset({"core.Add", "core.Sleep", "core.Fail"}),
                                  catalog_digest="d1").start(registry)
    return connection, placer, inboxes


async def test_the_hello_is_answered_and_the_placer_learns_what_the_worker_offers():
    connection, placer, _ = await setup()
    outbox: asyncio.Queue = asyncio.Queue()
    connection.tell(Attached(hello(digest="d2"), outbox))
    (welcome,) = await frames(outbox, 1)
    assert isinstance(welcome, wire.Welcome) and welcome.degraded and welcome.missing_node_types == ["core.Fail"]
    await settle(connection, placer)
    (online,) = placer.got
    assert isinstance(online, WorkerOnline) and online.offer.devices == ("cpu", "cuda:0")
    assert online.offer.node_types == frozenset({"core.Add", "core.Sleep"}) and online.devices["cuda:0"][0] == "GPU-1"
    snapshot = await connection.ask(Snapshot())
    assert snapshot["state"] == "connected" and snapshot["missing_node_types"] == ["core.Fail"]


async def test_run_frames_reach_only_the_runs_assigned_to_this_worker():
    connection, _, runs = await setup()
    outbox: asyncio.Queue = asyncio.Queue()
    connection.tell(Attached(hello(), outbox))
    await frames(outbox, 1)
    connection.tell(AssignRun("r1", wire.Assign(run_id="r1", graph={}, devices=["cuda:0"])))
    connection.tell(FromWorker((event("r1", 1),)))
    connection.tell(FromWorker((event("r2", 1),)))  # a live run, not this worker's
    await settle(connection, runs["r1"], runs["r2"])
    assert runs["r1"].got == [WorkerFrames("gpu-a", (event("r1", 1),))]
    assert runs["r2"].got == []


async def test_persisted_frames_are_acknowledged_in_batches_and_unheld_runs_at_once():
    connection, _, _ = await setup()
    outbox: asyncio.Queue = asyncio.Queue()
    connection.tell(Attached(hello(), outbox))
    await frames(outbox, 1)
    for run in ("r1", "r2"):
        connection.tell(AssignRun(run, wire.Assign(run_id=run, graph={}, devices=["cpu"])))
    await frames(outbox, 2)
    connection.tell(Persisted("r1", 3, frames=3))
    connection.tell(Persisted("r1", 5, frames=2))
    (ack,) = await frames(outbox, 1)  # one ack, a second after the first
    assert ack == wire.Ack(upto=0, runs={"r1": 5})
    connection.tell(Persisted("r2", 300, frames=300))  # past 256 frames: at once
    (ack,) = await frames(outbox, 1, timeout=0.5)
    assert ack.runs == {"r2": 300}
    connection.tell(FromWorker((wire.RunEnded(run_id="r1", counter=6, status="succeeded"),)))
    connection.tell(Persisted("r1", 6, frames=1, ended=True))  # a run's end: at once
    (ack,) = await frames(outbox, 1, timeout=0.5)
    assert ack.runs == {"r1": 6}
    connection.tell(FromWorker((event("gone", 7),)))  # no RunActor holds it: the agent may forget it
    connection.tell(FromWorker((wire.Heartbeat(frame_no=9),)))  # a heartbeat flushes
    (ack,) = await frames(outbox, 1)
    assert ack == wire.Ack(upto=9, runs={"gone": 7})


async def test_a_stopping_server_never_acknowledges_frames_of_runs_it_no_longer_holds():
    # A stop that leaves worker runs going stops their actors first: frames arriving
    # then belong to the next start, which adopts the runs; an ack would lose them.
    connection, _, _ = await setup()
    outbox: asyncio.Queue = asyncio.Queue()
    connection.tell(Attached(hello(), outbox))
    await frames(outbox, 1)
    connection.tell(Adopted("left", "cuda:0"))
    connection.tell(Shutdown(leave_worker_runs=True))
    connection.tell(FromWorker((event("left", 4),)))
    connection.tell(FromWorker((wire.Heartbeat(frame_no=9),)))
    (ack,) = await frames(outbox, 1)
    assert ack == wire.Ack(upto=9, runs={})


async def test_a_reconnect_within_the_grace_rebinds_reported_runs_and_loses_the_rest():
    connection, placer, runs = await setup(runs=("r1", "r2", "r3"))
    first: asyncio.Queue = asyncio.Queue()
    connection.tell(Attached(hello(), first))
    await frames(first, 1)
    for run_id in ("r1", "r2"):
        connection.tell(AssignRun(run_id, wire.Assign(run_id=run_id, graph={})))
    connection.tell(Detached(first))
    connection.tell(CancelOnWorker("r1"))  # asked while the link is down: sent on the return
    assert (await connection.ask(Snapshot()))["state"] == "disconnected"
    await settle(connection, placer, runs["r1"])
    assert [type(m) for m in runs["r1"].got] == [WorkerGone]
    assert isinstance(placer.got[-1], WorkerOffline)
    second: asyncio.Queue = asyncio.Queue()
    connection.tell(Attached(hello("r1", "r3"), second))  # r2 is gone from the agent; r3 was never its
    got = await frames(second, 3)
    assert isinstance(got[0], wire.Welcome)
    assert got[1:] == [wire.KillRun(run_id="r3"), wire.CancelRun(run_id="r1")]
    await settle(connection, *runs.values())
    assert runs["r1"].got[-1] == WorkerBack("gpu-a") and runs["r2"].got[-1] == WorkerLost()
    assert runs["r3"].got == []
    assert (await connection.ask(Snapshot()))["running_runs"] == ["r1"]


async def test_an_adopted_run_waits_for_its_worker_and_is_lost_past_the_grace():
    connection, _, runs = await setup(grace_s=0.2, runs=("r1",))
    connection.tell(Adopted("r1", "cuda:0"))  # started by the root, with no socket yet
    assert (await connection.ask(Snapshot()))["state"] == "disconnected"
    exit_ = await asyncio.wait_for(connection.wait(), 5)
    await runs["r1"].settled()
    assert exit_.reason == "grace expired" and runs["r1"].got == [WorkerLost()]


async def test_three_missed_heartbeats_close_the_socket_and_the_view_says_disconnected_at_once():
    connection, placer, _ = await setup(heartbeat_s=0.05)
    outbox: asyncio.Queue = asyncio.Queue()
    connection.tell(Attached(hello(), outbox))
    await frames(outbox, 1)  # the welcome; then nothing is heard of the agent
    assert await frames(outbox, 1) == [CLOSE]
    await settle(connection, placer)
    await asyncio.sleep(0)  # the view is published on the loop's next turn
    # Read before the handler's Detached comes, which no test sends here.
    assert connection.view.as_json()["state"] == "disconnected"
    assert isinstance(placer.got[-1], WorkerOffline)


async def test_a_beating_worker_stays_and_one_back_from_away_is_watched_by_its_heartbeats_again():
    # One timer, armed for the next deadline: beats move it on; away, it is the grace's end
    # (30 s here); back, three heartbeats again.
    connection, _, _ = await setup(grace_s=30.0, heartbeat_s=0.2)
    first: asyncio.Queue = asyncio.Queue()
    connection.tell(Attached(hello(), first))
    await frames(first, 1)
    for frame_no in range(1, 13):  # 1.2 s of beats, twice a heartbeat: past three heartbeats from the hello
        connection.tell(FromWorker((wire.Heartbeat(frame_no=frame_no),)))
        await asyncio.sleep(0.1)
    sent = [first.get_nowait() for _ in range(first.qsize())]
    assert sent and all(isinstance(frame, wire.Ack) for frame in sent)  # each beat answered, none closed
    connection.tell(Detached(first))
    assert await frames(first, 1) == [CLOSE]
    again: asyncio.Queue = asyncio.Queue()
    connection.tell(Attached(hello(), again))
    await frames(again, 1)  # the welcome; then nothing is heard of the agent
    assert await frames(again, 1, timeout=3.0) == [CLOSE]  # three heartbeats on, not the grace's end


async def test_a_newer_socket_of_the_same_worker_closes_the_older_one():
    connection, _, _ = await setup()
    old: asyncio.Queue = asyncio.Queue()
    connection.tell(Attached(hello(), old))
    await frames(old, 1)
    connection.tell(Attached(hello(), asyncio.Queue()))
    assert await frames(old, 1) == [CLOSE]


async def test_the_published_view_reads_as_the_same_json_as_a_dict_or_as_text():
    connection, _, _ = await setup()
    outbox: asyncio.Queue = asyncio.Queue()
    connection.tell(Attached(hello(), outbox))
    await frames(outbox, 1)
    await connection.ask(Snapshot())
    await asyncio.sleep(0)  # the view is published on the loop's next turn
    view = connection.view
    extra = {"cards": [{"uuid": "GPU-1"}], "instances": [], "enrolled_at": "t"}
    # What the Workers list keeps per view (its text, with the list's own keys after it),
    # closed with heard_s_ago at each read.
    as_text = json.loads(view.with_heard(view.head({key: json.dumps(value) for key, value in extra.items()})))
    as_dict = {**view.as_json(), **extra}
    assert sorted(as_text) == sorted(as_dict) and len(as_text) == len(as_dict)  # the same keys, once each
    assert {**as_text, "heard_s_ago": 0} == {**as_dict, "heard_s_ago": 0}  # heard_s_ago moves between reads
    assert as_text["state"] == "connected" and view.cards[0]["uuid"] == "GPU-1"
    assert "cards" not in as_text["inventory"]  # the list shows each card once, in ``cards``


async def test_a_heartbeat_that_changes_nothing_keeps_the_view_and_one_that_does_replaces_it():
    connection, _, _ = await setup()
    outbox: asyncio.Queue = asyncio.Queue()
    connection.tell(Attached(hello(), outbox))
    await frames(outbox, 1)

    async def view_after(frame: wire.Heartbeat):
        connection.tell(FromWorker((frame,)))
        await connection.ask(Snapshot())
        await asyncio.sleep(0)  # the view is published on the loop's next turn
        return connection.view

    first = await view_after(wire.Heartbeat(frame_no=1, free_mib={"GPU-1": 15000}))
    text = first.head({})
    same = await view_after(wire.Heartbeat(frame_no=2, free_mib={"GPU-1": 15000}))
    assert same is first and same.head({}) == text  # its encoded text is reused
    moved = await view_after(wire.Heartbeat(frame_no=3, free_mib={"GPU-1": 9000}))
    assert moved is not first and moved.cards[0]["memory_free_mib"] == 9000
    assert first.cards[0]["memory_free_mib"] == 15000  # a view never changes


async def test_a_one_shot_agent_that_took_its_run_is_told_spent_to_a_placer_that_starts_again():
    connection, placer, _ = await setup()
    outbox: asyncio.Queue = asyncio.Queue()
    connection.tell(Attached(hello().model_copy(update={"one_shot": True}), outbox))
    await frames(outbox, 1)
    connection.tell(AssignRun("r1", wire.Assign(run_id="r1", graph={}, devices=["cpu"])))
    connection.tell(Reannounce())  # a new placer asks each worker again: the hello said not spent yet
    await settle(connection, placer)
    online = [m for m in placer.got if isinstance(m, WorkerOnline)]
    assert online[0].offer.one_shot and not online[0].offer.spent
    assert online[-1].offer.spent  # it took r1 since: no second run for it
