"""The queue's pick at scale: what handing a freed slot on costs a QueueActor with a long
line, in fair order (the line spread over ``--people`` submitters) beside FIFO.

One process, the real QueueActor driven by its messages, a stand-in placer that counts
the Admits: the queue (one slot) is filled with ``--waiting`` runs, then ``--picks``
times in turn the running run is released and the time until the next run's Admit
reached the placer and the queue's view (which readers and positions use) was published
is taken: median and p99 (nearest rank). Also the cost of a position read off the
published view under fair order (``Order.position`` of a run in the middle of the line).

Cases: ``fair``: ``--people`` submitters, round robin as they queued; ``fifo``:
the same line with ``TROUPE_QUEUE_ORDER=fifo``; ``one``: everything from one submitter
(the server's token, as bench/scale.py submits), which is FIFO under either setting. Run
it against an older commit (``git worktree``) for the before: there every case is the one
FIFO line the queue had. ``--loop``: the event loop, uvloop (what the server runs on since
``TROUPE_EVENT_LOOP`` came) or asyncio's (what it ran on before).

    .venv/bin/python bench/fair_pick.py --waiting 10000 --people 30 --picks 2000
"""

# ruff: noqa: E402
from __future__ import annotations

import os
import sys

# As in queue.py: this folder is left off sys.path (bench/queue.py would shadow the
# standard library's queue) and the repository root goes first.
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [os.path.dirname(_HERE), *(p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE)]

import argparse
import asyncio
import inspect
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._measure import percentile
from troupe.actors.base import Actor, Registry
from troupe.actors.placer.queue import Enqueue, QueueActor, Release
from troupe.actors.store import StoreActor, StoreClient
from troupe.actors.threaded import start_thread_actor

_FAIR = "order" in inspect.signature(QueueActor.__init__).parameters  # this commit orders fairly
_SUBMITTER = "submitter" in {f for f in getattr(Enqueue, "__dataclass_fields__", {})}


class _Placer(Actor):
    """Counts Admits; ``next`` resolves at the next one."""

    def __init__(self) -> None:
        super().__init__("placer")
        self.next: asyncio.Future[str] | None = None

    async def receive(self, message: Any) -> None:
        if self.next is not None and not self.next.done():
            self.next.set_result(message.run_id)


def _queued(view: Any) -> int | None:
    """How many wait, from this commit's view or an older one's (a dict)."""
    if view is None:
        return None
    return int(view["queued"]) if isinstance(view, dict) else int(view.queued)


async def _case(name: str, waiting: int, people: int, picks: int, folder: Path) -> dict[str, Any]:
    store = StoreClient(start_thread_actor(StoreActor, "store", folder / "db", folder / "runs"))
    registry = Registry()
    placer = _Placer()
    placer.start(registry)
    order = {"fair": "fair", "fifo": "fifo", "one": "fair"}[name]
    queue = QueueActor("cpu", 1, store, registry, rebuild=False,
                       **({"order": order} if _FAIR else {}))  # type: ignore[arg-type]  # an older commit's queue takes no order
    ref = queue.start(registry)
    who = [f"p{i}" for i in range(people)] if name != "one" else [""]
    placer.next = asyncio.get_running_loop().create_future()
    for seq in range(1, waiting + 2):
        extra = {"submitter": who[seq % len(who)] if name != "one" else ""} if _SUBMITTER else {}
        ref.tell(Enqueue(f"r{seq}", seq, False, **extra))
    holding = await asyncio.wait_for(placer.next, 60)
    while _queued(ref.view) != waiting:  # the whole line is in (a store read per person first)
        await asyncio.sleep(0.01)
    took = []
    for _ in range(picks):
        placer.next = asyncio.get_running_loop().create_future()
        started = time.perf_counter()
        ref.tell(Release(holding))
        holding = await placer.next
        for _ in range(3):  # the view is published on the loop's next turn after the burst
            await asyncio.sleep(0)
        took.append((time.perf_counter() - started) * 1e6)
    found: dict[str, Any] = {"case": name, "median_us": statistics.median(took), "p99_us": percentile(took, 99)}
    view = ref.view
    order_view = getattr(view, "order", None)
    if order_view is not None:
        ids = order_view.ids(who[0])
        middle = ids[len(ids) // 2]
        reads = []
        for _ in range(200):
            started = time.perf_counter()
            order_view.position(middle)
            reads.append((time.perf_counter() - started) * 1e6)
        found["position_read_us"] = statistics.median(reads)
    ref.stop()
    placer.ref.stop()
    await store.ref.stop()
    return found


async def _main(args: argparse.Namespace) -> None:
    cases = [case for case in args.cases.split(",") if _FAIR or case == "one"]
    print(f"queue pick: {args.waiting} waiting, {args.people} people, {args.picks} picks, on {args.loop}'s loop; "
          f"this commit orders {'fair and fifo' if _FAIR else 'fifo only'}")
    for name in cases:
        with tempfile.TemporaryDirectory() as folder:
            found = await _case(name, args.waiting, args.people, args.picks, Path(folder))
            read = f", position read {found['position_read_us']:.0f} µs" if "position_read_us" in found else ""
            print(f"  {name:5s} release -> next Admit + view: median {found['median_us']:.0f} µs, "
                  f"p99 {found['p99_us']:.0f} µs{read}")
    print(f"reproduce: .venv/bin/python bench/fair_pick.py --waiting {args.waiting} --people {args.people} "
          f"--picks {args.picks} --cases {args.cases} --loop {args.loop}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--waiting", type=int, default=10_000)
    parser.add_argument("--people", type=int, default=30)
    parser.add_argument("--picks", type=int, default=2000)
    parser.add_argument("--cases", default="fair,fifo,one", help="of fair, fifo, one (an older commit: one only)")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                        help="the event loop (the server's is uvloop since TROUPE_EVENT_LOOP; asyncio before)")
    args = parser.parse_args(argv)
    if not 1 <= args.picks <= args.waiting or args.people < 1:
        parser.error("--picks is 1..--waiting, --people at least 1")
    if args.loop == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_main(args))
    else:
        asyncio.run(_main(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
