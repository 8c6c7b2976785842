"""What the queue benchmark measures with, for troupe and tsp alike: percentiles, the /proc
readings of a process (RSS, CPU, threads created, torch mapped), the machine's CPU steal and
its facts, and the result types and errors both sides share."""

from __future__ import annotations

import math
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn


class BenchError(Exception):
    pass


class OutOfTime(BenchError):
    pass


@dataclass
class LatencyResult:
    total_s: list[float] = field(default_factory=list)
    submit_s: list[float] = field(default_factory=list)
    server_s: list[float] = field(default_factory=list)  # run_queued ts -> run_finished ts (troupe only)
    events_per_run: int = 0
    failures: int = 0


def shares(n: int, threads: int) -> list[int]:
    """How many of ``n`` submissions each of ``threads`` client threads makes (the first ones one more)."""
    return [n // threads + (1 if i < n % threads else 0) for i in range(threads)]


# Statistics ------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (p99 of 200 samples is the 198th smallest)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def next_tick(start: float, interval: float, now: float) -> float:
    """The first tick of a fixed clock (``start``, every ``interval``) after ``now``: a
    sampler whose answer came late skips the ticks it overran instead of firing at once,
    which would flood what it measures."""
    return start + (math.floor((now - start) / interval) + 1) * interval


def summary(values_s: list[float]) -> dict[str, float]:
    ms = [v * 1000.0 for v in values_s]
    return {
        "n": len(ms),
        "median": statistics.median(ms),
        "p99": percentile(ms, 99),
        "mean": statistics.fmean(ms),
        "min": min(ms),
        "max": max(ms),
    }


def fmt_ms(s: dict[str, float]) -> str:
    return (
        f"median {s['median']:.2f} ms  p99 {s['p99']:.2f} ms  mean {s['mean']:.2f} ms  "
        f"min {s['min']:.2f} ms  max {s['max']:.2f} ms  (n={s['n']})"
    )


# /proc -----------------------------------------------------------------------------
def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MB (10^6 bytes)."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) * 1024 / 1e6
    return found["VmRSS"], found["VmHWM"]


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of ``pid`` (all its threads)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def steal_s() -> float:
    """CPU time the hypervisor took from this machine so far (all cores; 0 where not reported)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0
    except (OSError, ValueError):
        return 0.0


def last_pid() -> int:
    """The last pid/tid the kernel handed out (counts threads created anywhere)."""
    try:
        return int(Path("/proc/sys/kernel/ns_last_pid").read_text())
    except (OSError, ValueError):
        return 0


def torch_mapped(pid: int) -> bool:
    """Whether any torch shared library is mapped into ``pid`` (importing torch maps libtorch)."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return re.search(r"/torch/|libtorch", maps) is not None


def machine() -> dict[str, str]:
    free = subprocess.run(["free", "-h"], capture_output=True, text=True).stdout.strip()
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "free": free,
    }


def environ() -> dict[str, str]:
    """A copy of this process's environment, the base of every child's (the one place the
    bench reads it), with this tree first on ``PYTHONPATH``: the ``troupe`` script of an
    editable install imports the tree it was installed from, so a bench run from another
    worktree (a before column) would otherwise measure that tree's server."""
    env = dict(os.environ)
    tree = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([tree, *filter(None, [env.get("PYTHONPATH")])])
    return env


def time_limit(seconds: int) -> None:
    """Ends the benchmark with ``OutOfTime`` once it has run ``seconds`` (0: cancel)."""

    def out_of_time(signum: int, frame: Any) -> None:
        raise OutOfTime(f"the benchmark ran past --max-seconds={seconds}")

    signal.signal(signal.SIGALRM, out_of_time)
    signal.alarm(seconds)


def run_main(main: Callable[[], int]) -> NoReturn:
    """Runs a benchmark's ``main``: its exit code, or 2 with the reason when it could not run."""
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        sys.exit(2)
