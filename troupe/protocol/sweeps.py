"""Request schemas of ``/api/sweeps``: one graph compiled into many queued runs."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from troupe.protocol.api import SEED_MAX, RunOptions
from troupe.protocol.graph import Graph
from troupe.protocol.numbers import INTEGRAL, Integer

# The most points a range may ask for, whatever TROUPE_MAX_SWEEP_DOMAIN says: an int
# range's points may round to few values, but never more than this many are computed.
MAX_RANGE_COUNT = 10_000


class SweepRange(BaseModel):
    """``count`` points from ``min`` to ``max``, evenly spaced on a linear or base-10 log
    scale; ``type: int`` rounds them and keeps the distinct ones."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    min: float = Field(allow_inf_nan=False)
    max: float = Field(allow_inf_nan=False)
    count: Integer = Field(ge=1, le=MAX_RANGE_COUNT)
    scale: Literal["linear", "log"] = "linear"
    type: Literal["float", "int"] | None = None


def exactly_one_of(first: str, second: str) -> dict[str, Any]:
    """A JSON Schema ``not`` that says "exactly one of the two fields, given and not null"
    as the server reads it, so a client generated from the document never sends both or
    none. Said with ``not`` alone, not as a ``oneOf`` of two partial objects: a generator
    makes a model of the object's properties and leaves ``not`` aside, where a ``oneOf``
    would make it a union of two shapes that each lack the other fields."""

    def given(name: str) -> dict[str, Any]:
        return {"required": [name], "properties": {name: {"not": {"type": "null"}}}}

    both = {"required": [first, second], "properties": {name: {"not": {"type": "null"}} for name in (first, second)}}
    return {"not": {"anyOf": [both, {"not": {"anyOf": [given(first), given(second)]}}]}}


class SweepParam(BaseModel):
    """One swept param of one node: explicit distinct ``values``, or a ``range``."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True,
                              json_schema_extra=exactly_one_of("values", "range"))

    node_id: str
    param: str
    values: list[Any] | None = Field(default=None, min_length=1)
    range: SweepRange | None = None


class SweepSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    method: Literal["grid", "random"]
    params: list[SweepParam] = Field(min_length=1)
    samples: Annotated[int, Field(ge=1), INTEGRAL] | None = None
    seed: Annotated[int, Field(ge=0, le=SEED_MAX), INTEGRAL] | None = None


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
