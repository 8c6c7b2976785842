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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# A reference: ``label:relative/path``. Only a node's ``path`` param holds one, and a
# one-letter "label" is a Windows drive, never a reference.
_REF = re.compile(r"([a-z0-9][a-z0-9_.-]{1,63}):(?!//)(.+)")
FILE_PARAMS = ("path",)


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


def _inside(mounts: Mapping[str, str], label: str, relative: str, node_id: Any) -> Path:
    if label not in mounts:
        raise ValueError(f"node {node_id}: label {label!r} is not mounted on this machine (it has "
                         f"{', '.join(sorted(mounts)) or 'none'})")
    root = Path(mounts[label]).resolve()
    path = (root / relative).resolve()
    if not path.is_relative_to(root):
        raise ValueError(f"node {node_id}: {label}:{relative} leaves the mount {label}")
    return path
