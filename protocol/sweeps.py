"""Request schemas of ``/api/sweeps``: one graph compiled into many queued runs."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from protocol.api import SEED_MAX, RunOptions
from protocol.graph import Graph


class SweepRange(BaseModel):
    """``count`` points from ``min`` to ``max``, evenly spaced on a linear or base-10 log
    scale; ``type: int`` rounds them and keeps the distinct ones."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    min: float
    max: float
    count: int = Field(ge=1)
    scale: Literal["linear", "log"] = "linear"
    type: Literal["float", "int"] | None = None


class SweepParam(BaseModel):
    """One swept param of one node: explicit distinct ``values``, or a ``range``."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    node_id: str
    param: str
    values: list[Any] | None = Field(default=None, min_length=1)
    range: SweepRange | None = None


class SweepSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    method: Literal["grid", "random"]
    params: list[SweepParam] = Field(min_length=1)
    samples: int | None = Field(default=None, ge=1)
    seed: int | None = Field(default=None, ge=0, le=SEED_MAX)


class Objective(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    metric: str = Field(min_length=1, max_length=200)
    direction: Literal["minimize", "maximize"]


class SubmitSweep(BaseModel):
    """Body of ``POST /api/sweeps``."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    base_graph: Graph
    name: str | None = Field(default=None, max_length=200)
    sweep_spec: SweepSpec
    seed_variants: StrictBool = False
    objective: Objective
    options: RunOptions = Field(default_factory=RunOptions)
