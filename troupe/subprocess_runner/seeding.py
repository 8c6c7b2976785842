"""Seeding of the random generators a node may use. Part of the export surface.

Only generators whose module is already imported are seeded, so a seeded run of core
nodes never imports numpy or torch; packs that import torch call ``seed_torch`` after.
"""

from __future__ import annotations

import functools
import os
import random
import sys

_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def cap_threads(threads: int | None = None) -> int:
    """Caps the numeric libraries' thread pools (default: every core but one), before
    they are imported; a value the operator set already wins. Returns the cap.

    Settled once a process: a run child forked from the zygote calls it again, and by
    then the zygote's own call has set OMP_NUM_THREADS, which must not read as the
    operator's (every undeclared node would get the whole cap, not its share)."""
    if _cap and threads is None:
        return _cap[0]
    cap = threads if threads is not None else max(1, _cores() - 1)
    operator = os.environ.get("OMP_NUM_THREADS")
    for name in _THREAD_VARIABLES:
        os.environ.setdefault(name, str(cap))
    chosen = os.environ["OMP_NUM_THREADS"]
    _cap[:] = [int(chosen) if chosen.isdigit() and int(chosen) > 0 else cap]
    _operator[:] = [operator is not None and operator == chosen]
    return _cap[0]


@functools.cache
def _cores() -> int:
    """The machine's cores, read once (a file of /sys on Linux: a run child's start read it again)."""
    return os.cpu_count() or 2


def number_cards_by_bus() -> None:
    """Makes CUDA count cards in PCI bus order, as NVML does, so that ``cuda:N`` and
    CUDA_VISIBLE_DEVICES indices name the same card in troupe, NVML and torch. Called at
    the start of every troupe process, before anything can initialise CUDA."""
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"


def process_env(names: tuple[str, ...]) -> dict[str, str | None]:
    """These variables as this process has them now, after its own set-up: a recorded
    fact about what executed a run (the fingerprint), not a setting."""
    return {name: os.environ.get(name) for name in names}


_cap: list[int] = []
_operator: list[bool] = []  # whether the cap is the operator's own OMP_NUM_THREADS


def node_threads(declared: int | None, max_parallel: int) -> int:
    """A node's thread cap. One that declares cpus gets them; one that declares nothing
    gets its share of the process cap (``TROUPE_CPUS / TROUPE_MAX_PARALLEL_NODES``, at
    least 1), so nodes running side by side do not each size a pool to every core. An
    operator's own ``OMP_NUM_THREADS`` still wins for undeclared nodes."""
    if declared is not None:
        return max(1, declared)
    cap = _cap[0] if _cap else max(1, _cores() - 1)
    if _operator and _operator[0]:
        return cap
    return max(1, cap // max(1, max_parallel))


def thread_cap() -> int | None:
    """The cap ``cap_threads`` settled on in this process (an operator's own
    OMP_NUM_THREADS included), or None when it never ran."""
    return _cap[0] if _cap else None


def seed_everything(seed: int, deterministic: bool = False) -> None:
    random.seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed % 2**32)
    if "torch" in sys.modules:
        seed_torch(seed, deterministic)


def seed_torch(seed: int, deterministic: bool = False) -> None:
    import torch

    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
