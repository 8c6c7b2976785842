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
    first = 1
    point = ctx.resume_point() if hasattr(ctx, "resume_point") else None
    if point is not None:
        done, train_loss = _resume(ctx, point, model, optimizer, train, device)
        first = done + 1
    for epoch in range(first, epochs + 1):
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
        end_epoch(ctx, model, val, loss_fn, params, epoch, train_loss, optimizer=optimizer, train=train)
    return {"model": model, "train_loss": train_loss}


def end_epoch(ctx: Any, model: torch.nn.Module, val: Loader | None, loss_fn: torch.nn.Module,
              params: dict[str, Any], epoch: int, train_loss: float, optimizer: Any = None,
              train: Loader | None = None, **extra: Any) -> None:
    """An epoch's report: its training loss, validation, and a checkpoint when due: the
    weights (``<node>-epoch-<k>.pt``, a plain state dict, as always) and beside them what
    it takes to continue exactly (``.state.pt``: optimizer, epoch, every random state
    training draws from), each written under a temporary name and renamed."""
    epochs = params["epochs"]
    ctx.metric("train_loss", train_loss, step=epoch, epoch=epoch, epochs=epochs, **extra)
    if val is not None:
        val_loss, val_accuracy = measure(model, val, loss_fn, ctx)
        ctx.metric("val_loss", val_loss, step=epoch, epoch=epoch, epochs=epochs)
        if val_accuracy is not None:
            ctx.metric("val_accuracy", val_accuracy, step=epoch, epoch=epoch, epochs=epochs)
    every = params["checkpoint_every"]
    if every and (epoch % every == 0 or epoch == epochs):
        folder = ctx.files("checkpoints")
        weights = folder / f"{ctx.node_id}-epoch-{epoch}.pt"
        _save(model.state_dict(), weights)
        ctx.artifact("checkpoint", weights)
        if optimizer is not None:  # (a DDP loop's checkpoint holds the weights only)
            state = folder / f"{ctx.node_id}-epoch-{epoch}.state.pt"
            _save({"format": 1, "epoch": epoch, "train_loss": train_loss, "optimizer": optimizer.state_dict(),
                   "rng": capture_rng(train)}, state)
            ctx.artifact("training_state", state)


def _save(value: Any, path: Path) -> None:
    """A file is whole or absent: written beside, then renamed over (never half there)."""
    partial = path.with_name(f".{path.name}.partial")
    torch.save(value, partial)
    partial.replace(path)


def capture_rng(train: Loader | None) -> dict[str, Any]:
    """Every random state a loop draws from, as tensors (loadable with weights_only):
    torch's global generator (dropout, an unseeded loader's shuffle), the loader's own
    (a seeded run's), CUDA's, numpy's and Python's."""
    import random

    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    generator = getattr(getattr(train, "loader", None), "generator", None)
    if generator is not None:
        state["loader"] = generator.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    version, internal, gauss = random.getstate()
    state["python"] = {"version": version, "state": torch.tensor(internal, dtype=torch.int64), "gauss": gauss}
    try:
        import numpy

        kind, keys, pos, has_gauss, cached = numpy.random.get_state(legacy=True)
        state["numpy"] = {"kind": kind, "keys": torch.from_numpy(numpy.asarray(keys, dtype="int64")), "pos": int(pos),
                          "has_gauss": int(has_gauss), "cached": float(cached)}
    except ImportError:  # numpy comes with torch; without it there is no numpy state to keep
        pass
    return state


def restore_rng(state: dict[str, Any], train: Loader | None) -> None:
    import random

    torch.set_rng_state(state["torch"])
    generator = getattr(getattr(train, "loader", None), "generator", None)
    if generator is not None and "loader" in state:
        generator.set_state(state["loader"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    python = state["python"]
    random.setstate((python["version"], tuple(int(v) for v in python["state"].tolist()), python["gauss"]))
    if "numpy" in state:
        import numpy

        saved = state["numpy"]
        numpy.random.set_state((saved["kind"], saved["keys"].numpy().astype("uint32"), saved["pos"],
                                saved["has_gauss"], saved["cached"]))


def _resume(ctx: Any, point: Any, model: torch.nn.Module, optimizer: Any, train: Loader,
            device: torch.device) -> tuple[int, float]:
    """Loads the checkpoint the run continues from; returns its epoch and training loss."""
    model.load_state_dict(torch.load(point["weights"], weights_only=True, map_location=device))
    state = torch.load(point["state"], weights_only=True)
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
    ctx.reading("checkpoint", path)
    model: torch.nn.Module = inputs["model"]
    model.load_state_dict(torch.load(path, weights_only=True))
    return {"model": model}
