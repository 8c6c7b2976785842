"""Number types of the request schemas.

JSON has one number type, and JSON Schema calls ``2.0`` an integer; strict pydantic
would refuse it where the OpenAPI document allows it. ``Integer`` takes an integral
float as the integer it is, and still refuses ``2.5``, ``"2"`` and ``true``.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator


def _integral(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**63:
        return int(value)
    return value


INTEGRAL = BeforeValidator(_integral)
# Constraints go before INTEGRAL (``Annotated[int, Field(ge=1), INTEGRAL]``): after it,
# pydantic would check them in a wrapper and the document would not state them.
Integer = Annotated[int, INTEGRAL]
