"""Flavors: named sizes (``gpu-small``) that a node or a run asks for instead of raw
numbers, so a graph written for one lab's machines keeps its meaning on another's. The
sizes live in the database and are read again each time a run is built."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from troupe.protocol.numbers import INTEGRAL

_RAM = re.compile(r"^\s*(\d{1,9}(?:\.\d{1,9})?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE | re.ASCII)
RAM_MAX_MB = 2**40  # a bound a 64-bit column holds (a million TB)
_UNIT_MB = {"": 1, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}
FLAVOR_NAME = r"^[a-z0-9][a-z0-9_.\-]{0,63}$"
DURATION_MAX_S = 1e9  # a run's expected time: about 31 years, so any sum of a graph's stays a finite number


def ram_mb(value: int | str) -> int:
    """Memory in MB: a number of MB, or a text with a unit ("2G", "512M", "1.5GiB")."""
    if isinstance(value, int):
        if value < 1:
            raise ValueError("ram must be at least 1 MB")
        return value
    match = _RAM.match(value)
    if match is None:
        raise ValueError(f"ram {value!r} is not a size: give MB as a number, or a text such as '2G' or '512M'")
    mb = float(match.group(1)) * _UNIT_MB[match.group(2).lower()]
    if mb <= 0:
        raise ValueError(f"ram {value!r} is no memory at all")
    if mb > RAM_MAX_MB:  # the number's own bound, which a text must meet too
        raise ValueError(f"ram {value!r} is over {RAM_MAX_MB} MB, more than any machine has")
    return max(1, round(mb))  # a size under 1 MB is 1 MB


def _ram(value: int | str | None) -> int | None:
    return None if value is None else ram_mb(value)


# The text form as the OpenAPI document states it (a lookahead: not every digit zero);
# the server reads it with ``_RAM``, which says the same.
_RAM_TEXT = r"^\s*(?=[^1-9]*[1-9])\d{1,9}(\.\d{1,9})?\s*[kmgtKMGT]?([iI]?[bB])?\s*$"
Ram = Annotated[Annotated[int, Field(ge=1, le=RAM_MAX_MB), INTEGRAL]
                | Annotated[str, Field(json_schema_extra={"pattern": _RAM_TEXT})]
                | None, AfterValidator(_ram), Field(default=None, description="MB, or '2G' / '512M'")]


class FlavorSizes(BaseModel):
    """Every quantity of a flavor, each optional."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    cpus: Annotated[int, Field(ge=1, le=4096), INTEGRAL] | None = None
    gpus: Annotated[int, Field(ge=0, le=64), INTEGRAL] | None = None
    memory_gib: float | None = Field(default=None, gt=0, le=1_000_000, description="the budget on a shared card")
    ram: Ram = None
    duration_s: float | None = Field(default=None, ge=0, le=DURATION_MAX_S, allow_inf_nan=False,
                                     description="expected; recorded and shown, not a limit")
    description: str = Field(default="", max_length=500)


class Flavor(FlavorSizes):
    """Body of ``POST /api/flavors``, and each flavor ``GET /api/flavors`` lists."""

    name: str = Field(pattern=FLAVOR_NAME)


class FlavorUpdate(FlavorSizes):
    """Body of ``PUT /api/flavors/{name}``: the whole flavor, its name optional (an
    editor may write back the object it read, name included)."""

    name: str | None = Field(default=None, pattern=FLAVOR_NAME)
