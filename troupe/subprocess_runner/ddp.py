"""DDP inside a worker run's process (#792): one model trained across the run's cards.

The run's child is rank 0: it executes the whole graph and owns the pipe to the agent.
When its ``torch.TrainingLoop`` with ``strategy: ddp`` starts, it spawns one process per
other card (ranks 1..N-1). Each executes only the loop and the nodes that feed it, with
events going nowhere: the run keeps one event log. The ranks meet through a
``torch.distributed.FileStore`` in a fresh folder of this run and attempt (deleted when
the loop ends, never reused) and talk over loopback only (``GLOO_SOCKET_IFNAME`` and
``NCCL_SOCKET_IFNAME`` are ``lo``): nothing listens on an address another machine can
reach.

A rank that dies takes the group down: rank 0 watches its ranks' processes, kills the
others at once, and fails the run naming the rank and how it ended, within seconds
rather than a collective's timeout. A rank whose parent (rank 0) is gone exits.

``TROUPE_DDP_CPU_RANKS=N`` (test-only, off by default) gives a worker run N ranks on the
CPU with gloo, so the whole path runs where there is no second card.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from troupe.subprocess_runner.ddp_plan import DdpPlan

RENDEZVOUS_TIMEOUT_S = 180.0  # the other ranks start cold: an interpreter, torch, their feeding nodes
WATCH_S = 0.2
DEATH_GRACE_S = 2.0  # after killing the others, how long the loop has to fail by itself
LOOPBACK = "lo"

_on_death: list[Callable[[str], None]] = []  # rank 0: ends the run when the group is stuck


def plan_for(devices: list[str], graph: dict[str, Any], run_id: str, run_dir: Path, seed: int | None,
             deterministic: bool, cpu_ranks: int = 0) -> DdpPlan | None:
    """A worker run's plan: one rank per CUDA card when it holds two or more, or
    ``cpu_ranks`` on the CPU (the agent's test-only TROUPE_DDP_CPU_RANKS); None otherwise
    (the loop trains in one process)."""
    cards = [d for d in devices if d.startswith("cuda")]
    if len(cards) >= 2:
        world, cuda = len(cards), True
    elif cpu_ranks >= 2:
        world, cuda = cpu_ranks, False
    else:
        return None
    shuffle = seed if seed is not None else int.from_bytes(os.urandom(4), "big")
    return DdpPlan(world, cuda, graph, run_id, str(run_dir), seed, deterministic, shuffle)


def when_stuck(end_run: Callable[[str], None]) -> None:
    """Rank 0's child: how to end the run when a dead rank leaves the loop stuck."""
    _on_death[:] = [end_run]


class Group:
    """This rank's membership of the run's process group, for the loop's duration."""

    def __init__(self, plan: DdpPlan, node_id: str) -> None:
        import torch.distributed as dist

        self.plan, self.rank, self.world = plan, plan.rank, plan.world
        self.device = f"cuda:{plan.rank}" if plan.cuda else "cpu"
        self._ranks: dict[int, Any] = {}
        self._dead: str | None = None
        self._closed = threading.Event()
        os.environ.update(GLOO_SOCKET_IFNAME=LOOPBACK, NCCL_SOCKET_IFNAME=LOOPBACK)
        self._folder: Path | None = None
        store = plan.store
        if plan.rank == 0:
            self._folder = Path(tempfile.mkdtemp(prefix="ddp-", dir=plan.run_dir))
            store = str(self._folder / "store")
            context = multiprocessing.get_context("spawn")
            for rank in range(1, plan.world):
                process = context.Process(target=rank_main, args=(replace(plan, rank=rank, store=store), node_id),
                                          name=f"troupe-ddp-rank-{rank}", daemon=False)
                process.start()
                self._ranks[rank] = process
            threading.Thread(target=self._watch, name="ddp-ranks", daemon=True).start()
        assert store is not None
        try:
            if plan.cuda:
                import torch

                torch.cuda.set_device(plan.rank)  # NCCL's own traffic goes from this rank's card
            dist.init_process_group("nccl" if plan.cuda else "gloo", store=dist.FileStore(store, plan.world),
                                    rank=plan.rank, world_size=plan.world,
                                    timeout=timedelta(seconds=RENDEZVOUS_TIMEOUT_S))
        except BaseException:  # the ranks started above would wait out the rendezvous, and hold their cards
            self.close(False)
            raise

    @property
    def pids(self) -> list[int]:
        return [os.getpid(), *(process.pid for process in self._ranks.values())]

    def _watch(self) -> None:
        while not self._closed.wait(WATCH_S):
            for rank, process in self._ranks.items():
                code = process.exitcode
                if code is None or code == 0:
                    continue  # running, or finished the loop
                how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
                self._dead = f"DDP rank {rank} of {self.world} died ({how}); the run's other ranks were stopped"
                self._kill()
                if not self._closed.wait(DEATH_GRACE_S) and _on_death:
                    _on_death[0](self._dead)  # the loop is stuck in a collective: end the run now
                return

    def explain(self, error: BaseException) -> BaseException:
        """The error the loop fails with: a dead rank, when one is why it failed."""
        deadline = time.monotonic() + 1.0
        while self._dead is None and self._ranks and time.monotonic() < deadline:
            time.sleep(0.05)
        return RuntimeError(self._dead) if self._dead else error

    def close(self, ok: bool) -> None:
        import torch.distributed as dist

        self._closed.set()
        for process in self._ranks.values():
            process.join(60 if ok else 0)
        self._kill()
        for process in self._ranks.values():
            process.join(5)  # reaped: a killed rank is gone, not a zombie of this child
        if dist.is_initialized():
            dist.destroy_process_group()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)

    def _kill(self) -> None:
        for process in self._ranks.values():
            if process.is_alive():
                process.kill()


