"""What a warm run child itself adds to a run: the part of a worker run between the
agent's ``StartRun`` down the pipe and the child's answer coming back up it.

This process does what the agent's zygote does (imports what runs need, loads the node
catalog, freezes its objects out of the collector's reach), then for each sample forks a
child that runs ``troupe.subprocess_runner.child.forked`` as a pool's child does: it primes
itself and waits. After ``--settle`` seconds the run is sent, as the agent sends it, and
the time is taken until the child's end (``hello``) or its first epoch's ``train_loss``
(the digits example) comes up the pipe. No server and no agent: the hops around the
child are bench/warm_cadence.py's.

    .venv/bin/python bench/child_start.py --hello 12 --digits 7
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# As in queue.py: this folder is left off sys.path (bench/queue.py would shadow the
# standard library's queue, which the run's code imports) and the repository root goes first.
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [os.path.dirname(_HERE), *(p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE)]
_REPO = Path(_HERE).parent

from bench._measure import percentile  # noqa: E402
from troupe.protocol import pipe  # noqa: E402
from troupe.protocol.worker import Assign  # noqa: E402
from troupe.subprocess_runner import child  # noqa: E402


def _sample(catalog: Any, graph: dict[str, Any], until: Callable[[Any], bool], settle: float) -> float:
    ours, theirs = multiprocessing.get_context("spawn").Pipe()
    pid = os.fork()
    if pid == 0:  # the pool's child
        ours.close()
        try:
            child.forked(theirs, catalog)
        finally:
            os._exit(0)
    theirs.close()
    time.sleep(settle)  # primed and waiting, as a pool's child is when its run comes
    assign = {**Assign(run_id=f"bench{time.time_ns()}", graph=graph).model_dump(), "mounts": {}, "control_plane": {},
              "ddp_cpu_ranks": 0, "artifact_outbox": None, "data_roots": [], "command_kill_grace_s": 5.0,
              "pack_paths": []}
    started, took = time.perf_counter(), 0.0
    ours.send(pipe.StartRun(assign))
    while not took:
        for frame in ours.recv():
            if until(frame):
                took = (time.perf_counter() - started) * 1e3
    if not isinstance(frame, pipe.ChildEnded):
        ours.send(pipe.CancelRun())
    try:
        while True:
            ours.recv()
    except EOFError:
        pass
    os.waitpid(pid, 0)
    return took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hello", type=int, default=12, help="hello runs, submit to end (default 12)")
    parser.add_argument("--digits", type=int, default=7, help="digits trainings, to the first epoch (default 7)")
    parser.add_argument("--settle", type=float, default=0.5, help="seconds a child waits before its run (default 0.5)")
    args = parser.parse_args(argv)
    if args.hello < 1 or args.digits < 0 or args.settle < 0:
        parser.error("--hello at least 1, --digits and --settle at least 0")
    catalog = child.preload()
    gc.freeze()
    hello = json.loads((_REPO / "examples" / "hello.json").read_text())
    digits = json.loads((_REPO / "examples" / "digits_mlp.json").read_text())
    ended = [_sample(catalog, hello, lambda f: isinstance(f, pipe.ChildEnded), args.settle) for _ in range(args.hello)]
    print(f"hello, StartRun -> the child's end up the pipe: median {statistics.median(ended):.2f} ms, "
          f"p90 {percentile(ended, 90):.2f} ms ({args.hello} runs)")
    if args.digits:
        epochs = [_sample(catalog, digits, lambda f: isinstance(f, pipe.ChildEvent) and f.kind == "metric"
                          and f.payload.get("name") == "train_loss", args.settle) for _ in range(args.digits)]
        print(f"digits_mlp, StartRun -> the first epoch's train_loss up the pipe: median "
              f"{statistics.median(epochs):.1f} ms ({args.digits} runs)")
    print(f"reproduce: .venv/bin/python bench/child_start.py --hello {args.hello} --digits {args.digits} "
          f"--settle {args.settle:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
