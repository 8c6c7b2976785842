"""Packs from folders: a ``.py`` file or a package folder in ``TROUPE_HOME/packs``, a
``--packs DIR``, or a worker's cache of packs the control plane sent. Loaded without
packaging: the file is imported under a module name of its own (its name and digest, so
two versions can live in one process), and its nodes are the functions ``@node``
marked, or the ``PACK`` it declares the long way.

A pack is code: only the folders the machine's owner names are read."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from troupe.protocol.errors import TroupeError
from troupe.subprocess_runner.node_types import NODE_MARK, NodeType, Pack
from troupe.subprocess_runner.pack_files import digest_of, is_pack, pack_name

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")


@dataclass(frozen=True)
class FolderPack:
    """Where a folder pack was found, and what its files are (the digest a worker checks)."""

    name: str
    path: Path
    digest: str
    version: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "digest": self.digest, "version": self.version, "source": "folder"}


class PackBroken(Exception):
    """A folder pack that cannot be loaded, and why (listed, never fatal)."""


def find(folders: Iterable[Path]) -> list[Path]:
    """The packs of ``folders``, in the folders' order, each folder's sorted by name."""
    found: list[Path] = []
    for folder in folders:
        if folder.is_dir():
            found.extend(path for path in sorted(folder.iterdir()) if is_pack(path))
    return found


def load(path: Path) -> tuple[Pack, FolderPack]:
    """Imports the pack at ``path``; PackBroken with the reason when it cannot be one."""
    name = pack_name(path)
    if not _NAME.fullmatch(name):
        raise PackBroken(f"{path.name}: a pack's name is a letter, then letters, digits or _ (it names its node "
                         "types, as labpack.scale)")
    try:
        digest = digest_of(path)
    except (TroupeError, OSError) as exc:
        raise PackBroken(str(exc)) from None
    module_name = f"_troupe_pack_{name}_{digest[:16]}"
    module = sys.modules.get(module_name)
    if module is None:
        init = path if path.is_file() else path / "__init__.py"
        spec = importlib.util.spec_from_file_location(
            module_name, init, submodule_search_locations=None if path.is_file() else [str(path)])
        if spec is None or spec.loader is None:
            raise PackBroken(f"{path}: not a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException as exc:  # a user's code may raise anything (SystemExit included) on import
            del sys.modules[module_name]
            raise PackBroken(f"{type(exc).__name__}: {exc}") from None
    try:  # what the module holds is a user's code too: a property or a __getattr__ may raise anything
        return _declared(module, name, digest, path)
    except PackBroken:
        raise
    except Exception as exc:
        raise PackBroken(f"{type(exc).__name__}: {exc}") from None


def _check_resources(types: tuple[NodeType, ...]) -> None:
    """A type's declared resources, read as a node's. The models (pydantic) are imported
    only for a pack that declares some: a pack's import check (pack_probe) starts a
    fresh interpreter for each pack, and they were two thirds of its time."""
    declared = [t for t in types if t.resources]
    if not declared:
        return
    from pydantic import ValidationError

    from troupe.protocol.graph import NodeResources

    for node_type in declared:
        try:
            NodeResources.model_validate(dict(node_type.resources or {}))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(map(str, first["loc"]))
            raise PackBroken(f"{node_type.type}: resources.{where}: {first['msg']}") from None


def _declared(module: Any, name: str, digest: str, path: Path) -> tuple[Pack, FolderPack]:
    version = str(getattr(module, "__version__", digest[:12]))
    declared = getattr(module, "PACK", None)
    if isinstance(declared, Pack):
        types = tuple(dataclasses.replace(t, type=t.type if t.type.startswith(f"{name}.") else f"{name}.{t.type}")
                      for t in declared.node_types)
    else:
        marked = {id(t): t for t in (getattr(v, NODE_MARK, None) for v in vars(module).values())
                  if isinstance(t, NodeType)}
        types = tuple(dataclasses.replace(t, type=f"{name}.{t.type}") for t in marked.values())
    if not types:
        raise PackBroken(f"{path.name} declares no node (mark a function with @node from troupe)")
    _check_resources(types)
    types = tuple(dataclasses.replace(t, pack_digest=digest) for t in types)
    json.dumps([t.to_json() for t in types])  # GET /api/nodes sends them all: one that cannot be sent breaks it
    return Pack(name, types, version), FolderPack(name, path, digest, version)
