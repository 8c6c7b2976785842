"""Builds the one Settings object from flags and the environment. The only place that
reads ``os.environ`` for settings."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from protocol.settings import Settings

# The examples of a source checkout or an editable install sit beside the packages.
_BUNDLED_EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load_settings(host: str | None = None, port: int | None = None, examples: Path | None = None) -> Settings:
    default_home = Path(platformdirs.user_data_dir("troupe"))
    if examples is None and _BUNDLED_EXAMPLES.is_dir():
        examples = _BUNDLED_EXAMPLES
    return Settings.from_env(os.environ, default_home=default_home, host=host, port=port, examples_dir=examples)
