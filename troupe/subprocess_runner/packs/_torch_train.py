"""Training, evaluation and checkpoints of the torch pack (imported when such a node
executes)."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import torch

from troupe.subprocess_runner.packs._torch_board import Board
from troupe.subprocess_runner.packs._torch_data import Loader
from troupe.subprocess_runner.packs._torch_epoch import end_epoch, measure, restore_rng, target_of
from troupe.subprocess_runner.packs._torch_models import LossSpec, OptimizerSpec, default_loss
from troupe.subprocess_runner.packs._torch_runtime import model_device, prepare, train_device


def loss_fn_of(inputs: dict[str, Any], data: Loader) -> torch.nn.Module:
    spec: LossSpec = inputs.get("loss") or default_loss(data.data.task)
    return spec.build()


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
        from troupe.subprocess_runner.packs._torch_ddp import train_ddp

        return train_ddp(ctx, model, train, val, spec, loss_fn, params)
    if params["strategy"] == "ddp":
        ctx.warning("strategy ddp needs a multi-card worker run; training in this one process instead",
                    code="ddp_not_available")
    epochs = params["epochs"]
    train_loss = float("nan")
    device = model_device(model)
    first = 1
    point = ctx.resume_point() if hasattr(ctx, "resume_point") else None
    if point is not None:
        done, train_loss = _resume(ctx, point, model, optimizer, train, device)
        first = done + 1
    board = Board.open(ctx)
    try:
        for epoch in range(first, epochs + 1):
            train_loss = _epoch(ctx, model, train, optimizer, loss_fn, device)
            end_epoch(ctx, model, val, loss_fn, params, epoch, train_loss, optimizer=optimizer, train=train,
                      board=board)
    finally:
        if board is not None:
            board.close()
    return {"model": model, "train_loss": train_loss}


def _epoch(ctx: Any, model: torch.nn.Module, train: Loader, optimizer: Any, loss_fn: torch.nn.Module,
           device: torch.device) -> float:
    """One pass over the training data; its mean loss."""
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
    return total / max(count, 1)


def _checked(point: Any, part: str) -> io.BytesIO:
    from troupe.subprocess_runner.errors import CheckpointUnavailable

    path = point[part]
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CheckpointUnavailable(f"the {part} of the checkpoint to resume from cannot be read ({exc.strerror})") \
            from None
    expected = point.get(f"{part}_sha256")
    if expected is not None and hashlib.sha256(data).hexdigest() != expected:
        raise CheckpointUnavailable(f"the {part} of the checkpoint to resume from is not the file the run records "
                                    f"(sha256 {expected[:16]}...): it changed after the rerun was asked for")
    return io.BytesIO(data)


def _resume(ctx: Any, point: Any, model: torch.nn.Module, optimizer: Any, train: Loader,
            device: torch.device) -> tuple[int, float]:
    """Loads the checkpoint the run continues from; returns its epoch and training loss.
    Each file is read once, checked against the sha256 the run records, and loaded from
    those very bytes: a file swapped after the rerun was asked for is never trained on."""
    from troupe.subprocess_runner.errors import CheckpointUnavailable

    weights, state_file = _checked(point, "weights"), _checked(point, "state")
    try:
        weights_dict = torch.load(weights, weights_only=True, map_location=device)
        state = torch.load(state_file, weights_only=True)
    except Exception as exc:  # its words may quote the file's bytes: named by kind only
        raise CheckpointUnavailable(f"the checkpoint to resume from cannot be loaded ({type(exc).__name__})") \
            from None
    model.load_state_dict(weights_dict)
    optimizer.load_state_dict(state["optimizer"])
    restore_rng(state["rng"], train)
    epoch = int(state["epoch"])
    ctx.log(f"resumed from the checkpoint of epoch {epoch}; training goes on from epoch {epoch + 1}")
    return epoch, float(state["train_loss"])


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
    opened = ctx.reading("checkpoint", path)
    model: torch.nn.Module = inputs["model"]
    try:
        weights = torch.load(opened, weights_only=True)
    except Exception as exc:  # its words may quote the file's bytes: named by kind only
        raise ValueError(f"{path} is not a checkpoint torch can load ({type(exc).__name__})") from None
    model.load_state_dict(weights)
    return {"model": model}