def weights_digest(model: Any) -> str:
    """The same model gives the same digest on every rank (its state, byte for byte)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def rank_main(plan: DdpPlan, node_id: str) -> None:
    """Ranks 1..N-1: the loop and what feeds it; exits with the outcome."""
    parent = os.getppid()

    def orphaned() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)  # rank 0 is gone: nobody will meet this rank again

    threading.Thread(target=orphaned, name="ddp-parent", daemon=True).start()
    from troupe.subprocess_runner.seeding import cap_threads

    cap_threads()
    from troupe.subprocess_runner.context import ExecutionContext, Sinks
    from troupe.subprocess_runner.engine import execute_graph, prepare_executable_graph

    graph = prepare_executable_graph(feeding(plan.graph, node_id))
    with tempfile.TemporaryDirectory(prefix=f"troupe-ddp-{plan.rank}-") as scratch:  # its files are not the run's
        ctx = ExecutionContext(plan.run_id, None, f"cuda:{plan.rank}" if plan.cuda else "cpu", plan.seed,
                               Sinks(lambda kind, node, payload: None), deterministic=plan.deterministic,
                               run_dir=Path(scratch), ddp=plan)
        outcome = execute_graph(graph, ctx, max_parallel=1, deterministic=plan.deterministic)
    os._exit(0 if outcome.status == "succeeded" else 1)


def feeding(graph: dict[str, Any], node_id: str) -> dict[str, Any]:
    """The graph cut down to ``node_id`` and the nodes it depends on."""
    needed, frontier = {node_id}, [node_id]
    while frontier:
        target = frontier.pop()
        for edge in graph.get("edges", []):
            if edge["target"] == target and edge["source"] not in needed:
                needed.add(edge["source"])
                frontier.append(edge["source"])
    return {**graph, "nodes": [n for n in graph["nodes"] if n["id"] in needed],
            "edges": [e for e in graph.get("edges", []) if e["source"] in needed and e["target"] in needed]}
