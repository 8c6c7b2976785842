"""The event hub's feeds, by messages to the hub: a global subscriber back with an old
Last-Event-ID whose catch-up is more than its feed holds lags out of every list, so
nothing more is put in a feed nobody reads."""

from __future__ import annotations

from troupe.actors.base import Registry
from troupe.actors.events import (
    CHANGE_WINDOW,
    LAGGED,
    MAX_BACKLOG_BYTES,
    Committed,
    EventHub,
    Feed,
    Subscribe,
    Unsubscribe,
)
from troupe.actors.store.runs import UpdateRun


def changes(count, status="running"):
    return Committed(tuple((UpdateRun(f"{i:032x}", {"status": status}), None) for i in range(count)))


async def test_a_catch_up_larger_than_the_feed_lags_it_out_of_every_list():
    hub = EventHub().start(Registry())
    first = Feed()
    await hub.ask(Subscribe(first, (None,), lambda: True, None))
    await hub.ask(changes(1))
    oldest = (await first.burst(0))[0]["change_id"]
    await hub.ask(Unsubscribe(first))
    behind = MAX_BACKLOG_BYTES // 256 + 100  # more row changes than a feed holds, fewer than the window
    assert behind < CHANGE_WINDOW
    await hub.ask(changes(behind))
    back = Feed()
    await hub.ask(Subscribe(back, (None,), lambda: True, oldest))
    seen = []
    while back.qsize():
        seen += await back.burst(0)
    assert seen[-1] is LAGGED
    await hub.ask(Unsubscribe(back))  # what the stream's handler does as it ends
    await hub.ask(changes(500, "succeeded"))
    assert back.qsize() == 0
    hub.stop()
    await hub.wait()
