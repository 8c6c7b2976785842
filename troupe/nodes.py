"""``@node``: a plain typed function becomes a node type of the pack whose file it is in.

What the signature says is what the node is: an argument without a default is an input
port, one with a default is a param with that default, the return annotation is the
output (one value, named ``value``; a TypedDict or a dataclass for several, one port per
field). The docstring's first paragraph is the node's help. The function stays a plain
function: a test or a notebook calls it as one.

The pack is the file (or the folder) the function lives in; the loader
(``troupe.subprocess_runner.pack_loader``) names the type ``<pack>.<function>``. Nothing heavy
is imported here: a pack imports torch inside its functions, so the catalog stays light."""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from troupe.subprocess_runner.node_types import NODE_MARK, NodeType, Param, Port

# An argument with this name is handed the node's ExecutionContext (metrics, logs, files).
CONTEXT_ARG = "ctx"
_RESOURCES = ("cpus", "gpus", "ram", "duration_s", "flavor", "env")
_PARAM_TYPES: dict[Any, str] = {int: "int", float: "float", bool: "bool", str: "string", list: "list",
                                dict: "mapping"}
_PORT_TYPES: dict[Any, str] = {int: "int", float: "float", str: "string"}

F = TypeVar("F", bound=Callable[..., Any])


class NodeDeclarationError(TypeError):
    """A function that cannot be a node as written (said when its pack loads)."""


def node(function: F | None = None, *, name: str | None = None, resources: Mapping[str, Any] | None = None,
         flavor: str | None = None, privileged: bool = False) -> Any:
    """Declares a node; use bare (``@node``) or with options (``@node(resources={"cpus": 2})``).

    ``resources``: what each node of this type asks for unless the graph's node says
    otherwise (``cpus``, ``gpus``, ``ram``, ``duration_s``, ``env``); ``flavor``: a stored
    size instead of numbers. ``privileged``: the node runs code or reads files its params
    name, so a class session may not submit it (as ``script.Command``)."""

    def mark(fn: F) -> F:
        declared = dict(resources or {})
        unknown = sorted(set(declared) - set(_RESOURCES))
        if unknown:
            raise NodeDeclarationError(f"{fn.__name__}: resources has no {', '.join(unknown)} "
                                       f"(it takes {', '.join(_RESOURCES)})")
        if flavor is not None:
            declared["flavor"] = flavor
        setattr(fn, NODE_MARK, _node_type(fn, name or fn.__name__, declared, privileged))
        return fn

    return mark(function) if function is not None else mark


def _node_type(fn: Callable[..., Any], name: str, resources: dict[str, Any], privileged: bool) -> NodeType:
    hints = typing.get_type_hints(fn)
    inputs, params, wants_context = [], [], False
    for argument in inspect.signature(fn).parameters.values():
        if argument.kind in (argument.VAR_POSITIONAL, argument.VAR_KEYWORD):
            raise NodeDeclarationError(f"{fn.__name__}: *{argument.name} cannot be a port or a param; name each one")
        if argument.name == CONTEXT_ARG:
            wants_context = True
            continue
        hint = hints.get(argument.name, Any)
        if argument.default is inspect.Parameter.empty:
            inputs.append(Port(argument.name, _PORT_TYPES.get(_bare(hint), "any")))
            continue
        kind = _PARAM_TYPES.get(_bare(hint)) or _PARAM_TYPES.get(type(argument.default))
        if kind is None:
            raise NodeDeclarationError(f"{fn.__name__}: param {argument.name} needs a type troupe can edit "
                                       "(int, float, bool, str, list or dict)")
        params.append(Param(argument.name, kind, default=argument.default))
    outputs, unpack = _outputs(fn, hints.get("return", Any))
    return NodeType(name, _execute(fn, wants_context, unpack), inputs=tuple(inputs), outputs=outputs,
                    params=tuple(params), description=_help(fn), privileged=privileged,
                    resources=resources or None)


def _bare(hint: Any) -> Any:
    """``int | None`` is an int that may be missing; ``list[str]`` is a list."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        kinds = [a for a in typing.get_args(hint) if a is not type(None)]
        return _bare(kinds[0]) if len(kinds) == 1 else Any
    return origin or hint


def _outputs(fn: Callable[..., Any], hint: Any) -> tuple[tuple[Port, ...], Callable[[Any], dict[str, Any]]]:
    """The output ports and how a returned value becomes them."""
    if hint is None or hint is type(None):
        return (), lambda value: {}
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        fields = [(f.name, f.type) for f in dataclasses.fields(hint)]
        hints = typing.get_type_hints(hint)
        ports = tuple(Port(n, _PORT_TYPES.get(_bare(hints.get(n, Any)), "any")) for n, _ in fields)
        return ports, lambda value: {n: getattr(value, n) for n, _ in fields}
    if typing.is_typeddict(hint):
        hints = typing.get_type_hints(hint)
        ports = tuple(Port(n, _PORT_TYPES.get(_bare(h), "any")) for n, h in hints.items())
        names = tuple(hints)
        return ports, lambda value: {n: value[n] for n in names if n in value}
    return (Port("value", _PORT_TYPES.get(_bare(hint), "any")),), lambda value: {"value": value}


def _execute(fn: Callable[..., Any], wants_context: bool,
             unpack: Callable[[Any], dict[str, Any]]) -> Callable[[Any, dict[str, Any], dict[str, Any]], Any]:
    def execute(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
        arguments = {**inputs, **params}
        if wants_context:
            arguments[CONTEXT_ARG] = ctx
        return unpack(fn(**arguments))

    execute.__qualname__ = execute.__name__ = fn.__name__
    execute.__module__ = fn.__module__
    return execute


def _help(fn: Callable[..., Any]) -> str:
    text = inspect.getdoc(fn) or ""
    return text.split("\n\n", 1)[0].replace("\n", " ").strip()
