"""A flag: a typer option that takes no value.

typer's help shows an option's type beside it (``<bool>`` for a flag, as if ``--detach``
took a value) unless the option has a metavar: ``TyperOption.display_type_rich`` answers
the metavar when there is one. An empty metavar is typer's own way to show nothing
there, so a flag's help line says what it does, nothing more."""

from __future__ import annotations

from typing import Any

import typer


def flag(*names: str, **options: Any) -> Any:
    """``typer.Option(*names, **options)`` for a bool, with nothing in the type column."""
    return typer.Option(*names, metavar="", **options)
