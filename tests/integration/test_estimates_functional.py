"""``POST /api/estimates``: a static estimate from a graph's params, labelled as one."""

from __future__ import annotations

import itertools
import json
import math

from tests.helpers import EXAMPLES, edge, graph, node

MIB = 2**20


def wide_mlp(hidden: str = "4096,4096", batch: int = 1024) -> dict:
    return graph(
        node("data", "torch.SyntheticClassification", features=20, classes=2),
        node("loader", "torch.DataLoader", batch_size=batch),
        node("mlp", "torch.MLP", hidden=hidden),
        {"id": "opt", "type": "torch.Optimizer", "params": {"kind": "adam"}},
        node("train", "torch.TrainingLoop", epochs=1),
        edges=(edge("data", "train", "loader", "dataset"), edge("data", "train", "mlp", "data"),
               edge("mlp", "model", "train", "model"), edge("loader", "loader", "train", "train"),
               edge("opt", "optimizer", "train", "optimizer")))


def test_an_estimate_counts_weights_gradients_adam_state_activations_and_the_context(shared_server):
    status, reply = shared_server.client.request("POST", "/api/estimates", {"graph": wide_mlp()})
    assert status == 200, reply
    sizes = [20, 4096, 4096, 2]
    weights = sum(a * b + b for a, b in itertools.pairwise(sizes))
    activations = 1024 * sum(sizes) * 2 * 4 * 2
    budget = math.ceil((weights * 4 * (1 + 1 + 2) + activations) / MIB)
    assert (reply["budget_mib"], reply["estimate_mib"], reply["cards"]) == (budget, budget + 500, 1)
    assert reply["parts"]["parameters_mib"] == round(weights * 4 / MIB, 3)
    assert reply["parts"]["optimizer_state_mib"] == round(2 * weights * 4 / MIB, 3)
    assert reply["parts"]["cuda_context_mib"] == 500 and "not a measurement" in reply["basis"]
    status, two = shared_server.client.request("POST", "/api/estimates",
                                               {"graph": wide_mlp(), "devices": ["cuda:0", "cuda:1"]})
    assert (status, two["estimate_mib"], two["cards"]) == (200, 2 * (budget + 500), 2)


def test_a_graph_without_a_sized_model_says_so_and_a_bad_graph_is_refused(shared_server):
    digits = json.loads((EXAMPLES / "digits_mlp.json").read_text())
    status, reply = shared_server.client.request("POST", "/api/estimates", {"graph": digits})
    assert status == 200 and reply["budget_mib"] >= 1 and reply["notes"] == []
    status, reply = shared_server.client.request("POST", "/api/estimates",
                                                 {"graph": graph(node("a", "core.Constant", value=1))})
    assert status == 200 and reply["budget_mib"] == 1 and "CUDA context alone" in reply["notes"][0]
    status, reply = shared_server.client.request("POST", "/api/estimates", {"graph": graph(node("a", "no.Such"))})
    assert status == 400 and reply["error"]["pointer"] == "/graph/nodes/0/type"
    status, reply = shared_server.client.request("POST", "/api/estimates", {"graph": wide_mlp(), "devices": []})
    assert status == 400 and reply["error"]["pointer"] == "/devices"
    assert shared_server.anonymous.request("POST", "/api/estimates", {"graph": wide_mlp()})[0] == 401
