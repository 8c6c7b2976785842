"""LedgerActor through its messages: one quota per physical device, the smallest limit
among the providers online."""

from __future__ import annotations

from actors.ledger import Adopt, Free, LedgerActor, Offer, Snapshot, TryHold, Withdraw


async def test_the_smallest_limit_among_online_providers_holds():
    ledger = LedgerActor("GPU-aaaa").start()
    assert await ledger.ask(TryHold("r0")) is False  # nobody offers the card yet
    ledger.tell(Offer("gpu-a", 2))
    ledger.tell(Offer("gpu-b", 1))
    assert await ledger.ask(TryHold("r1")) is True
    assert await ledger.ask(TryHold("r1")) is True  # asking again for a held slot is fine
    assert await ledger.ask(TryHold("r2")) is False
    ledger.tell(Withdraw("gpu-b"))
    assert await ledger.ask(TryHold("r2")) is True
    ledger.tell(Free("r1"))
    snapshot = await ledger.ask(Snapshot())
    assert snapshot == {"physical_id": "GPU-aaaa", "limit": 2, "providers": {"gpu-a": 2}, "holders": ["r2"]}
    ledger.stop()
    await ledger.wait()


async def test_a_fresh_ledger_adopts_the_runs_that_hold_it():
    ledger = LedgerActor("cpu@m1").start()
    ledger.tell(Offer("local", 1))
    ledger.tell(Adopt(("already-running",)))
    assert await ledger.ask(TryHold("next")) is False
    ledger.stop()
    await ledger.wait()
