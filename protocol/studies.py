"""Request schemas of ``/api/studies``: variants x repeats under a server-enforced budget."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from protocol.api import SEED_MAX, RunOptions
from protocol.graph import Graph
from protocol.sweeps import SweepSpec


class ParamValue(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    node_id: str
    param: str
    value: Any


class StudyVariant(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str = Field(min_length=1, max_length=200)
    params: list[ParamValue] = Field(default_factory=list)


class StudyObjective(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    metric: str = Field(min_length=1, max_length=200)
    direction: Literal["minimize", "maximize"]
    reduce: Literal["mean", "median", "min", "max"] = "mean"


class Budget(BaseModel):
    """Every field is optional; an absent one is no limit."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    max_runs: int | None = Field(default=None, ge=0)
    max_parallel_runs: int | None = Field(default=None, ge=1)
    max_run_seconds: float | None = Field(default=None, gt=0)
    max_active_seconds: float | None = Field(default=None, gt=0)


class SubmitStudy(BaseModel):
    """Body of ``POST /api/studies``: ``variants`` or a ``sweep_spec`` that makes them."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str | None = Field(default=None, max_length=200)
    base_graph: Graph
    variants: list[StudyVariant] | None = Field(default=None, min_length=1, max_length=1000)
    sweep_spec: SweepSpec | None = None
    repeats: int = Field(default=1, ge=1, le=1000)
    seed: int | None = Field(default=None, ge=0, le=SEED_MAX)
    objective: StudyObjective
    budget: Budget = Field(default_factory=Budget)
    options: RunOptions = Field(default_factory=RunOptions)


class ResumeStudy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    budget: Budget = Field(default_factory=Budget)
