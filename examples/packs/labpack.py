"""labpack: two nodes of a lab's own, written as plain typed functions.

Put this file in TROUPE_HOME/packs/ (or start the server with --packs examples/packs)
and its nodes are labpack.scale and labpack.summary in the catalog."""

from __future__ import annotations

from typing import TypedDict

from troupe import node

__version__ = "1.0"


@node
def scale(x: float, factor: float = 2.0) -> float:
    """Multiplies its input by a factor."""
    return x * factor


class Summary(TypedDict):
    mean: float
    spread: float


@node(resources={"cpus": 1})
def summary(a: float, b: float, ctx=None, sample: bool = False) -> Summary:
    """The mean of two numbers and their standard deviation (the population's, or the
    sample's with ``sample``), each a metric of the run as well."""
    import statistics  # a pack imports what it needs inside its nodes: the catalog stays light

    mean = statistics.fmean([a, b])
    spread = statistics.stdev([a, b]) if sample else statistics.pstdev([a, b])
    if ctx is not None:
        ctx.metric("spread", spread)
    return {"mean": mean, "spread": spread}
