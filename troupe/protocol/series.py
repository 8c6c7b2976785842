"""Which way a series is better, and which epoch a checkpoint file holds: the rules a
run's process applies when it keeps checkpoints in bounds (``keep_best``), and the
server and the CLI apply when they say which checkpoint is best, so all of them name
the same one."""

from __future__ import annotations

import re

# A series whose name says it measures an error is best when lowest; any other (an
# accuracy, a BLEU, a reward) when highest.
LOWER_IS_BETTER = ("loss", "error", "err", "mse", "mae", "rmse", "perplexity", "wer", "cer")
_NUMBER = re.compile(r"\d+")


def lower_is_better(name: str) -> bool:
    return any(word in name.lower() for word in LOWER_IS_BETTER)


def keep_best(text: str) -> tuple[str, bool] | None:
    """``keep_best``'s series and whether lower is better: ``val_loss`` (by its name),
    ``min:reward`` or ``max:val_error`` (said outright); None for an empty text."""
    text = text.strip()
    if not text:
        return None
    way, _, rest = text.partition(":")
    if way in ("min", "max") and rest:
        return rest, way == "min"
    return text, lower_is_better(text)


def checkpoint_number(path: str) -> int | None:
    """The epoch a checkpoint file holds: the last number in its name (``epoch-7.pt``,
    ``loop-epoch-7.pt``: 7), as a resume reads it; None for a name without one."""
    numbers = _NUMBER.findall(path.rsplit("/", 1)[-1])
    return int(numbers[-1]) if numbers else None
