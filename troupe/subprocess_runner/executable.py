"""A graph bound to its node types, ready to execute: what ``prepare_executable_graph``
makes and ``execute_graph`` walks.

These two records live apart from ``engine`` so that the node cache, which keys a
graph's nodes, and the engine, which consults the cache, both import them without
importing each other. ``engine`` re-exports them: callers import them from there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from troupe.subprocess_runner.node_types import NodeType


@dataclass(frozen=True)
class ExecutableNode:
    id: str
    node_type: NodeType
    params: dict[str, Any]
    # input port -> (source node id, source port)
    sources: dict[str, tuple[str, str]]
    cpus: int | None = None


@dataclass(frozen=True)
class ExecutableGraph:
    nodes: dict[str, ExecutableNode]
    order: tuple[str, ...]
    children: dict[str, tuple[str, ...]]

    def folder_packs(self) -> tuple[tuple[str, str], ...]:
        """The folder packs its nodes come from: (pack name, the digest of its files)."""
        return tuple(sorted({n.node_type.type.split(".", 1)[0]: n.node_type.pack_digest for n in self.nodes.values()
                             if n.node_type.pack_digest is not None}.items()))
