"""Node types that run code are privileged: a class session may not submit them (not as
a run, a sweep's or a study's base, nor by rerunning the teacher's run) unless the
teacher allows it; the teacher and the server's token may. The pack here is installed
the way any pack is, by an entry point of a distribution on the path."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import graph, node

PACK = '''
from troupe.subprocess_runner.node_types import NodeType, Pack, Port


def _shell(ctx, inputs, params):
    return {"value": 7.0}


PACK = Pack(name="labpriv", node_types=(
    NodeType("labpriv.Shell", _shell, outputs=(Port("value", "float"),), description="runs a command",
             privileged=True),
))
'''


def install_pack(folder: Path) -> str:
    (folder / "labpriv.py").write_text(PACK)
    info = folder / "labpriv-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: labpriv\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[troupe.packs]\nlabpriv = labpriv:PACK\n")
    return str(folder)


def test_a_class_session_is_refused_privileged_nodes_unless_the_teacher_allows(make_server, tmp_path):
    server = make_server(PYTHONPATH=install_pack(tmp_path))
    shell = graph(node("s", "labpriv.Shell"), name="shell")
    assert "'privileged': True" in str(server.get("/api/nodes"))  # the pack loaded, its node marked
    student = server.session(uses=1)
    status, reply = student.request("POST", "/api/runs", {"graph": shell})
    assert status == 403 and reply["error"]["code"] == "privileged_node", reply
    assert reply["error"]["pointer"] == "/graph/nodes/0/type" and reply["error"]["node_id"] == "s"
    sweep = {"base_graph": graph(node("s", "labpriv.Shell"), node("c", "core.Constant", value=1)),
             "sweep_spec": {"method": "grid", "params": [{"node_id": "c", "param": "value", "values": [1, 2]}]},
             "objective": {"metric": "val_loss", "direction": "minimize"}}
    status, reply = student.request("POST", "/api/sweeps", sweep)
    assert status == 403 and reply["error"]["pointer"] == "/base_graph/nodes/0/type", reply
    study = {"base_graph": shell, "variants": [{"name": "a"}], "objective": {"metric": "x", "direction": "minimize"}}
    status, reply = student.request("POST", "/api/studies", study)
    assert status == 403 and reply["error"]["code"] == "privileged_node", reply
    teachers = server.submit(shell)["run_id"]  # the token: trusted with the machine
    assert server.wait_status(teachers, "succeeded")["status"] == "succeeded"
    status, reply = student.request("POST", f"/api/runs/{teachers}/rerun", {})
    assert status == 403 and reply["error"]["code"] == "privileged_node", reply
    assert student.request("POST", "/api/runs", {"graph": graph(node("c", "core.Constant", value=1))})[0] == 201
    assert server.session().request("POST", "/api/runs", {"graph": shell})[0] == 201  # a teacher's link


def test_the_teacher_may_allow_privileged_nodes_to_a_class(make_server, tmp_path):
    server = make_server(PYTHONPATH=install_pack(tmp_path), TROUPE_CLASS_PRIVILEGED_NODES="1")
    shell = graph(node("s", "labpriv.Shell"), name="shell")
    assert server.session(uses=1).request("POST", "/api/runs", {"graph": shell})[0] == 201
    assert server.session(read_only=True).request("POST", "/api/runs", {"graph": shell})[0] == 403  # never
