"""A torch node sizes torch's pool to its own thread cap, in the thread it runs in.

torch is imported inside the test, never when the module is collected: tests that run a
control plane in the pytest process check that it never imports torch by itself."""

from __future__ import annotations

import importlib
import threading
from types import SimpleNamespace

import pytest


def _threads_seen(cap: int) -> int:
    runtime = importlib.import_module("troupe.subprocess_runner.packs._torch_runtime")
    seen: list[int] = []

    def node() -> None:
        runtime.prepare(SimpleNamespace(threads=cap, node_seed=None, deterministic=False))
        seen.append(runtime.torch.get_num_threads())

    thread = threading.Thread(target=node)
    thread.start()
    thread.join()
    return seen[0]


def test_each_node_gets_its_own_cap_in_its_own_thread():
    pytest.importorskip("torch", reason="torch is not installed here")
    assert _threads_seen(1) == 1
    assert _threads_seen(2) == 2
    assert _threads_seen(1) == 1
