"""The catalog stays light, and validation names what is wrong and where."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import REPO, edge, graph, node
from troupe.protocol.graph import Graph
from troupe.subprocess_runner.catalog import NodeType, Pack, Param, Port, build_catalog, load_catalog
from troupe.subprocess_runner.errors import GraphInvalid, PackLoadError
from troupe.subprocess_runner.packs import core
from troupe.subprocess_runner.validation import validate_graph

HEAVY = ("torch", "sklearn", "sacrebleu", "nltk", "numpy", "rouge_score")


def test_loading_the_catalog_and_the_control_plane_imports_no_heavy_library():
    code = (
        "import sys\n"
        "from troupe.subprocess_runner.catalog import load_catalog\n"
        "import troupe.supervisors.root, troupe.web.app, troupe.cli.main\n"
        "load_catalog()\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_core_pack_is_found_through_its_entry_point():
    from importlib import metadata

    names = {e.name for e in metadata.entry_points(group="troupe.packs")}
    assert "core" in names
    assert "core" in load_catalog().packs


def test_the_digest_depends_on_the_declared_types_only():
    assert load_catalog().digest == load_catalog().digest
    extra = build_catalog([core.PACK, Pack("x", (NodeType("x.Y", lambda c, i, p: {}),))])
    assert extra.digest != load_catalog().digest


def test_a_type_declared_twice_is_refused():
    with pytest.raises(PackLoadError):
        build_catalog([core.PACK, core.PACK])


TYPED = build_catalog([core.PACK, Pack("t", (
    NodeType("t.Text", lambda c, i, p: {"text": "x"}, outputs=(Port("text", "string"),)),
    NodeType("t.Pick", lambda c, i, p: {}, params=(
        Param("mode", "select", default="a", options=("a", "b")), Param("n", "int", default=1, min=1, max=5),
        Param("flag", "bool", default=False))),
))])


def error_of(doc, catalog=TYPED):
    with pytest.raises(GraphInvalid) as caught:
        validate_graph(Graph.model_validate(doc), catalog)
    return caught.value


def test_port_type_mismatch_points_at_the_target_port():
    error = error_of(graph(node("t", "t.Text"), node("m", "core.LogMetric"), edges=(edge("t", "text", "m", "value"),)))
    assert error.pointer == "/graph/edges/0/target_port" and error.node_id == "m"
    assert "takes float" in error.message and "gives string" in error.message


@pytest.mark.parametrize("params, pointer, word", [
    ({"mode": "c"}, "/graph/nodes/0/params/mode", "one of"),
    ({"n": 2.5}, "/graph/nodes/0/params/n", "integral"),
    ({"n": True}, "/graph/nodes/0/params/n", "integer"),
    ({"n": 9}, "/graph/nodes/0/params/n", "<= 5"),
    ({"n": 0}, "/graph/nodes/0/params/n", ">= 1"),
    ({"flag": 1}, "/graph/nodes/0/params/flag", "true or false"),
])
def test_param_violations(params, pointer, word):
    error = error_of(graph({"id": "p", "type": "t.Pick", "params": params}))
    assert error.pointer == pointer and word in error.message and error.node_id == "p"


def test_an_integral_float_is_an_int_and_an_int_is_a_float():
    params = validate_graph(Graph.model_validate(graph({"id": "p", "type": "t.Pick", "params": {"n": 3.0}})), TYPED)
    assert params["p"]["n"] == 3 and isinstance(params["p"]["n"], int)
    params = validate_graph(Graph.model_validate(graph(node("c", "core.Constant", value=2))), TYPED)
    assert params["c"]["value"] == 2.0 and isinstance(params["c"]["value"], float)
