"""What every torch node does first: cap torch's threads once per process, seed torch
from the node's seed, and describe torch values for events and recorded outputs.

Imported only when a torch node executes.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from troupe.subprocess_runner.seeding import seed_torch, thread_cap

_capped = threading.Lock()


def prepare(ctx: Any) -> None:
    # The node's own cap (its cpus, or its share of TROUPE_CPUS), else the cap whoever
    # runs us chose, which torch may have read too late when imported in a thread. Set
    # for every node: torch keeps the cap per thread, and pool threads run many nodes.
    threads = getattr(ctx, "threads", None) or thread_cap()
    if threads is not None and threads != torch.get_num_threads():
        with _capped:
            torch.set_num_threads(threads)
    if ctx.node_seed is not None:
        seed_torch(ctx.node_seed, ctx.deterministic)


def train_device(ctx: Any) -> torch.device:
    """Where a loop trains: the run's device when torch here can use it. A card the
    server believes in but torch cannot reach (a simulated inventory, a CPU build of
    torch beside a driver) trains on the CPU, and the run log says so."""
    name = str(getattr(ctx, "device", None) or "cpu")
    kind, _, index = name.partition(":")
    usable = kind == "cpu"
    if kind == "cuda":
        usable = torch.cuda.is_available() and int(index or 0) < torch.cuda.device_count()
    elif kind == "mps":
        usable = bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()
    if usable:
        return torch.device(name)
    ctx.warning(f"device {name} is not usable by torch in this process; training on cpu", code="device_fallback")
    return torch.device("cpu")


def model_device(model: torch.nn.Module) -> torch.device:
    """Where a model's weights are: its inputs go there (the cpu for a model without
    torch parameters)."""
    parameters = getattr(model, "parameters", None)
    return next(parameters(), torch.empty(0)).device if callable(parameters) else torch.device("cpu")


def generator(ctx: Any) -> torch.Generator | None:
    """A generator for shuffling that a seeded run makes the same every time."""
    if ctx.node_seed is None:
        return None
    return torch.Generator().manual_seed(ctx.node_seed)


def describe_tensor(value: torch.Tensor) -> dict[str, Any]:
    flat = value.detach().flatten()
    summary: dict[str, Any] = {
        "type": "tensor", "shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch."),
        "device": str(value.device), "preview": flat[:8].tolist(),
    }
    if flat.numel() and (flat.dtype.is_floating_point or flat.dtype in (torch.int32, torch.int64)):
        as_float = flat.float()
        summary.update(min=as_float.min().item(), max=as_float.max().item(), mean=as_float.mean().item())
    return summary


def describe_model(model: torch.nn.Module) -> dict[str, Any]:
    return {
        "type": "model", "class": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "layers": [f"{name}: {type(layer).__name__}" for name, layer in model.named_children()]
        or [type(model).__name__],
    }
