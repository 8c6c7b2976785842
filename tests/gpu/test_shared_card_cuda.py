"""A card shared by memory budget (issue 14): three budgeted runs are admitted onto one
card together, and a run over its budget fails alone with an out-of-memory error while
its neighbours finish. A real agent reads the card; each run's child caps its allocator.

The admission half runs everywhere on a simulated card; the out-of-memory and the
measured peaks need a real card and skip elsewhere, saying why."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.gpu.cards import CUDA_REASON, start_agent, trainer

BUDGET_MIB = 2048
GREEDY_MIB = 128


def _pack_the_card(server: Any, worker: str, neighbour: dict, greedy_graph: dict,
                   ) -> tuple[list[str], str, dict[str, list[dict]]]:
    """Shares the worker's card, admits three neighbours with a 2 GiB budget each and a
    greedy run with 128 MiB, and waits for all four to end. Returns their ids and events."""
    status, reply = server.client.request("PUT", f"/api/workers/{worker}/devices/cuda:0", {"sharing": "memory"})
    assert status == 200, reply
    on_card = {"worker": worker, "memory_gib": BUDGET_MIB / 1024}
    neighbours = [server.submit(neighbour, target=on_card)["run_id"] for _ in range(3)]
    for run_id in neighbours:
        assert server.get(f"/api/runs/{run_id}")["status"] == "running"  # admitted at once: the card is shared
    greedy = server.submit(greedy_graph, target={"worker": worker, "memory_gib": GREEDY_MIB / 1024,
                                                                   "wait": True})["run_id"]
    events = {run_id: server.events_until_finished(run_id, timeout=300) for run_id in [*neighbours, greedy]}
    for run_id, budget in [*((n, BUDGET_MIB) for n in neighbours), (greedy, GREEDY_MIB)]:
        started = next(e for e in events[run_id] if e["type"] == "run_started")["payload"]
        assert started["memory_budget_mib"] == budget and started["device"] == "cuda:0", started
    rows = [server.get(f"/api/runs/{run_id}") for run_id in neighbours]
    # The three held the card at the same time: slot counting would have run them in turn.
    assert max(r["started_at"] for r in rows) < min(r["finished_at"] for r in rows), rows
    return neighbours, greedy, events


def test_three_budgets_are_admitted_onto_one_simulated_card_together(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agent = start_agent(server, tmp_path, "gpu-sim", simulated=1)
    try:
        # Small loops: only admission is checked (without CUDA they train on the CPU).
        small = trainer("16", epochs=1, samples=256)
        neighbours, greedy, events = _pack_the_card(server, "gpu-sim", small, small)
        for run_id, budget in [*((n, BUDGET_MIB) for n in neighbours), (greedy, GREEDY_MIB)]:
            logs = [e["payload"]["message"] for e in events[run_id] if e["type"] == "log"]
            assert any(f"memory budget of {budget} MiB" in line or f"memory budget {budget} MiB" in line
                       for line in logs), logs
    finally:
        agent.terminate()
        agent.wait(30)


@pytest.mark.skipif(CUDA_REASON is not None, reason=CUDA_REASON or "")
@pytest.mark.timeout(600)
def test_on_a_real_card_an_over_budget_run_fails_alone(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agent = start_agent(server, tmp_path, "gpu-real", CUDA_VISIBLE_DEVICES="0")
    try:
        # 8192 x 8192 float32 weights alone are 256 MiB: over a 128 MiB budget.
        neighbours, greedy, events = _pack_the_card(server, "gpu-real", trainer("256,128", epochs=30),
                                                    trainer("8192,8192", epochs=1))
        ended = events[greedy][-1]["payload"]
        assert ended["status"] == "failed" and f"out of memory under the run's budget of {GREEDY_MIB} MiB" in \
            ended["error"], ended
        assert server.get(f"/api/runs/{greedy}")["out_of_memory"] is True
        for run_id in neighbours:
            assert events[run_id][-1]["payload"]["status"] == "succeeded", events[run_id][-3:]
            assert not [e for e in events[run_id] if e["payload"].get("code") == "device_fallback"]  # on the card
            row = server.get(f"/api/runs/{run_id}")
            # The smallest MLP's allocator peak is well under 1 MiB of weights: it must not round to 0.
            assert row["peak_memory_exact"] is True and 0 < row["peak_memory_mib"] <= BUDGET_MIB, \
                json.dumps(row)[:300]
    finally:
        agent.terminate()
        agent.wait(30)
