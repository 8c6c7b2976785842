"""LedgerActor through its messages: one quota per physical device, the smallest limit
among the providers online; on a card shared by memory, budgets that fit."""

from __future__ import annotations

from troupe.actors.base import Registry
from troupe.actors.placer.ledger import (
    MEMORY,
    PROMISING,
    Adopt,
    Fits,
    Free,
    FreeMemory,
    Hold,
    LedgerActor,
    Offer,
    Policy,
    Snapshot,
    TryHold,
    Withdraw,
)

GIB = 1024


async def test_the_smallest_limit_among_online_providers_holds():
    ledger = LedgerActor("GPU-aaaa").start()
    assert await ledger.ask(TryHold("r0")) is None  # nobody offers the card yet
    ledger.tell(Offer("gpu-a", 2))
    ledger.tell(Offer("gpu-b", 1))
    assert await ledger.ask(TryHold("r1")) == Hold(full=True)  # its one slot: the next ask would fail
    assert await ledger.ask(TryHold("r1")) == Hold(full=True)  # asking again for a held slot is fine
    assert await ledger.ask(TryHold("r2")) is None
    ledger.tell(Withdraw("gpu-b"))
    ledger.tell(Free("r1"))
    assert await ledger.ask(TryHold("r2")) == Hold()  # one of two slots
    assert await ledger.ask(TryHold("r1")) == Hold(full=True)
    ledger.tell(Free("r1"))
    ledger.tell(Free("r1"))
    snapshot = await ledger.ask(Snapshot())
    assert (snapshot["limit"], snapshot["providers"], snapshot["holders"]) == (2, {"gpu-a": 2}, ["r2"])
    ledger.stop()
    await ledger.wait()


async def test_a_fresh_ledger_adopts_the_runs_that_hold_it():
    ledger = LedgerActor("cpu@m1").start()
    ledger.tell(Offer("local", 1))
    ledger.tell(Adopt(("already-running",)))
    assert await ledger.ask(TryHold("next")) is None
    ledger.stop()
    await ledger.wait()


async def test_a_shared_card_packs_budgets_while_they_fit_what_is_free_and_what_is_not_promised():
    ledger = LedgerActor("GPU-shared", context_mib=500).start()
    ledger.tell(Offer("gpu-a", 1, total_mib=24 * GIB, free_mib=24 * GIB))
    ledger.tell(Policy(MEMORY, reserved_mib=0))
    for run in ("r1", "r2", "r3"):  # 3 x (6 GiB + 500 MiB) = 19.5 GiB of 24
        assert await ledger.ask(TryHold(run, 6 * GIB)) == Hold(shared=True, total_mib=24 * GIB)
    assert await ledger.ask(TryHold("r4", 6 * GIB)) is None  # 4.5 GiB not promised: too little
    fits = await ledger.ask(Fits(6 * GIB))
    assert (fits["ever"], fits["now"]) == (True, False)
    assert fits["numbers"]["promised_mib"] == 3 * (6 * GIB + 500) and fits["numbers"]["room_mib"] == 24 * GIB - 19932
    assert await ledger.ask(TryHold("r4", None)) is None  # no budget, no place on a shared card
    assert (await ledger.ask(Fits(24 * GIB)))["ever"] is False  # the context does not fit beside it
    ledger.tell(Free("r1"))
    assert await ledger.ask(TryHold("r4", 6 * GIB)) is not None
    # What is free now counts too: another process took memory the ledger did not promise.
    ledger.tell(Free("r4"))
    ledger.tell(FreeMemory(1 * GIB))
    assert await ledger.ask(TryHold("r5", 1 * GIB)) is None
    ledger.tell(FreeMemory(10 * GIB))
    assert await ledger.ask(TryHold("r5", 1 * GIB)) is not None
    snapshot = await ledger.ask(Snapshot())
    assert snapshot["budgets"] == {"r2": 6 * GIB, "r3": 6 * GIB, "r5": 1 * GIB} and snapshot["sharing"] == MEMORY
    ledger.stop()
    await ledger.wait()


async def test_reserved_memory_is_never_promised():
    ledger = LedgerActor("GPU-r", context_mib=0).start()
    ledger.tell(Offer("gpu-a", 1, total_mib=10 * GIB, free_mib=10 * GIB))
    ledger.tell(Policy(MEMORY, reserved_mib=4 * GIB))
    assert (await ledger.ask(Fits(7 * GIB)))["ever"] is False
    assert await ledger.ask(TryHold("r1", 6 * GIB)) is not None
    ledger.stop()
    await ledger.wait()


async def test_a_ledger_marks_itself_while_a_holder_has_a_memory_budget():
    """The Workers list reads the books of the marked ledgers only: one that promises
    memory and is not marked would show no budgets."""
    registry = Registry()
    ledger = LedgerActor("GPU-m").start(registry)
    plain = LedgerActor("GPU-p").start(registry)
    for card in (ledger, plain):
        card.tell(Offer("w", 4))
    assert await ledger.ask(TryHold("r1", 2 * GIB)) == Hold() and await plain.ask(TryHold("r2")) == Hold()
    assert registry.marked(PROMISING) == [ledger]
    ledger.tell(Free("r1"))
    await ledger.ask(Snapshot())
    assert registry.marked(PROMISING) == []
    ledger.tell(Adopt(("r3",), {"r3": GIB}))
    await ledger.ask(Snapshot())
    assert registry.marked(PROMISING) == [ledger]
    ledger.stop()
    await ledger.wait()
    assert registry.marked(PROMISING) == []  # a stopped ledger leaves the marks with its name
    plain.stop()
    await plain.wait()
