"""Node types, the packs that declare them, and the catalog built from those packs.

A pack module declares types (ports, params) and must import no heavy library at module
level: torch and friends are imported inside ``execute``, so loading the catalog keeps
the control plane light and lets an agent compute the same digest without torch.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from subprocess_runner.errors import PackLoadError

log = logging.getLogger("troupe.catalog")

PARAM_TYPES = ("int", "float", "bool", "string", "select", "secret")
ENTRY_POINT_GROUP = "troupe.packs"

_NO_DEFAULT: Any = object()


@dataclass(frozen=True)
class Port:
    """A named, typed input or output. ``any`` connects to every type."""

    name: str
    type: str = "any"
    required: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "required": self.required}


@dataclass(frozen=True)
class Param:
    """A node parameter; one without a default is required."""

    name: str
    type: str
    default: Any = _NO_DEFAULT
    min: float | None = None
    max: float | None = None
    options: tuple[str, ...] = ()
    description: str = ""

    def __post_init__(self) -> None:
        if self.type not in PARAM_TYPES:
            raise ValueError(f"param {self.name}: unknown type {self.type!r}")
        if self.type == "select" and not self.options:
            raise ValueError(f"param {self.name}: a select needs options")

    @property
    def required(self) -> bool:
        return self.default is _NO_DEFAULT

    def to_json(self) -> dict[str, Any]:
        schema: dict[str, Any] = {"name": self.name, "type": self.type, "required": self.required}
        if not self.required:
            schema["default"] = self.default
        if self.min is not None:
            schema["min"] = self.min
        if self.max is not None:
            schema["max"] = self.max
        if self.options:
            schema["options"] = list(self.options)
        if self.description:
            schema["description"] = self.description
        return schema


Execute = Callable[[Any, dict[str, Any], dict[str, Any]], dict[str, Any] | None]


def lazy(target: str) -> Execute:
    """An ``execute`` that imports ``module:function`` on its first call, so that a pack
    can declare nodes whose code needs torch without importing torch."""
    module_name, _, function_name = target.partition(":")
    loaded: list[Execute] = []

    def execute(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any] | None:
        if not loaded:
            module = importlib.import_module(module_name)
            loaded.append(getattr(module, function_name))
        return loaded[0](ctx, inputs, params)

    execute.__qualname__ = execute.__name__ = f"lazy({target})"
    return execute


@dataclass(frozen=True)
class NodeType:
    """What a node of ``type`` takes, gives and does. ``execute(ctx, inputs, params)``
    returns the outputs by port name."""

    type: str
    execute: Execute
    inputs: tuple[Port, ...] = ()
    outputs: tuple[Port, ...] = ()
    params: tuple[Param, ...] = ()
    description: str = ""

    def input(self, name: str) -> Port | None:
        return next((p for p in self.inputs if p.name == name), None)

    def output(self, name: str) -> Port | None:
        return next((p for p in self.outputs if p.name == name), None)

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "description": self.description,
            "inputs": [p.to_json() for p in self.inputs],
            "outputs": [p.to_json() for p in self.outputs],
            "params": [p.to_json() for p in self.params],
        }


@dataclass(frozen=True)
class Pack:
    """A named set of node types, found through the ``troupe.packs`` entry points."""

    name: str
    node_types: tuple[NodeType, ...]
    version: str = "1"


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
    from subprocess_runner.packs import core

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
