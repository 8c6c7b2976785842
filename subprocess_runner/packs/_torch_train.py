"""Training, evaluation and checkpoints of the torch pack (imported when such a node
executes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from subprocess_runner.packs._torch_data import Loader
from subprocess_runner.packs._torch_models import LossSpec, OptimizerSpec, default_loss
from subprocess_runner.packs._torch_runtime import model_device, prepare, train_device


def loss_fn_of(inputs: dict[str, Any], data: Loader) -> torch.nn.Module:
    spec: LossSpec = inputs.get("loss") or default_loss(data.data.task)
    return spec.build()


def target_of(loss_fn: torch.nn.Module, y: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    if isinstance(loss_fn, torch.nn.CrossEntropyLoss):
        return y
    return y.float().reshape(out.shape)


def measure(model: torch.nn.Module, loader: Loader, loss_fn: torch.nn.Module, ctx: Any) -> tuple[float, float | None]:
    """Mean loss and, for classification, accuracy over a loader."""
    model.eval()
    total, correct, count = 0.0, 0, 0
    device = model_device(model)  # the run's card, or a DDP rank's
    with torch.no_grad():
        for x, y in loader:
            ctx.check_cancelled()
            x, y = x.to(device), y.to(device)
            out = model(x)
            total += loss_fn(out, target_of(loss_fn, y, out)).item() * len(x)
            if loader.data.task == "classification":
                correct += int((out.argmax(dim=1) == y).sum())
            count += len(x)
    if count == 0:
        raise ValueError("the loader has no rows")
    accuracy = correct / count if loader.data.task == "classification" else None
    return total / count, accuracy


def training_loop(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    prepare(ctx)
    model: torch.nn.Module = inputs["model"]
    train: Loader = inputs["train"]
    if params["strategy"] != "ddp" or getattr(ctx, "ddp", None) is None:
        model.to(train_device(ctx))  # before the optimizer takes its parameters (a no-op on the cpu)
    val: Loader | None = inputs.get("val")
    spec: OptimizerSpec = inputs.get("optimizer") or OptimizerSpec("adam", 1e-3, 0.0)
    optimizer = spec.build(model.parameters())
    loss_fn = loss_fn_of(inputs, train)
    if params["strategy"] == "ddp" and getattr(ctx, "ddp", None) is not None:
        from subprocess_runner.packs._torch_ddp import train_ddp

        return train_ddp(ctx, model, train, val, spec, loss_fn, params)
    if params["strategy"] == "ddp":
        ctx.warning("strategy ddp needs a multi-card worker run; training in this one process instead",
                    code="ddp_not_available")
    epochs = params["epochs"]
    train_loss = float("nan")
    device = model_device(model)
    for epoch in range(1, epochs + 1):
        model.train()
        total, count = 0.0, 0
        for x, y in train:
            ctx.check_cancelled()  # between batches: a cancel never waits for a whole epoch
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            out = model(x)
            loss = loss_fn(out, target_of(loss_fn, y, out))
            loss.backward()
            optimizer.step()
            total += loss.item() * len(x)
            count += len(x)
        train_loss = total / max(count, 1)
        end_epoch(ctx, model, val, loss_fn, params, epoch, train_loss)
    return {"model": model, "train_loss": train_loss}


def end_epoch(ctx: Any, model: torch.nn.Module, val: Loader | None, loss_fn: torch.nn.Module,
              params: dict[str, Any], epoch: int, train_loss: float, **extra: Any) -> None:
    """An epoch's report: its training loss, validation, and a checkpoint when due."""
    epochs = params["epochs"]
    ctx.metric("train_loss", train_loss, step=epoch, epoch=epoch, epochs=epochs, **extra)
    if val is not None:
        val_loss, val_accuracy = measure(model, val, loss_fn, ctx)
        ctx.metric("val_loss", val_loss, step=epoch, epoch=epoch, epochs=epochs)
        if val_accuracy is not None:
            ctx.metric("val_accuracy", val_accuracy, step=epoch, epoch=epoch, epochs=epochs)
    every = params["checkpoint_every"]
    if every and (epoch % every == 0 or epoch == epochs):
        path = ctx.files("checkpoints") / f"{ctx.node_id}-epoch-{epoch}.pt"
        torch.save(model.state_dict(), path)
        ctx.artifact("checkpoint", path)


def evaluate(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    prepare(ctx)
    data: Loader = inputs["data"]
    loss, accuracy = measure(inputs["model"], data, loss_fn_of(inputs, data), ctx)
    ctx.metric("eval_loss", loss)
    if accuracy is not None:
        ctx.metric("eval_accuracy", accuracy)
    return {"accuracy": accuracy, "loss": loss}


def predict(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    prepare(ctx)
    model: torch.nn.Module = inputs["model"]
    data: Loader = inputs["data"]
    model.eval()
    outputs = []
    device = model_device(model)
    with torch.no_grad():
        for x, _ in data:
            ctx.check_cancelled()
            out = model(x.to(device)).cpu()
            outputs.append(out.argmax(dim=1) if data.data.task == "classification" else out)
    return {"predictions": torch.cat(outputs) if outputs else torch.empty(0)}


def save_checkpoint(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    prepare(ctx)
    name = Path(params["name"]).name or "model"
    path = ctx.files("checkpoints") / f"{name}.pt"
    torch.save(inputs["model"].state_dict(), path)
    ctx.artifact("checkpoint", path)
    return {"model": inputs["model"], "path": str(path)}


def load_checkpoint(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    prepare(ctx)
    path = Path(params["path"]).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    ctx.reading("checkpoint", path)
    model: torch.nn.Module = inputs["model"]
    model.load_state_dict(torch.load(path, weights_only=True))
    return {"model": model}
