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
from functools import cached_property
from importlib import metadata
from pathlib import Path
from typing import Any

from troupe.subprocess_runner import pack_loader, pack_probe, pack_watch
from troupe.subprocess_runner.errors import PackLoadError
from troupe.subprocess_runner.node_types import PARAM_TYPES, Execute, NodeType, Pack, Param, Port, lazy
from troupe.subprocess_runner.pack_files import pack_name
from troupe.subprocess_runner.pack_loader import FolderPack
from troupe.subprocess_runner.pack_probe import ImportLimits
from troupe.subprocess_runner.packs import core

# The pack's building blocks are re-exported: packs import them from here.
__all__ = ["ENTRY_POINT_GROUP", "PARAM_TYPES", "Catalog", "Execute", "NodeType", "Pack", "Param", "Port",
           "build_catalog", "lazy", "load_catalog"]

log = logging.getLogger("troupe.catalog")

ENTRY_POINT_GROUP = "troupe.packs"


@dataclass(frozen=True)
class OfferedPacks:
    """What a control plane's folder packs give an agent that accepts them: their node
    types, and the digest of the rest, which that agent must have itself."""

    types: frozenset[str] = frozenset()
    installed_digest: str = ""


@dataclass(frozen=True)
class Catalog:
    """Every node type this process can execute, and a digest both ends can compare."""

    types: dict[str, NodeType]
    packs: tuple[str, ...]
    broken_packs: dict[str, str] = field(default_factory=dict)
    # Each pack's version and the modules its nodes' code lives in (for the fingerprint).
    pack_sources: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    # The packs loaded from folders (TROUPE_HOME/packs, --packs, a worker's cache): the
    # ones the control plane offers its workers, by content digest.
    folder_packs: dict[str, FolderPack] = field(default_factory=dict)

    def get(self, type_name: str) -> NodeType | None:
        return self.types.get(type_name)

    # A catalog never changes once made (a pack loaded later makes another), so its
    # digests are taken once: a restarted server at a lab's scale gave each of 800
    # worker connections both, 1,600 JSON encodings of every node type before serving.
    @cached_property
    def digest(self) -> str:
        return _digest(self.types.values())

    @cached_property
    def installed_digest(self) -> str:
        """The digest of the types installed with troupe or its entry points, not from a
        folder: what an agent that takes the control plane's folder packs must match."""
        return _digest(t for t in self.types.values() if pack_of(t.type) not in self.folder_packs)

    @cached_property
    def offered(self) -> OfferedPacks:
        return OfferedPacks(frozenset(t for t in self.types if pack_of(t) in self.folder_packs), self.installed_digest)

    def to_json(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "packs": list(self.packs),
            "broken_packs": dict(self.broken_packs),
            "nodes": [self.types[k].to_json() for k in sorted(self.types)],
        }


def pack_of(type_name: str) -> str:
    """``labpack.scale`` is a node type of pack ``labpack``."""
    return type_name.split(".", 1)[0]


def _digest(types: Iterable[NodeType]) -> str:
    ordered = sorted(types, key=lambda t: t.type)
    body = json.dumps([t.to_json() for t in ordered], sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


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


def load_catalog(folders: Iterable[Path] = (), limits: ImportLimits | None = None) -> Catalog:
    """Loads every installed pack, then the packs of ``folders`` (pack_loader). A pack
    that fails to import is logged and listed in ``broken_packs`` (shown by ``/api/info``
    and ``troupe packs``) rather than hidden, and never stops the process; the core pack
    is always present, even when troupe runs from a source tree without its entry points.
    ``limits``: each folder pack is imported first in a child under them (pack_probe), so
    one that hangs or grows at import cannot stop or bloat this process."""
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
    catalog = Catalog(types=catalog.types, packs=catalog.packs, broken_packs=broken, pack_sources=catalog.pack_sources)
    return with_folder_packs(catalog, pack_loader.find(folders), limits)


def with_folder_packs(catalog: Catalog, paths: Iterable[Path], limits: ImportLimits | None = None) -> Catalog:
    """``catalog`` and the folder packs at ``paths`` (a worker's run child: the packs the
    run uses, from the agent's folders and cache). The first pack of a name wins; a later
    one, or one that fails, is listed as broken with the reason. With ``limits``, a pack
    whose import fails in a child under them is not imported here."""
    types, names = dict(catalog.types), list(catalog.packs)
    broken, folder_packs = dict(catalog.broken_packs), dict(catalog.folder_packs)
    found_paths = list(paths)
    refused = pack_probe.check(found_paths, limits) if limits is not None else {}
    for path in found_paths:
        if path in refused:
            log.error("node pack %s was not loaded: %s", path, refused[path])
            broken.setdefault(pack_name(path), refused[path])
            continue
        try:
            pack, found = pack_loader.load(path)
        except pack_loader.PackBroken as exc:
            log.error("node pack %s failed to load: %s", path, exc)
            broken.setdefault(pack_name(path), str(exc))
            continue
        taken = next((t.type for t in pack.node_types if t.type in types), None)
        if pack.name in names or taken is not None:
            same = folder_packs.get(pack.name)
            if same is None or same.digest != found.digest:  # the same pack named twice is no trouble
                broken.setdefault(f"{pack.name} ({path})", f"the pack name {pack.name} is taken by another pack")
            continue
        names.append(pack.name)
        types.update({t.type: t for t in pack.node_types})
        folder_packs[pack.name] = found
        pack_watch.remember(found.name, found.path, found.digest, found.version)  # a later edit is seen (pack_watch)
    return Catalog(types=types, packs=tuple(names), broken_packs=broken, pack_sources=catalog.pack_sources,
                   folder_packs=folder_packs)
