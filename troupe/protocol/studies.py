"""Request schemas of ``/api/studies``: variants x repeats under a server-enforced budget."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from troupe.protocol.api import SEED_MAX, RunOptions
from troupe.protocol.graph import Graph
from troupe.protocol.numbers import INTEGRAL, Integer
from troupe.protocol.sweeps import SweepSpec, exactly_one_of


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

    max_runs: Annotated[int, Field(ge=0), INTEGRAL] | None = None
    max_parallel_runs: Annotated[int, Field(ge=1), INTEGRAL] | None = None
    max_run_seconds: float | None = Field(default=None, gt=0)
    max_active_seconds: float | None = Field(default=None, gt=0)


class SubmitStudy(BaseModel):
    """Body of ``POST /api/studies``: ``variants`` or a ``sweep_spec`` that makes them."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True,
                              json_schema_extra=exactly_one_of("variants", "sweep_spec"))

    name: str | None = Field(default=None, max_length=200)
    base_graph: Graph
    variants: list[StudyVariant] | None = Field(default=None, min_length=1, max_length=1000)
    sweep_spec: SweepSpec | None = None
    repeats: Integer = Field(default=1, ge=1, le=1000)
    seed: Annotated[int, Field(ge=0, le=SEED_MAX), INTEGRAL] | None = None
    objective: StudyObjective
    budget: Budget = Field(default_factory=Budget)
    options: RunOptions = Field(default_factory=RunOptions)


class PluginJob(BaseModel):
    """Body of ``POST /api/plugins/{plugin_id}/jobs`` as the OpenAPI document states it:
    the one kind of job, a study, and the study's own body as its spec."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["study"]
    spec: SubmitStudy
    idempotency_key: str = Field(min_length=1, max_length=200)


class ResumeStudy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    budget: Budget = Field(default_factory=Budget)
