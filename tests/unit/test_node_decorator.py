"""``troupe.node``: what a typed function's signature makes of a node type, and what it
refuses, said when its pack loads (the public interface a user's pack is written to)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import pytest

from troupe import node
from troupe.nodes import NodeDeclarationError
from troupe.subprocess_runner.node_types import NODE_MARK


class Pair(TypedDict):
    low: float
    high: int


@dataclass
class Named:
    label: str
    score: float


def _type(fn):
    return getattr(fn, NODE_MARK)


def test_inputs_params_outputs_and_help_come_from_the_signature():
    @node
    def spread(x: float, y, ctx=None, width: int = 3, tags: list | None = None, on: bool = True) -> Pair:
        """Spreads a number.

        More text that is not the help."""
        return {"low": x - width, "high": int(x + width)}

    made = _type(spread).to_json()
    assert [(p["name"], p["type"]) for p in made["inputs"]] == [("x", "float"), ("y", "any")]
    assert [(p["name"], p["type"], p["default"]) for p in made["params"]] == [
        ("width", "int", 3), ("tags", "list", None), ("on", "bool", True)]
    assert [(p["name"], p["type"]) for p in made["outputs"]] == [("low", "float"), ("high", "int")]
    assert made["description"] == "Spreads a number."
    assert spread(1.0, None) == {"low": -2.0, "high": 4}  # still a plain function
    outputs = _type(spread).execute(object(), {"x": 2.0, "y": 0}, {"width": 1, "tags": None, "on": True})
    assert outputs == {"low": 1.0, "high": 3}


def test_a_dataclass_return_is_one_output_per_field_and_a_value_is_named_value():
    @node(name="Label", resources={"cpus": 2}, privileged=True)
    def label(text: str) -> Named:
        return Named(text.upper(), 1.0)

    made = _type(label)
    assert made.type == "Label" and made.privileged and dict(made.resources or {}) == {"cpus": 2}
    assert made.execute(None, {"text": "a"}, {}) == {"label": "A", "score": 1.0}

    @node
    def double(x: int) -> int:
        return 2 * x

    assert [p.name for p in _type(double).outputs] == ["value"]
    assert _type(double).execute(None, {"x": 4}, {}) == {"value": 8}


@pytest.mark.parametrize("source, said", [
    ("def f(*values): pass", r"\*values cannot be a port"),
    ("def f(x: float, when: object = object()): pass", "param when needs a type troupe can edit"),
])
def test_what_cannot_be_a_node_is_said(source, said):
    scope: dict = {}
    exec(source, scope)
    with pytest.raises(NodeDeclarationError, match=said):
        node(scope["f"])


def test_an_unknown_resource_is_refused():
    with pytest.raises(NodeDeclarationError, match="resources has no cores"):
        node(resources={"cores": 2})(lambda x: x)
