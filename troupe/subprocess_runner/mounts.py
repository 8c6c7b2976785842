"""File references by storage label: a node's ``path`` param may say ``data:train.csv``
(label ``data``, a path relative to it) instead of an absolute path, so that one graph
reads the same file on every machine that holds the label, wherever it is mounted there.

The control plane has its own label (``TROUPE_MOUNT_LABEL`` at ``TROUPE_MOUNT_PATH``);
an agent has those it was started with (``--mount LABEL=PATH``). Each process that
executes a run turns the references into its own paths just before it runs the graph,
so the stored graph keeps the references.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# A reference: ``label:relative/path``. Only a node's ``path`` param holds one, and a
# one-letter "label" is a Windows drive, never a reference.
_REF = re.compile(r"([a-z0-9][a-z0-9_.-]{1,63}):(?!//)(.+)")
FILE_PARAMS = ("path", "cwd")  # a file a node reads, the folder a command runs in


def labels_of(graph: Mapping[str, Any]) -> set[str]:
    """The labels a graph's file references name."""
    found = set()
    for node in graph.get("nodes", []):
        for name in FILE_PARAMS:
            value = (node.get("params") or {}).get(name)
            match = _REF.fullmatch(value) if isinstance(value, str) else None
            if match:
                found.add(match.group(1))
    return found


def resolve(graph: Mapping[str, Any], mounts: Mapping[str, str]) -> dict[str, Any]:
    """The graph with each reference turned into this machine's path. A label this
    machine lacks, or a relative path that climbs out of its mount, is a ValueError."""
    nodes = []
    for node in graph.get("nodes", []):
        params = dict(node.get("params") or {})
        for name in FILE_PARAMS:
            value = params.get(name)
            match = _REF.fullmatch(value) if isinstance(value, str) else None
            if match:
                params[name] = str(_inside(mounts, match.group(1), match.group(2), node.get("id")))
        nodes.append({**node, "params": params})
    return {**graph, "nodes": nodes}


class PathNotAllowed(ValueError):
    """Raised when a node would read or write a file outside the folders runs may use:
    said before the file is touched, so the answer tells nothing of what is there.
    ``index``: the node's place in the graph's list; ``param``: the param that names it."""

    def __init__(self, message: str, index: int, param: str) -> None:
        super().__init__(message)
        self.index, self.param = index, param


def confine(graph: Mapping[str, Any], roots: Iterable[str | Path]) -> None:
    """Every file a node names (its ``path``, label references already resolved) must
    lie inside one of ``roots`` (storage labels, uploads, run folders, the data roots
    the machine's owner named): a run is someone's code path into this machine's files,
    and a class session is not its owner."""
    allowed: list[Path] | None = None  # resolved once a node names a file (most runs name none)
    for index, node in enumerate(graph.get("nodes", [])):
        for name in FILE_PARAMS:
            value = (node.get("params") or {}).get(name)
            if not isinstance(value, str) or not value:  # empty: the node's own default (the run's folder)
                continue
            if allowed is None:
                allowed = [Path(root).expanduser().resolve() for root in roots]
            try:
                where = Path(value).expanduser()
                inside = where.is_absolute() and any(where.resolve().is_relative_to(root) for root in allowed)
            except (ValueError, RuntimeError, OSError):  # a NUL, ~nosuchuser, a name too long: no file of ours
                inside = False
            if not inside:
                raise PathNotAllowed(
                    f"node {node.get('id')}: {value} is outside the folders runs may read (storage labels such as "
                    "data:file.csv, uploads, run folders, and TROUPE_DATA_ROOTS on the machine that runs it)",
                    index, name)


def _inside(mounts: Mapping[str, str], label: str, relative: str, node_id: Any) -> Path:
    if label not in mounts:
        raise ValueError(f"node {node_id}: label {label!r} is not mounted on this machine (it has "
                         f"{', '.join(sorted(mounts)) or 'none'})")
    root = Path(mounts[label]).resolve()
    path = (root / relative).resolve()
    if not path.is_relative_to(root):
        raise ValueError(f"node {node_id}: {label}:{relative} leaves the mount {label}")
    return path
