"""A DDP group that fails to form in rank 0 (a card's context out of memory, a bad
rendezvous) stops the ranks it started and removes its store's folder: nothing waits out
the rendezvous timeout holding a card after the run has ended."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from tests.helpers import graph, node
from troupe.subprocess_runner import ddp
from troupe.subprocess_runner.ddp_plan import DdpPlan


@pytest.mark.timeout(60)
def test_a_group_that_fails_to_form_leaves_no_rank_and_no_store(tmp_path: Path, monkeypatch) -> None:
    # Imported here, not at collection: tests that start a control plane in this process
    # check that it never imports torch.
    torch_distributed = pytest.importorskip("torch.distributed", reason="torch is needed for a DDP group")

    def refuse(*args, **kwargs):
        raise RuntimeError("CUDA out of memory while creating the context")

    monkeypatch.setattr(torch_distributed, "init_process_group", refuse)  # this process only: rank 1 is spawned
    plan = DdpPlan(world=2, cuda=False, graph=graph(node("t", "core.Constant", value=1)), run_id="r1",
                   run_dir=str(tmp_path), seed=1, deterministic=False, shuffle_seed=7)
    with pytest.raises(RuntimeError, match="out of memory"):
        ddp.Group(plan, "t")
    assert [p for p in multiprocessing.active_children() if p.name.startswith("troupe-ddp-rank")] == []
    assert list(tmp_path.iterdir()) == []  # the FileStore's folder
