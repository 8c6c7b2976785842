"""The catalog: every node type this process can execute, built from the installed packs.

A pack module declares types (ports, params; their building blocks are in
``node_types``, re-exported here for the packs that import them from this module) and
must import no heavy library at module level: torch and friends are imported inside
``execute``, so loading the catalog keeps the control plane light and lets an agent
compute the same digest without torch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from subprocess_runner.errors import PackLoadError
from subprocess_runner.node_types import PARAM_TYPES, Execute, NodeType, Pack, Param, Port, lazy
from subprocess_runner.packs import core

# The pack's building blocks are re-exported: packs import them from here.
__all__ = ["ENTRY_POINT_GROUP", "PARAM_TYPES", "Catalog", "Execute", "NodeType", "Pack", "Param", "Port",
           "build_catalog", "lazy", "load_catalog"]

log = logging.getLogger("troupe.catalog")

ENTRY_POINT_GROUP = "troupe.packs"


@dataclass(frozen=True)
class Catalog:
    """Every node type this process can execute, and a digest both ends can compare."""

    types: dict[str, NodeType]
    packs: tuple[str, ...]
    broken_packs: dict[str, str] = field(default_factory=dict)
    # Each pack's version and the modules its nodes' code lives in (for the fingerprint).
    pack_sources: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)

    def get(self, type_name: str) -> NodeType | None:
        return self.types.get(type_name)

    @property
    def digest(self) -> str:
        body = json.dumps([self.types[k].to_json() for k in sorted(self.types)], sort_keys=True, default=str)
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "packs": list(self.packs),
            "broken_packs": dict(self.broken_packs),
            "nodes": [self.types[k].to_json() for k in sorted(self.types)],
        }


def build_catalog(packs: Iterable[Pack]) -> Catalog:
    types: dict[str, NodeType] = {}
    names: list[str] = []
    sources: dict[str, tuple[str, tuple[str, ...]]] = {}
    for pack in packs:
        names.append(pack.name)
        modules = set()
        for node_type in pack.node_types:
            if node_type.type in types:
                raise PackLoadError(f"pack {pack.name}: node type {node_type.type} is declared twice")
            types[node_type.type] = node_type
            lazy_target = re.fullmatch(r"lazy\(([^:]+):.*\)", getattr(node_type.execute, "__name__", ""))
            modules.add(lazy_target.group(1) if lazy_target else node_type.execute.__module__)
        sources[pack.name] = (pack.version, tuple(sorted(modules)))
    return Catalog(types=types, packs=tuple(names), pack_sources=sources)


def load_catalog() -> Catalog:
    """Loads every installed pack. A pack that fails to import is logged and listed in
    ``broken_packs`` (shown by ``/api/info``) rather than hidden; the core pack is always
    present, even when troupe runs from a source tree without its entry points."""
    packs: dict[str, Pack] = {core.PACK.name: core.PACK}
    broken: dict[str, str] = {}
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.name in packs:
            continue
        try:
            pack = entry.load()
        except Exception as exc:  # a third-party pack may raise anything on import
            log.error("node pack %s (%s) failed to load: %s", entry.name, entry.value, exc)
            broken[entry.name] = f"{type(exc).__name__}: {exc}"
            continue
        if not isinstance(pack, Pack):
            broken[entry.name] = f"{entry.value} is not a troupe Pack"
            log.error("node pack %s: %s", entry.name, broken[entry.name])
            continue
        packs[entry.name] = pack
    catalog = build_catalog(packs.values())
    return Catalog(types=catalog.types, packs=catalog.packs, broken_packs=broken, pack_sources=catalog.pack_sources)
