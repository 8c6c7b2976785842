"""An epoch's end in the torch pack's training loops: its report (training loss,
validation) and its checkpoint, with the random states a resumed run restores.

Shared by the single-process loop (``_torch_train``) and a DDP rank's loop
(``_torch_ddp``), which the former starts: here so that neither imports the other back.
Imported when such a node executes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from troupe.protocol.graph import node_file_stem
from troupe.subprocess_runner import checkpoint_bounds
from troupe.subprocess_runner.packs._torch_data import Loader
from troupe.subprocess_runner.packs._torch_runtime import model_device


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


def end_epoch(ctx: Any, model: torch.nn.Module, val: Loader | None, loss_fn: torch.nn.Module,
              params: dict[str, Any], epoch: int, train_loss: float, optimizer: Any = None,
              train: Loader | None = None, board: Any = None, **extra: Any) -> None:
    """An epoch's report: its training loss, validation, and a checkpoint when due: the
    weights (``<node>-epoch-<k>.pt``, a plain state dict, as always) and beside them what
    it takes to continue exactly (``.state.pt``: optimizer, epoch, every random state
    training draws from), each written under a temporary name and renamed. ``board``:
    the loop's TensorBoard writer (``_torch_board``), given the same points."""
    epochs = params["epochs"]
    bounds = checkpoint_bounds.for_node(ctx, params)  # made before the first points: keep_best hears them
    ctx.metric("train_loss", train_loss, step=epoch, epoch=epoch, epochs=epochs, **extra)
    points = {"train_loss": train_loss}
    if val is not None:
        val_loss, val_accuracy = measure(model, val, loss_fn, ctx)
        ctx.metric("val_loss", val_loss, step=epoch, epoch=epoch, epochs=epochs)
        points["val_loss"] = val_loss
        if val_accuracy is not None:
            ctx.metric("val_accuracy", val_accuracy, step=epoch, epoch=epoch, epochs=epochs)
            points["val_accuracy"] = val_accuracy
    if board is not None:
        for name, value in points.items():
            board.add(name, value, epoch)
        board.epoch_done()
    every = params["checkpoint_every"]
    if every and (epoch % every == 0 or epoch == epochs):
        folder = ctx.files("checkpoints")
        weights = folder / f"{node_file_stem(ctx.node_id)}-epoch-{epoch}.pt"
        _save(model.state_dict(), weights)
        ctx.artifact("checkpoint", weights)
        if optimizer is not None:  # (a DDP loop's checkpoint holds the weights only)
            state = folder / f"{node_file_stem(ctx.node_id)}-epoch-{epoch}.state.pt"
            _save({"format": 1, "epoch": epoch, "train_loss": train_loss, "optimizer": optimizer.state_dict(),
                   "rng": capture_rng(train)}, state)
            ctx.artifact("training_state", state)
        if bounds is not None:  # keep_checkpoints / keep_best: the older ones are let go
            bounds.kept([("checkpoint", weights), *([("training_state", state)] if optimizer is not None else [])])


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
