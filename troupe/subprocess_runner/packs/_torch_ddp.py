"""``torch.TrainingLoop`` with ``strategy: ddp`` as one rank of a worker run's group
(``troupe.subprocess_runner.ddp``): the model wrapped in DistributedDataParallel, each rank on
its own shard of the training rows (a DistributedSampler with the seed all ranks share,
the last uneven rows dropped so every rank takes as many steps). Rank 0 reports: the
epoch's loss averaged over every rank's rows, validation, checkpoints, and at the end
whether every rank holds the same weights."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from troupe.subprocess_runner import ddp
from troupe.subprocess_runner.packs._torch_board import Board
from troupe.subprocess_runner.packs._torch_data import Loader
from troupe.subprocess_runner.packs._torch_epoch import end_epoch, target_of
from troupe.subprocess_runner.packs._torch_models import OptimizerSpec


def train_ddp(ctx: Any, model: torch.nn.Module, train: Loader, val: Loader | None, spec: OptimizerSpec,
              loss_fn: torch.nn.Module, params: dict[str, Any]) -> dict[str, Any]:
    plan: ddp.DdpPlan = ctx.ddp
    group = ddp.Group(plan, ctx.node_id)  # a group that fails to form stops the ranks it started
    ok = False
    try:
        if group.rank == 0:
            how = "nccl, one per card" if plan.cuda else "gloo on the cpu"
            ctx.sinks.emit("log", ctx.node_id, {"message": f"ddp: {group.world} ranks joined ({how})",
                                                "ddp": {"world": group.world, "pids": group.pids}})
        result = _train(ctx, group, model.to(group.device), train, val, spec, loss_fn, params)
        ok = True
        return result
    except BaseException as exc:
        raise group.explain(exc) from exc
    finally:
        group.close(ok)


def _train(ctx: Any, group: ddp.Group, model: torch.nn.Module, train: Loader, val: Loader | None,
           spec: OptimizerSpec, loss_fn: torch.nn.Module, params: dict[str, Any]) -> dict[str, Any]:
    lead = group.rank == 0
    index = int(group.device.split(":")[1]) if group.device.startswith("cuda") else None
    wrapped = DistributedDataParallel(model, device_ids=[index] if index is not None else None)
    optimizer = spec.build(wrapped.parameters())
    sampler: DistributedSampler[Any] = DistributedSampler(
        train.loader.dataset, num_replicas=group.world, rank=group.rank, shuffle=True, seed=group.plan.shuffle_seed,
        drop_last=True)
    loader = DataLoader(train.loader.dataset, batch_size=train.loader.batch_size, sampler=sampler)
    epochs, train_loss = params["epochs"], float("nan")
    board = Board.open(ctx) if lead else None  # the lead reports the group's epochs
    try:
        for epoch in range(1, epochs + 1):
            sampler.set_epoch(epoch)
            wrapped.train()
            sums = torch.zeros(2, dtype=torch.float64, device=group.device)
            for x, y in loader:
                ctx.check_cancelled()
                x, y = x.to(group.device), y.to(group.device)
                optimizer.zero_grad()
                out = wrapped(x)
                loss = loss_fn(out, target_of(loss_fn, y, out))
                loss.backward()
                optimizer.step()
                sums += torch.tensor([loss.item() * len(x), len(x)], dtype=torch.float64, device=group.device)
            dist.all_reduce(sums)  # every rank's rows: the epoch's loss is the group's
            train_loss = float(sums[0] / sums[1].clamp(min=1))
            if lead:
                end_epoch(ctx, model, val, loss_fn, params, epoch, train_loss, ranks=group.world, board=board)
    finally:
        if board is not None:
            board.close()
    digests: list[Any] = [None] * group.world
    dist.all_gather_object(digests, ddp.weights_digest(model))
    if lead:
        agree = len(set(digests)) == 1
        ctx.sinks.emit("log", ctx.node_id, {
            "message": f"ddp: the {group.world} ranks {'hold the same' if agree else 'DIFFER in their'} final weights",
            "ddp": {"world": group.world, "weights": digests}})
        if not agree:
            raise RuntimeError(f"the DDP ranks ended with different weights: {digests}")
    return {"model": model.to("cpu"), "train_loss": train_loss}
