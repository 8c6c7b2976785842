"""Builds the one Settings object from flags and the environment. The only place that
reads ``os.environ`` for settings."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import platformdirs

from troupe.cli.errors import CliError
from troupe.protocol.settings import Settings

# The examples of a source checkout or an editable install sit beside the packages.
_BUNDLED_EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_settings(host: str | None = None, port: int | None = None, examples: Path | None = None,
                  tls_cert: Path | None = None, tls_key: Path | None = None,
                  packs: list[Path] | None = None) -> Settings:
    default_home = Path(platformdirs.user_data_dir("troupe"))
    if examples is None and _BUNDLED_EXAMPLES.is_dir():
        examples = _BUNDLED_EXAMPLES
    return Settings.from_env(os.environ, default_home=default_home, host=host, port=port, examples_dir=examples,
                             tls_cert=tls_cert.resolve() if tls_cert else None,
                             tls_key=tls_key.resolve() if tls_key else None, packs=tuple(packs or ()))


def load_simulated_inventory() -> dict[str, Any] | None:
    """``TROUPE_SIMULATED_INVENTORY``: a JSON inventory (``machine_id``, ``cpus``, ``cards``
    with ``uuid, name, index, memory_total_mib, memory_free_mib``) an agent reports
    instead of reading NVML, for tests and development. Off by default."""
    raw = os.environ.get("TROUPE_SIMULATED_INVENTORY", "").strip()
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise CliError(f"TROUPE_SIMULATED_INVENTORY is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise CliError("TROUPE_SIMULATED_INVENTORY must be a JSON object")
    return data
