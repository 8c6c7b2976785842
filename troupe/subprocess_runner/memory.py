"""A run's memory: the cap a shared card's budget sets, and the peak the run reached.

The peak is what the next run of the same graph is budgeted by, so it is read where it is
most honest: a run's cards' allocator peak when it used CUDA, else the resident set of
the process it ran in. In a worker's child that process is the run's alone (exact); in
the server every in-process run shares one (not exact).
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
from collections.abc import Callable, Sequence
from typing import Any

_MIB = 2**20


def _cuda() -> Any:
    """torch's CUDA module when this process already uses torch with a card; never
    imports torch or creates a context itself."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return torch.cuda if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    except Exception:  # a broken driver is "no CUDA" here
        return None


def peak_mib(cuda_ordinals: Sequence[int] = ()) -> int:
    """The run's peak in MiB: the allocator's on its cards (torch's ordinals) when CUDA was
    used, else the process's resident-set peak."""
    cuda = _cuda()
    if cuda is not None and cuda_ordinals:
        # Rounded up: a small model's peak is under a MiB, and 0 would read as "not measured".
        return -(-sum(int(cuda.max_memory_allocated(i)) for i in cuda_ordinals) // _MIB)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss) // (_MIB if sys.platform == "darwin" else 1024)  # bytes on macOS, KiB on Linux


def is_out_of_memory(error: str | None) -> bool:
    return error is not None and ("OutOfMemoryError" in error or "CUDA out of memory" in error)


def apply_cap(budget_mib: int, totals: Sequence[int], say: Callable[[str], None]) -> None:
    """Caps this process's allocator at ``budget_mib`` on each of its cards (CUDA's
    ordinals 0..n-1, the totals in that order), before anything allocates. Without CUDA
    it says so in the run log and the run goes on uncapped."""
    try:
        import torch

        available = torch.cuda.is_available()
    except Exception as exc:  # no torch or a broken driver
        say(f"the memory budget of {budget_mib} MiB could not be applied: {type(exc).__name__}: {exc}")
        return
    if not available:
        say(f"the memory budget of {budget_mib} MiB could not be applied: this machine has no CUDA")
        return
    for ordinal, total in enumerate(totals):
        fraction = min(1.0, budget_mib / total) if total else 1.0
        torch.cuda.set_per_process_memory_fraction(fraction, ordinal)
    say(f"memory budget {budget_mib} MiB on each of {len(totals)} card(s): the allocator is capped at it")


def group_card_mib(pgid: int) -> list[int] | None:
    """MiB that the processes of group ``pgid`` hold on each card of this machine, as NVML
    counts them (a command node's program and its children are not this process, so
    torch's allocator here knows nothing of them). None where NVML cannot be read."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver, no library: nothing to watch with
        return None
    try:
        used = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            total = 0
            for found in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if _in_group(found.pid, pgid) and found.usedGpuMemory:
                    total += int(found.usedGpuMemory)
            used.append(-(-total // _MIB))
        return used
    except Exception:  # a card that went away meanwhile: read again next time
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _in_group(pid: int, pgid: int) -> bool:
    try:
        return os.getpgid(pid) == pgid
    except OSError:  # gone, or a pid of another namespace
        return False
