"""The task-spooler side of the queue benchmark: a private ``tsp`` server (its own TS_SOCKET
and TMPDIR), the sequential ``tsp true`` / ``tsp -w`` latency and the drain of many jobs
queued at once."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench._measure import BenchError, LatencyResult, environ, shares


def find_tsp() -> str | None:
    path = shutil.which("tsp")
    if path:
        return path
    ts = shutil.which("ts")  # moreutils also ships a ``ts`` (timestamps): only take task-spooler's
    if ts:
        try:
            probe = subprocess.run(
                [ts, "-h"], capture_output=True, text=True, timeout=5, env={**environ(), "TS_SOCKET": os.devnull}
            )
            if "TS_SOCKET" in probe.stdout + probe.stderr:
                return ts
        except (OSError, subprocess.TimeoutExpired):
            pass
    return None


class Tsp:
    def __init__(self, binary: str, workdir: Path, slots: int, max_jobs: int) -> None:
        self.binary = binary
        self.env = {
            **environ(),
            "TS_SOCKET": str(workdir / "ts.sock"),
            "TMPDIR": str(workdir),
            "TS_SLOTS": str(slots),
            "TS_MAXFINISHED": str(max_jobs),
            "TS_MAXCONN": str(max_jobs),
        }
        for name in ("TS_ONFINISH", "TS_ENV", "TS_SAVELIST", "TS_MAILTO"):
            self.env.pop(name, None)
        self.call("-S", str(slots))  # starts the server (it reads TS_* now)

    def call(self, *args: str, check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [self.binary, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        if check and done.returncode != 0:
            raise BenchError(f"tsp {' '.join(args)} exited {done.returncode}: {done.stderr.strip()[:200]}")
        return done

    def submit(self) -> int:
        return int(self.call("true").stdout.strip())

    def wait(self, job: int, timeout: float) -> int:
        return self.call("-w", str(job), check=False, timeout=timeout).returncode

    def jobs(self) -> dict[int, tuple[str, str]]:
        """id -> (state, error level) from ``tsp -l``."""
        found = {}
        for line in self.call("-l").stdout.splitlines()[1:]:
            parts = line.split()
            if parts and parts[0].isdigit():
                state = parts[1]
                level = parts[3] if state == "finished" and len(parts) > 3 else ""
                found[int(parts[0])] = (state, level)
        return found

    def kill(self) -> None:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self.call("-K", check=False, timeout=10)


def tsp_latency(tsp: Tsp, runs: int, warmup: int, timeout: float) -> LatencyResult:
    result = LatencyResult()
    for i in range(warmup + runs):
        t0 = time.perf_counter()
        job = tsp.submit()
        t_submit = time.perf_counter()
        code = tsp.wait(job, timeout)
        t1 = time.perf_counter()
        if i < warmup:
            continue
        result.failures += code != 0
        result.total_s.append(t1 - t0)
        result.submit_s.append(t_submit - t0)
    return result


@dataclass
class TspDrain:
    n: int
    wall_s: float
    ok: int
    states: dict[str, int]

    @property
    def runs_per_s(self) -> float:
        return self.n / self.wall_s


def tsp_drain(tsp: Tsp, n: int, threads: int, timeout: float) -> TspDrain:
    tsp.call("-C")  # forget the latency jobs
    counts = shares(n, threads)
    ids: list[list[int]] = [[] for _ in range(threads)]
    errors: list[str] = []
    gate = threading.Barrier(threads + 1)

    def submitter(k: int) -> None:
        try:
            gate.wait(30)
            for _ in range(counts[k]):
                ids[k].append(tsp.submit())
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")

    workers = [threading.Thread(target=submitter, args=(k,), name=f"tsp-{k}") for k in range(threads)]
    for w in workers:
        w.start()
    gate.wait(30)
    t0 = time.perf_counter()
    for w in workers:
        w.join(timeout)
    if errors or any(w.is_alive() for w in workers):
        raise BenchError(f"tsp submissions failed: {errors[:3] or 'timeout'}")
    wanted = sorted(j for chunk in ids for j in chunk)
    deadline = time.monotonic() + timeout
    tsp.wait(wanted[-1], timeout)
    while True:  # two slots: the job before the last may still run
        jobs = tsp.jobs()
        pending = [j for j in wanted if jobs.get(j, ("?", ""))[0] in ("queued", "running", "allocating")]
        if not pending:
            break
        if time.monotonic() > deadline:
            raise BenchError(f"tsp: {len(pending)} jobs unfinished after {timeout}s")
        tsp.wait(pending[-1], max(1.0, deadline - time.monotonic()))
    wall = time.perf_counter() - t0
    states: dict[str, int] = {}
    ok = 0
    for j in wanted:
        state, level = jobs.get(j, ("missing", ""))
        key = f"{state}/{level}" if level else state
        states[key] = states.get(key, 0) + 1
        ok += state == "finished" and level == "0"
    return TspDrain(n=len(wanted), wall_s=wall, ok=ok, states=states)
