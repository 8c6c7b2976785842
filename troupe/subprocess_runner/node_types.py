"""What a node pack declares: node types with their ports and params, and the pack that
groups them.

These live apart from ``catalog`` (which builds the catalog from the installed packs and
always loads the core pack) so that a pack module, the core pack among them, imports its
building blocks from here without importing the loader that imports it back. Like the
packs themselves, this module imports no heavy library.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# ``list``: a list of strings (a command's argv); ``mapping``: names to numbers, booleans
# or strings (a command's vars, its environment).
PARAM_TYPES = ("int", "float", "bool", "string", "select", "secret", "list", "mapping")

_NO_DEFAULT: Any = object()

# The attribute ``troupe.node`` sets on a function it declares (its NodeType): a folder
# pack's loader finds the pack's nodes by it, without importing the public package.
NODE_MARK = "__troupe_node__"


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
        if not self.required:
            try:  # the editor's palette and GET /api/nodes send it: one that is not JSON would break them for all
                json.dumps(self.default)
            except (TypeError, ValueError):
                raise ValueError(f"param {self.name}: its default {self.default!r} is not a JSON value (give a "
                                 "str, number, bool, list or dict and convert it in the node)") from None

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
    # Done in microseconds and never waits (arithmetic, recording a point): the engine
    # runs it in the thread that walks the graph, as handing it to the node pool and
    # waking the walker again costs more than the node itself.
    quick: bool = False
    # Runs code or reads files its params name (a command, a user's pack marked so by its
    # author): only a session trusted with the machine may submit it (troupe/web/login.py).
    privileged: bool = False
    # What no single param can say, checked at submission on the resolved params: None,
    # or (the pointer below ``params``, such as ``argv/2``, and why).
    check: Callable[[Mapping[str, Any]], tuple[str, str] | None] | None = None
    # What each node of the type asks for unless the graph's node says otherwise (cpus,
    # gpus, ram, duration_s, env, flavor): a user's ``@node(resources=...)``.
    resources: Mapping[str, Any] | None = None
    # A folder pack's node: the digest of the pack's files (what a worker must load to
    # run it). Not part of the catalog's digest, which says what the types are.
    pack_digest: str | None = None

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
            **({"privileged": True} if self.privileged else {}),
            **({"resources": dict(self.resources)} if self.resources else {}),
        }


@dataclass(frozen=True)
class Pack:
    """A named set of node types, found through the ``troupe.packs`` entry points."""

    name: str
    node_types: tuple[NodeType, ...]
    version: str = "1"
