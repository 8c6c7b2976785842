"""The runs of bench/history.py's year, the same for troupe and for MLflow: run ``i`` is a
function of ``i`` alone (its id, its params, its two series of 20 points, when it was
made), so a build resumes anywhere, a pruned run is made again as it was, and MLflow is
filled with exactly the runs troupe holds. Standard library only: the MLflow side runs it
in its own virtual environment.

The graph is examples/digits_mlp.json trained 20 epochs. Runs come in blocks of 48: a
sweep of 36 variants (``adam.lr`` x ``mlp.hidden`` x ``mlp.dropout``, one batch size and
data seed a sweep), then 12 single runs with params drawn from the same grids. Their
``val_loss`` ends between about 0.06 and 0.5, near its best at ``lr`` 0.01 and the middle
width: ``adam.lr = 0.01 and metric.val_loss < 0.1`` holds for about a tenth of the runs.
"""

from __future__ import annotations

import math
import random
import uuid
from dataclasses import dataclass

LRS = (0.001, 0.003, 0.01, 0.03)
HIDDEN = ("64,32", "128,64", "256,128")
DROPOUT = (0.0, 0.1, 0.3)
BATCH = (32, 64, 128)
BLOCK = 48
SWEEP = len(LRS) * len(HIDDEN) * len(DROPOUT)  # 36 variants, the first runs of a block
EPOCHS = 20
SERIES = ("train_loss", "val_loss")
YEAR_S = 365 * 24 * 3600
T0 = 1764547200.0  # 2025-12-01T00:00:00Z: a year of runs from here, at a million runs
RUN_SPACING_S = YEAR_S / 1_000_000
SEED = 64


@dataclass(frozen=True)
class Run:
    index: int
    id: str
    created: float  # seconds since the epoch
    params: dict[str, object]  # "node.param" -> value, every param the bench varies
    points: dict[str, tuple[float, ...]]  # series -> its EPOCHS values, epoch 1 first
    sweep: int | None  # the block whose sweep it is a variant of
    variant: int | None
    seed: int | None


def sweep_id(block: int) -> str:
    return uuid.UUID(int=random.Random(SEED * 7_919 + block).getrandbits(128), version=4).hex


def sweep_batch(block: int) -> int:
    return BATCH[block % len(BATCH)]


def run(index: int) -> Run:
    rng = random.Random(SEED * 1_000_003 + index)
    run_id = uuid.UUID(int=rng.getrandbits(128), version=4).hex
    block, pos = divmod(index, BLOCK)
    if pos < SWEEP:
        lr, hidden, dropout = LRS[pos // 9], HIDDEN[pos // 3 % 3], DROPOUT[pos % 3]
        batch, data_seed, sweep, variant, seed = sweep_batch(block), block % 5, block, pos, None
    else:
        lr, hidden, dropout = rng.choice(LRS), rng.choice(HIDDEN), rng.choice(DROPOUT)
        batch, data_seed, sweep, variant, seed = rng.choice(BATCH), rng.randrange(5), None, None, None
    params: dict[str, object] = {"adam.lr": lr, "mlp.hidden": hidden, "mlp.dropout": dropout,
                                 "train_loader.batch_size": batch, "digits.seed": data_seed}
    # The loss it converges to: best at lr 0.01 and the middle width, a little worse with
    # much dropout, and noise between runs.
    final = 0.085 * (1 + 1.6 * abs(math.log10(lr / 0.01))) * (1 + 0.15 * abs(HIDDEN.index(hidden) - 1)) \
        * (1 + 0.4 * dropout) * math.exp(rng.gauss(0, 0.18))
    speed = 0.35 + 0.3 * rng.random()
    val = tuple(round(final + (2.3 - final) * math.exp(-speed * epoch) + abs(rng.gauss(0, 0.004)), 6)
                for epoch in range(1, EPOCHS + 1))
    train = tuple(round(v * (0.7 + 0.1 * rng.random()), 6) for v in val)
    return Run(index, run_id, T0 + index * RUN_SPACING_S, params, {"train_loss": train, "val_loss": val},
               sweep, variant, seed)
