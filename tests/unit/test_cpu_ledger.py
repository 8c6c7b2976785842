"""The CPU ledger by messages: first come, first served, and never more than it has."""

from __future__ import annotations

import concurrent.futures

import pytest

from troupe.actors.cpus import Acquire, CpuLedger, Release, Snapshot


def ask_for(ledger, node, cpus, waits):
    granted: concurrent.futures.Future[bool] = concurrent.futures.Future()
    ledger.tell(Acquire("r" * 32, node, cpus, granted, lambda reason: waits.append((node, reason))))
    return granted


async def test_requests_are_served_in_order_and_released_cpus_go_to_the_head():
    ledger = CpuLedger(3).start()
    waits: list = []
    a = ask_for(ledger, "a", 2, waits)
    b = ask_for(ledger, "b", 2, waits)
    c = ask_for(ledger, "c", 1, waits)  # would fit now, but b is ahead of it
    snapshot = await ledger.ask(Snapshot())
    assert a.done() and not b.done() and not c.done()
    assert snapshot["free"] == 1 and [w["node_id"] for w in snapshot["waiters"]] == ["b", "c"]
    assert [node for node, _ in waits] == ["b", "c"] and "1 of 3 free" in waits[0][1]
    ledger.tell(Release("r" * 32, "a"))
    snapshot = await ledger.ask(Snapshot())
    assert b.done() and c.done() and snapshot["free"] == 0


async def test_a_request_larger_than_the_ledger_fails_at_once():
    ledger = CpuLedger(2).start()
    big = ask_for(ledger, "big", 3, [])
    await ledger.ask(Snapshot())
    with pytest.raises(ValueError, match="lends 2"):
        big.result(timeout=1)


async def test_a_waiter_that_gives_up_leaves_the_line():
    ledger = CpuLedger(1).start()
    ask_for(ledger, "a", 1, [])
    b = ask_for(ledger, "b", 1, [])
    ledger.tell(Release("r" * 32, "b"))  # cancelled while waiting
    snapshot = await ledger.ask(Snapshot())
    assert snapshot["waiters"] == [] and not b.done()
