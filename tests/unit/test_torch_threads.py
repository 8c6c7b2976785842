"""A torch node sizes torch's pool to its own thread cap, in the thread it runs in."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed here")
runtime = pytest.importorskip("subprocess_runner.packs._torch_runtime")


def _threads_seen(cap: int) -> int:
    seen: list[int] = []

    def node() -> None:
        runtime.prepare(SimpleNamespace(threads=cap, node_seed=None, deterministic=False))
        seen.append(torch.get_num_threads())

    thread = threading.Thread(target=node)
    thread.start()
    thread.join()
    return seen[0]


def test_each_node_gets_its_own_cap_in_its_own_thread():
    assert _threads_seen(1) == 1
    assert _threads_seen(2) == 2
    assert _threads_seen(1) == 1
