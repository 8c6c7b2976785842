"""Shared cards: how fast the ledgers decide, and how much of a card a mixed queue fills.

Eight simulated 24 GiB cards shared by memory (one LedgerActor each, as the server runs
them) take a queue of 1,000 budgeted runs in order: the head goes to the first card
where its budget fits; when none fits, the oldest running run ends and frees its card.
Every TryHold is one admission decision. The same queue under slot counting (one run per
card) is the comparison. Nothing else runs: this is the ledger's arithmetic and its
mailbox, not the HTTP path.

    .venv/bin/python bench/sharing.py [--runs 1000] [--cards 8] [--seed 7]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from collections import deque
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # the repository, not bench/, first

from troupe.actors.placer.ledger import MEMORY, Free, LedgerActor, Offer, Policy, TryHold  # noqa: E402

CARD_MIB = 24 * 1024
CONTEXT_MIB = 500
BUDGETS_GIB = (1, 2, 4, 6, 8, 12)  # a mixed queue: a classroom's small runs and a few big ones


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--cards", type=int, default=8)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    budgets = [rng.choice(BUDGETS_GIB) * 1024 for _ in range(args.runs)]

    ledgers = [LedgerActor(f"GPU-sim-{i}", context_mib=CONTEXT_MIB).start() for i in range(args.cards)]
    for ledger in ledgers:
        ledger.tell(Offer("w", 1, total_mib=CARD_MIB, free_mib=CARD_MIB))
        ledger.tell(Policy(MEMORY))
    queue = deque(enumerate(budgets))
    running: deque[tuple[str, int, int]] = deque()  # (run, card, budget), oldest first
    promised = [0] * args.cards
    decisions, shares, concurrent = 0, [], []
    started = time.perf_counter()
    while queue:
        index, budget = queue[0]
        placed = None
        for card, ledger in enumerate(ledgers):
            decisions += 1
            if await ledger.ask(TryHold(f"r{index}", budget)) is not None:
                placed = card
                break
        if placed is None:  # nothing fits: the oldest run ends
            run, card, freed = running.popleft()
            ledgers[card].tell(Free(run))
            promised[card] -= freed + CONTEXT_MIB
            continue
        queue.popleft()
        running.append((f"r{index}", placed, budget))
        promised[placed] += budget + CONTEXT_MIB
        shares.append(sum(promised) / (CARD_MIB * args.cards))
        concurrent.append(len(running))
    elapsed = time.perf_counter() - started
    for ledger in ledgers:
        ledger.stop()
        await ledger.wait()

    slot_share = statistics.mean(b + CONTEXT_MIB for b in budgets) / CARD_MIB
    print(f"{args.runs} budgeted runs ({', '.join(f'{g}' for g in BUDGETS_GIB)} GiB, seed {args.seed}) "
          f"over {args.cards} shared cards of {CARD_MIB // 1024} GiB, context {CONTEXT_MIB} MiB")
    print(f"  admission decisions: {decisions} in {elapsed:.3f} s = {decisions / elapsed:,.0f} per second")
    print(f"  memory promised while admitting: mean {statistics.mean(shares):.1%} of the cards, "
          f"runs at once mean {statistics.mean(concurrent):.1f} (max {max(concurrent)})")
    print(f"  slot counting (one run per card): {slot_share:.1%} of the cards, {args.cards} runs at once")
    print(f"reproduce: .venv/bin/python bench/sharing.py --runs {args.runs} --cards {args.cards} --seed {args.seed}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
