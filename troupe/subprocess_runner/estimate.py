"""A static memory estimate of a graph, from its params alone: no torch, no data read.

It is what the Queue on... dialog offers as a first budget for a graph no run has
measured; the server never applies it by itself (only measured peaks), because an
estimate from params cannot see a library's workspaces or fragmentation. The arithmetic
is float32 throughout: parameters, as many gradients, the optimizer's state (two
tensors a parameter for adam and adamw, none for plain sgd), the activations of one
batch kept for the backward pass, and the CUDA context of each card.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

from troupe.subprocess_runner.catalog import Catalog

_FLOAT = 4  # bytes
_MIB = 2**20
# (features, classes) of the datasets whose shapes their params say; classes 1: regression.
_DIGITS = (64, 10)


def estimate(graph: Mapping[str, Any], catalog: Catalog, cards: int = 1, context_mib: int = 500) -> dict[str, Any]:
    nodes = {node["id"]: node for node in graph.get("nodes", [])}
    params = {node_id: _params(node, catalog) for node_id, node in nodes.items()}
    into: dict[tuple[str, str], str] = {(e["target"], e["target_port"]): e["source"] for e in graph.get("edges", [])}
    notes: list[str] = []

    def shape(node_id: str | None) -> tuple[int, int] | None:
        """The (features, classes) of the dataset that feeds ``node_id`` (through loaders)."""
        while node_id is not None:
            node, p = nodes[node_id], params[node_id]
            match node["type"]:
                case "torch.DigitsDataset":
                    return _DIGITS
                case "torch.SyntheticClassification":
                    return int(p["features"]), int(p["classes"])
                case "torch.SyntheticRegression":
                    return int(p["features"]), 1
                case "torch.DataLoader":
                    node_id = into.get((node_id, "dataset"))
                case _:
                    return None
        return None

    weights = 0  # parameters
    widths = 0  # activations a sample keeps
    optimizer_states = 0
    for node_id, node in nodes.items():
        p = params[node_id]
        if node["type"] == "torch.MLP":
            data = shape(into.get((node_id, "data")))
            sizes = [int(p["in_features"]) or (data[0] if data else 0),
                     *(int(w) for w in str(p["hidden"]).replace(" ", "").split(",") if w.isdigit()),
                     int(p["out_features"]) or (data[1] if data else 0)]
            if 0 in (sizes[0], sizes[-1]):
                notes.append(f"{node_id}: in or out features unknown (no dataset whose shape its params say); "
                             "counted as 0")
            weights += sum(a * b + b for a, b in itertools.pairwise(sizes))
            widths += sum(sizes) * 2  # a layer's output and its activation
        elif node["type"] == "torch.SmallCNN":
            data = shape(into.get((node_id, "data")))
            side = int(p["image_size"]) or (math.isqrt(data[0]) if data else 0)
            classes = int(p["classes"]) or (data[1] if data else 0)
            c = int(p["channels"])
            weights += (9 * c + c) + (9 * c * 2 * c + 2 * c) + (2 * c * 4 * classes + classes)
            widths += side * side * (1 + 2 * c + 4 * c) + 8 * c + classes
        elif node["type"] == "torch.Optimizer":
            optimizer_states = max(optimizer_states, 0 if p["kind"] == "sgd" else 2)
    batch = max((int(params[i]["batch_size"]) for i, n in nodes.items() if n["type"] == "torch.DataLoader"),
                default=0)
    if not weights:
        notes.append("no model node whose size its params say: the estimate is the CUDA context alone")
    parts = {
        "parameters_mib": weights * _FLOAT / _MIB,
        "gradients_mib": weights * _FLOAT / _MIB,
        "optimizer_state_mib": weights * optimizer_states * _FLOAT / _MIB,
        "activations_mib": batch * widths * _FLOAT * 2 / _MIB,  # kept for backward, and their gradients
    }
    budget = max(1, math.ceil(sum(parts.values())))
    parts = {k: round(v, 3) for k, v in parts.items()} | {"cuda_context_mib": context_mib}
    return {
        "estimate_mib": (budget + context_mib) * cards, "budget_mib": budget, "cards": cards,
        "basis": "static estimate from the graph's params (float32; parameters, gradients, optimizer state, one "
                 "batch's activations, the CUDA context); not a measurement",
        "parts": parts, "notes": notes,
    }


def _params(node: Mapping[str, Any], catalog: Catalog) -> dict[str, Any]:
    kind = catalog.get(str(node.get("type")))
    defaults = {p.name: p.default for p in kind.params} if kind is not None else {}
    return defaults | dict(node.get("params") or {})
