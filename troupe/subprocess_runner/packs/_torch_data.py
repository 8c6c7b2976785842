"""Datasets and loaders of the torch pack (imported when such a node executes)."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from troupe.subprocess_runner.packs._torch_runtime import generator, prepare


@dataclass
class TensorData:
    """Features ``x``, targets ``y`` and what the task is: what models and loops need
    to size themselves."""

    x: torch.Tensor
    y: torch.Tensor
    task: str  # classification | regression
    classes: int | None

    @property
    def features(self) -> int:
        return int(self.x[0].numel())

    def summary(self) -> dict[str, Any]:
        return {"type": "dataset", "rows": len(self.x), "features": self.features, "task": self.task,
                "classes": self.classes}


@dataclass
class Loader:
    """A torch DataLoader with the dataset it batches."""

    loader: DataLoader[Any]
    data: TensorData

    def __iter__(self) -> Any:
        return iter(self.loader)

    def summary(self) -> dict[str, Any]:
        return {"type": "loader", "batch_size": self.loader.batch_size, "batches": len(self.loader),
                "dataset": self.data.summary()}


def _split(x: torch.Tensor, y: torch.Tensor, task: str, classes: int | None, params: dict[str, Any]
           ) -> dict[str, TensorData]:
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(params["seed"]))
    held_out = round(len(x) * params["val_fraction"])
    val, train = order[:held_out], order[held_out:]
    return {"train": TensorData(x[train], y[train], task, classes), "val": TensorData(x[val], y[val], task, classes)}


def digits(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    prepare(ctx)
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.tensor(bunch.data / 16.0, dtype=torch.float32)
    y = torch.tensor(bunch.target, dtype=torch.long)
    return _split(x, y, "classification", 10, params)


def synthetic_classification(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    prepare(ctx)
    rng = torch.Generator().manual_seed(params["seed"])
    centres = torch.randn(params["classes"], params["features"], generator=rng) * 2.0
    y = torch.randint(0, params["classes"], (params["n"],), generator=rng)
    x = centres[y] + params["noise"] * torch.randn(params["n"], params["features"], generator=rng)
    return _split(x, y, "classification", params["classes"], params)


def synthetic_regression(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    prepare(ctx)
    rng = torch.Generator().manual_seed(params["seed"])
    x = torch.randn(params["n"], params["features"], generator=rng)
    weights = torch.randn(params["features"], 1, generator=rng)
    y = x @ weights + params["noise"] * torch.randn(params["n"], 1, generator=rng)
    return _split(x, y, "regression", None, params)


def _numeric(cells: Any) -> bool:
    try:
        [float(cell) for cell in cells]
    except (ValueError, TypeError):
        return False
    return True


def csv_dataset(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    prepare(ctx)
    path = Path(params["path"]).expanduser()
    with ctx.reading("dataset", path).open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        raise ValueError(f"{path} has no rows")
    # An error names places in the file, never what is there: every session reads a
    # run's error, and the file may not be theirs to read.
    target = params["target"]
    if target not in rows[0]:
        raise ValueError(f"{path} has no column {target!r} in its header ({len(rows[0])} columns)")
    columns = [c for c in rows[0] if c != target]
    try:
        x = torch.tensor([[float(r[c]) for c in columns] for r in rows], dtype=torch.float32)
        raw_y = [float(r[target]) for r in rows]
    except (ValueError, TypeError):
        line = next(i for i, r in enumerate(rows, start=2) if not _numeric(r.values()))
        raise ValueError(f"{path}: every column must be numeric; line {line} is not") from None
    if params["task"] == "classification":
        labels = sorted(set(raw_y))
        index = {v: i for i, v in enumerate(labels)}
        y = torch.tensor([index[v] for v in raw_y], dtype=torch.long)
        return _split(x, y, "classification", len(labels), params)
    return _split(x, torch.tensor(raw_y, dtype=torch.float32).unsqueeze(1), "regression", None, params)


def data_loader(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    prepare(ctx)
    data: TensorData = inputs["dataset"]
    loader = DataLoader(
        TensorDataset(data.x, data.y), batch_size=params["batch_size"], shuffle=params["shuffle"],
        generator=generator(ctx),
    )
    return {"loader": Loader(loader, data)}
