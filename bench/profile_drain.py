"""Where the server's time goes while it drains hello runs: a py-spy profile of the
control plane, summed by module.

Starts ``troupe start`` (2 cpu slots), submits ``--drain`` runs of examples/hello.json at
once from 4 client threads, and records the server with ``py-spy record`` (``--rate``
samples a second of the thread holding the GIL: the Python time that limits a drain) from the first submit to the last
run's end. It prints the server CPU per run and the share of samples whose innermost
frame of our code, or of the library it is in, is each module, so that the next lever is
named by a measurement. py-spy must be installed (``pip install py-spy``); it is a tool of
this benchmark only.

With ``--worker``, the runs go to one worker agent instead (enrolled as ``bench``, simulated
inventory of 2 cpus; each run in a fresh child, as an agent without ``--warm`` runs them),
so the figure is the server's CPU per worker run; the agent's and its children's CPU are
not the server's and are printed apart.

    .venv/bin/python bench/profile_drain.py --drain 300
    .venv/bin/python bench/profile_drain.py --drain 300 --worker

``--raw FILE`` keeps py-spy's raw stacks, to read further than the summary by module.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._http import Conn
from bench._measure import BenchError, cpu_seconds, machine, run_main, shares
from bench._troupe import REPO, start_server, stop_server_proc
from bench.worker import WORKER, enroll_and_attach

HELLO = json.loads((REPO / "examples" / "hello.json").read_text())
OURS = ("actors", "web", "supervisors", "protocol", "subprocess_runner", "cli")
STDLIB = ("asyncio", "json", "concurrent", "sqlite3", "email", "http", "importlib", "logging", "collections")


def _where(frame_file: str) -> str:
    """A frame's file (py-spy names it from its package: ``aiohttp/web_app.py``,
    ``troupe/actors/run.py``, ``threading.py``) as the family it belongs to: ours by module, a
    library by its top package, the standard library by package or module."""
    parts = Path(frame_file).parts
    parts = parts[1:] if parts[:1] == ("troupe",) else parts  # our packages live under troupe/
    if len(parts) > 1 and parts[0] in OURS:
        return "/".join(parts[:2]).removesuffix(".py")
    if len(parts) == 1 or parts[0] in STDLIB:
        return f"stdlib {parts[0].removesuffix('.py')}"
    return parts[0]


def _summarise(collapsed: Path, top: int) -> list[tuple[str, float]]:
    """Each sample is charged to the innermost frame of ours if any (what our code did,
    libraries included), else to the innermost frame's family."""
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        files = [f[f.find("(") + 1:f.rfind(":")] for f in frames if "(" in f]
        # py-spy names a file from its package's top (``troupe/actors/run.py``), or in full.
        ours = [f for f in files if any(f.startswith(f"{p}/") or f"/{p}/" in f for p in OURS)]
        key = _where(ours[-1]) if ours else (_where(files[-1]) if files else "?")
        counts[key] += int(n)
        total += int(n)
    return [(key, 100.0 * n / total) for key, n in counts.most_common(top)]


def _agent_cpu(agent: subprocess.Popen[bytes] | None) -> list[float]:
    """The agent's own CPU seconds and its finished children's (user + system)."""
    if agent is None:
        return [0.0, 0.0]
    fields = Path(f"/proc/{agent.pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = [int(x) / os.sysconf("SC_CLK_TCK") for x in fields[11:15]]
    return [ticks[0] + ticks[1], ticks[2] + ticks[3]]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--drain", type=int, default=300)
    p.add_argument("--rate", type=int, default=250, help="py-spy samples a second (default 250)")
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--worker", action="store_true", help="drain on one worker agent, not in-process")
    p.add_argument("--raw", type=Path, help="also keep py-spy's raw stacks in this file")
    args = p.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        raise BenchError("py-spy is not installed: pip install py-spy")
    with tempfile.TemporaryDirectory(prefix="troupe-bench-profile-") as tmp:
        (Path(tmp) / "home").mkdir()
        server = start_server(Path(tmp) / "home", 2, 60.0)
        out = Path(tmp) / "profile.txt"
        agent = None
        body = json.dumps({"graph": HELLO} | ({"options": {"target": {"worker": WORKER}}} if args.worker else {}))
        try:
            conns = [Conn(server.port, server.token, 60.0) for _ in range(4)]
            if args.worker:
                agent, _ = enroll_and_attach(conns[0], server.port, Path(tmp), 60.0)
            conns[0].request("POST", "/api/runs", body.encode())  # one run first: imports warm
            record = subprocess.Popen([spy, "record", "--pid", str(server.pid), "--rate", str(args.rate),
                                       "--format", "raw", "--output", str(out), "--gil", "--nonblocking"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # py-spy attached
            cpu0, t0 = sum(cpu_seconds(server.pid)), time.perf_counter()
            agent0 = _agent_cpu(agent)
            refused: list[str] = []

            def submit(conn: Conn, n: int) -> None:
                for _ in range(n):
                    status, reply = conn.request("POST", "/api/runs", body.encode())
                    if status != 201:
                        refused.append(f"POST /api/runs answered {status}: {reply}")
                        return

            threads = [threading.Thread(target=submit, args=(c, n)) for c, n in zip(conns, shares(args.drain, 4),
                                                                                     strict=True)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if refused:
                raise BenchError(refused[0])
            while time.perf_counter() - t0 < 900:  # until nothing is queued or running
                if not any(conns[0].request("GET", f"/api/runs?status={s}&limit=1")[1]["runs"]
                           for s in ("queued", "running")):
                    break
                # A fixed rate, a slow one for the worker's drain (about a minute): the
                # bench's own reads stay a small part of what the server does.
                time.sleep(0.5 if args.worker else 0.05)
            elapsed = time.perf_counter() - t0
            cpu = sum(cpu_seconds(server.pid)) - cpu0
            agent_cpu = [b - a for a, b in zip(agent0, _agent_cpu(agent), strict=True)]
            record.send_signal(2)
            record.wait(60)
        finally:
            if agent is not None:
                stop_server_proc(agent, 30.0)
            stop_server_proc(server.proc, 30.0)
        print(f"machine: {machine()}")
        print(f"{args.drain} hello runs drained in {elapsed:.2f} s ({args.drain / elapsed:.0f} runs/s); "
              f"server CPU {1000 * cpu / args.drain:.2f} ms per run"
              + (f"; agent {1000 * agent_cpu[0] / args.drain:.2f} ms and its run children "
                 f"{1000 * agent_cpu[1] / args.drain:.2f} ms per run (not the server's)" if args.worker else ""))
        if out.exists() and args.raw:
            shutil.copyfile(out, args.raw)
        if out.exists():
            print("share of the server's samples (innermost frame of ours, else of the library):")
            for key, pct in _summarise(out, args.top):
                print(f"  {pct:5.1f} %  {key}")
        print(f"reproduce: .venv/bin/python bench/profile_drain.py --drain {args.drain} --rate {args.rate}"
              + (" --worker" if args.worker else ""))
    return 0


if __name__ == "__main__":
    run_main(main)
