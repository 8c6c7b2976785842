"""The editor-session cache: node outputs kept between two clicks of Run in one editor.

A node's cache key hashes its type, its params (canonical JSON), the run context that
changes what it computes (device; seed and deterministic flag when seeded) and, for
each input port, the key of the upstream node and the port it reads. So a change
anywhere upstream gives every node downstream a new key, and only what changed runs
again.

The cache owns what it holds. Outputs are stored as a private copy and handed out as a
copy (see ``private_copy``): a node downstream that trains a model in place trains the
run's copy, never the cached one, so a cached untrained model stays untrained and a
cached trained model stays as it was trained. Plain tensors and arrays (the bulk of
datasets) are shared rather than copied: nodes must not modify an input tensor in place.

The budget is in bytes across every session; past it the least recently used entries
go first. Sizes are estimates (tensors by their elements, models by their parameters
and buffers, other objects by the tensors and arrays among their attributes), made
without importing torch: a process where no node imported torch holds no tensors.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import sys
import threading
import types
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from troupe.subprocess_runner.context import derive_seed

if TYPE_CHECKING:
    from troupe.subprocess_runner.executable import ExecutableGraph

log = logging.getLogger("troupe.node_cache")

# How far and how much the size walk looks into an object before it guesses.
_MAX_DEPTH = 6
_MAX_VISITS = 10_000
_ATOMIC = (type(None), bool, int, float, complex, str, bytes, bytearray)
# Code and namespaces: counted as themselves, never walked into.
_OPAQUE = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


def node_key(type_name: str, params: dict[str, Any], inputs: dict[str, tuple[str, str]], salt: str = "") -> str:
    """The cache key of one node: ``inputs`` maps each input port to (the upstream
    node's key, the upstream port). Param order and input order do not matter."""
    material = json.dumps(
        {
            "type": type_name,
            "params": params,
            "inputs": sorted([port, up_key, up_port] for port, (up_key, up_port) in inputs.items()),
            "salt": salt,
        },
        sort_keys=True, separators=(",", ":"), default=repr,
    )
    return hashlib.sha256(material.encode()).hexdigest()


def graph_keys(graph: ExecutableGraph, *, device: str, seed: int | None, deterministic: bool) -> dict[str, str]:
    """Every node's key, in one pass over the topological order. A seeded run gives
    each node its own seed (``derive_seed(seed, node_id)``), so it is part of the key."""
    keys: dict[str, str] = {}
    for node_id in graph.order:
        node = graph.nodes[node_id]
        salt = {"device": device}
        if seed is not None:
            salt.update(node_seed=str(derive_seed(seed, node_id)), deterministic=str(bool(deterministic)))
        inputs = {port: (keys[src], src_port) for port, (src, src_port) in node.sources.items()}
        keys[node_id] = node_key(node.node_type.type, node.params, inputs, json.dumps(salt, sort_keys=True))
    return keys


class _Walk:
    """One walk over a value: its estimated size, and the plain tensors and arrays in
    it (which copies share instead of duplicating)."""

    def __init__(self) -> None:
        self.bytes = 0
        self.shared: dict[int, Any] = {}
        self._seen: set[int] = set()
        self._visits = 0
        self._torch = sys.modules.get("torch")
        self._numpy = sys.modules.get("numpy")

    def add(self, value: Any, depth: int = 0) -> None:
        if id(value) in self._seen:
            return
        self._seen.add(id(value))
        self._visits += 1
        try:
            size = self._size(value, depth)  # (not ``+=``: _size adds its children meanwhile)
        except Exception:  # an odd object must not fail the node that produced it
            size = sys.getsizeof(value, 64)
        self.bytes += size

    def _size(self, value: Any, depth: int) -> int:
        torch = self._torch
        if torch is not None:
            if isinstance(value, torch.nn.Module):
                tensors = [*value.parameters(), *value.buffers()]
                return sum(int(t.numel()) * int(t.element_size()) for t in tensors)
            if isinstance(value, torch.Tensor):
                if not isinstance(value, torch.nn.Parameter):
                    self.shared[id(value)] = value
                return int(value.numel()) * int(value.element_size())
        if self._numpy is not None and isinstance(value, self._numpy.ndarray):
            self.shared[id(value)] = value
            return int(value.nbytes)
        if isinstance(value, _ATOMIC):
            return sys.getsizeof(value)
        own = sys.getsizeof(value, 64)
        if depth >= _MAX_DEPTH or self._visits >= _MAX_VISITS or isinstance(value, _OPAQUE):
            return own
        if isinstance(value, dict):
            children: list[Any] = [*value.keys(), *value.values()]
        elif isinstance(value, list | tuple | set | frozenset):
            children = list(value)
        else:
            children = list(getattr(value, "__dict__", {}).values())
            for slot in getattr(type(value), "__slots__", ()):
                if isinstance(slot, str) and hasattr(value, slot):
                    children.append(getattr(value, slot))
        for child in children:
            self.add(child, depth + 1)
        return own


def estimate_bytes(value: Any) -> int:
    """A rough size of ``value`` for the budget: tensors by elements, models by their
    parameters and buffers, containers and objects by what they hold (each object
    once), anything else by ``sys.getsizeof``."""
    walk = _Walk()
    walk.add(value)
    return walk.bytes


def private_copy(outputs: dict[str, Any]) -> dict[str, Any]:
    """A copy of a node's outputs that downstream code may change freely: models,
    loaders and other Python state are deep-copied (one copy, so two ports that name
    the same object still do); plain tensors and arrays are shared. Raises whatever
    ``copy.deepcopy`` raises for an object that cannot be copied."""
    walk = _Walk()
    walk.add(outputs)
    memo: dict[int, Any] = dict(walk.shared)
    return copy.deepcopy(outputs, memo)


@dataclass
class _Entry:
    outputs: dict[str, Any]
    bytes: int


class NodeCache:
    """Node outputs per editor session, least recently used first out, within
    ``budget_bytes`` over all sessions (0: disabled). Thread-safe: the nodes of several
    runs store and look up at once."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = max(0, int(budget_bytes))
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._sessions: dict[str, set[str]] = {}
        # Each open session's mark, handed to its runs: a run that outlives its session's
        # close (a tab closed while it ran) holds an old mark, and stores nothing more.
        self._opened: dict[str, object] = {}
        self._bytes = 0
        self.evictions = 0
        self.hits = 0
        self.misses = 0

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def session(self, session: str) -> SessionCache:
        with self._lock:
            return SessionCache(self, session, self._opened.setdefault(session, object()))

    def get(self, session: str, key: str) -> dict[str, Any] | None:
        """The cached outputs (the cache's own objects: copy before handing them to
        code that may change them), or None."""
        with self._lock:
            entry = self._entries.get((session, key))
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end((session, key))
            self.hits += 1
            return entry.outputs

    def put(self, session: str, key: str, outputs: dict[str, Any], mark: object | None = None) -> bool:
        """Stores a private copy of ``outputs``; False when they are not kept (over the
        whole budget, not copyable, or ``mark`` is of a session closed since). Older
        entries make room, any session's."""
        if not self.enabled:
            return False
        size = estimate_bytes(outputs)
        if size > self.budget_bytes:
            self.discard(session, key)  # a stale entry for the key must not outlive it
            return False
        try:
            owned = private_copy(outputs)
        except Exception as exc:
            log.info("not caching outputs that cannot be copied (%s: %s)", type(exc).__name__, exc)
            self.discard(session, key)
            return False
        with self._lock:
            if mark is not None and self._opened.get(session) is not mark:
                return False  # its session was closed while the run went on
            self._drop((session, key))
            self._entries[(session, key)] = _Entry(owned, size)
            self._sessions.setdefault(session, set()).add(key)
            self._bytes += size
            while self._bytes > self.budget_bytes and self._entries:
                oldest = next(iter(self._entries))
                self._drop(oldest)
                self.evictions += 1
        return True

    def discard(self, session: str, key: str) -> None:
        with self._lock:
            self._drop((session, key))

    def close(self, session: str) -> int:
        """Drops every entry of ``session``; returns how many there were."""
        with self._lock:
            self._opened.pop(session, None)
            keys = self._sessions.pop(session, set())
            for key in keys:
                entry = self._entries.pop((session, key))
                self._bytes -= entry.bytes
            return len(keys)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._sessions.clear()
            self._opened.clear()
            self._bytes = 0

    def session_stats(self, session: str) -> dict[str, int]:
        with self._lock:
            keys = self._sessions.get(session, set())
            return {"entries": len(keys), "bytes": sum(self._entries[(session, k)].bytes for k in keys)}

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "budget_bytes": self.budget_bytes, "entries": len(self._entries), "bytes": self._bytes,
                "sessions": len(self._sessions), "hits": self.hits, "misses": self.misses,
                "evictions": self.evictions,
            }

    def _drop(self, where: tuple[str, str]) -> None:
        entry = self._entries.pop(where, None)
        if entry is None:
            return
        self._bytes -= entry.bytes
        keys = self._sessions.get(where[0])
        if keys is not None:
            keys.discard(where[1])
            if not keys:
                del self._sessions[where[0]]


class SessionCache:
    """The cache of one editor session: what the engine of one run is handed, so that
    a run cannot read or fill another session's entries."""

    def __init__(self, cache: NodeCache, session: str, mark: object | None = None) -> None:
        self.cache = cache
        self.session = session
        self._mark = mark

    def get(self, key: str) -> dict[str, Any] | None:
        return self.cache.get(self.session, key)

    def put(self, key: str, outputs: dict[str, Any]) -> bool:
        return self.cache.put(self.session, key, outputs, self._mark)

    def discard(self, key: str) -> None:
        self.cache.discard(self.session, key)
