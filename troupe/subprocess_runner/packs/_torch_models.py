"""Models, optimizers and losses of the torch pack (imported when such a node executes)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from troupe.subprocess_runner.packs._torch_runtime import describe_model, prepare

_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU, "sigmoid": nn.Sigmoid}


def _sizes(inputs: dict[str, Any], params: dict[str, Any]) -> tuple[int, int]:
    data = inputs.get("data")
    in_features = params["in_features"] or (data.features if data is not None else 0)
    out_features = params["out_features"] or (
        (data.classes or 1) if data is not None and data.task == "classification" else 1
    )
    if not in_features:
        raise ValueError("in_features is 0 and no data is connected to take it from")
    return in_features, out_features


class MLP(nn.Sequential):
    def summary(self) -> dict[str, Any]:
        return describe_model(self)


def mlp(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    prepare(ctx)
    in_features, out_features = _sizes(inputs, params)
    try:
        hidden = [int(w) for w in params["hidden"].replace(" ", "").split(",") if w]
    except ValueError:
        raise ValueError(f"hidden must be comma-separated widths like '64,32', got {params['hidden']!r}") from None
    layers: list[nn.Module] = [nn.Flatten()]
    width = in_features
    for size in hidden:
        layers += [nn.Linear(width, size), _ACTIVATIONS[params["activation"]]()]
        if params["dropout"] > 0:
            layers.append(nn.Dropout(params["dropout"]))
        width = size
    layers.append(nn.Linear(width, out_features))
    return {"model": MLP(*layers)}


class SmallCNN(nn.Module):
    def __init__(self, side: int, channels: int, classes: int) -> None:
        super().__init__()
        self.side = side
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(),
            nn.Conv2d(channels, channels * 2, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
        )
        self.head = nn.Linear(channels * 2 * 4, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(len(x), 1, self.side, self.side)
        return self.head(self.features(x).flatten(1))

    def summary(self) -> dict[str, Any]:
        return describe_model(self)


def small_cnn(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    prepare(ctx)
    data = inputs.get("data")
    side = params["image_size"] or (math.isqrt(data.features) if data is not None else 0)
    classes = params["classes"] or (data.classes if data is not None else 0)
    if not side or not classes:
        raise ValueError("connect data, or set image_size and classes")
    return {"model": SmallCNN(side, params["channels"], classes)}


@dataclass(frozen=True)
class OptimizerSpec:
    """Built into a torch optimizer by the loop that owns the model's parameters."""

    kind: str
    lr: float
    weight_decay: float

    def build(self, parameters: Any) -> torch.optim.Optimizer:
        cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[self.kind]
        return cls(parameters, lr=self.lr, weight_decay=self.weight_decay)

    def summary(self) -> dict[str, Any]:
        return {"type": "optimizer", "kind": self.kind, "lr": self.lr, "weight_decay": self.weight_decay}


@dataclass(frozen=True)
class LossSpec:
    kind: str

    def build(self) -> nn.Module:
        return {"cross_entropy": nn.CrossEntropyLoss, "mse": nn.MSELoss, "l1": nn.L1Loss}[self.kind]()

    def summary(self) -> dict[str, Any]:
        return {"type": "loss", "kind": self.kind}


def optimizer(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    return {"optimizer": OptimizerSpec(params["kind"], params["lr"], params["weight_decay"])}


def loss(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    return {"loss": LossSpec(params["kind"])}


def default_loss(task: str) -> LossSpec:
    return LossSpec("cross_entropy" if task == "classification" else "mse")
