"""DDP on the CPU: from a worker run's ``run_started`` to the moment all its ranks have
joined the group (the ``ddp: N ranks joined`` log, both timestamps the server's), and to
the run's end, for ``examples/digits_mlp.json`` with ``strategy: ddp``. The agent runs
with the test-only TROUPE_DDP_CPU_RANKS, so the ranks are gloo processes on this CPU.
Rank 1 starts cold (an interpreter, torch, the loop's feeding nodes); rank 0 is the
run's child, warm or not (``--warm``).

    .venv/bin/python bench/ddp.py [--runs 3] [--ranks 2] [--warm 0]
"""

# ruff: noqa: E402
from __future__ import annotations

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # the repository, not bench/, first

import argparse
import statistics
import tempfile
from datetime import datetime

from tests.helpers import Server
from tests.integration.test_training_functional import quick_digits
from tests.integration.test_worker_runs_functional import wait_warm
from tests.integration.test_workers_functional import enroll, read_until, start_agent


def _ts(event: dict) -> float:
    return datetime.fromisoformat(event["ts"]).timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--warm", type=int, default=0)
    args = parser.parse_args()
    joined, ended = [], []
    with tempfile.TemporaryDirectory(prefix="troupe-bench-ddp-") as scratch:
        tmp = Path(scratch)
        server = Server(tmp / "home", TROUPE_WORKER_HEARTBEAT_S="1").start()
        agent = None
        try:
            agent = start_agent(server, tmp / "agent", enroll(server, name="ddp")["command"] + f" --warm {args.warm}",
                                TROUPE_DDP_CPU_RANKS=str(args.ranks))
            read_until(agent, "connected as ddp")
            for _ in range(args.runs):
                if args.warm:
                    wait_warm(server, "ddp", args.warm)
                run_id = server.submit(quick_digits(epochs=3, strategy="ddp"), target={"worker": "ddp"})["run_id"]
                events = server.events_until_finished(run_id, timeout=300)
                assert events[-1]["payload"]["status"] == "succeeded", events[-3:]
                started = next(e for e in events if e["type"] == "run_started")
                met = next(e for e in events if e["type"] == "log" and "ddp" in e["payload"])
                joined.append(_ts(met) - _ts(started))
                ended.append(_ts(events[-1]) - _ts(started))
        finally:
            if agent is not None:
                agent.terminate()
                agent.wait(30)
            server.stop()
    print(f"\n{args.ranks} gloo ranks on the CPU, digits 3 epochs, {args.runs} runs, rank 0 "
          f"{'warm' if args.warm else 'cold'}\n")
    print("| | median s | all s |\n| --- | --- | --- |")
    for name, values in (("run_started -> all ranks joined", joined), ("run_started -> run_finished", ended)):
        print(f"| {name} | {statistics.median(values):.2f} | {', '.join(f'{v:.2f}' for v in values)} |")
    print(f"\nreproduce: .venv/bin/python bench/ddp.py --runs {args.runs} --ranks {args.ranks} --warm {args.warm}")


if __name__ == "__main__":
    main()
