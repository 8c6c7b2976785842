"""``--set NODE.PARAM=VALUE`` from the terminal: each value read by the param's declared
type, on ``run`` and ``export`` (through the server's catalog) and ``exec`` (the local
one); a node or param that does not exist is a usage error (exit 2) naming those that do."""

from __future__ import annotations

import json

from tests.helpers import EXAMPLES
from tests.integration.test_cli_functional import cli

HELLO = str(EXAMPLES / "hello.json")


def test_set_changes_a_param_by_its_declared_type_on_run(shared_server):
    hello = json.loads((EXAMPLES / "hello.json").read_text())
    constant = next(n for n in hello["nodes"] if n["type"] == "core.Constant")
    ran = cli(shared_server, "run", HELLO, "--set", f"{constant['id']}.value=41.5", "--detach")
    assert ran.returncode == 0, ran.stderr
    run_id = ran.stdout.split("Run ID")[1].split()[0]
    row = shared_server.get(f"/api/runs/{run_id}")
    params = {n["id"]: n.get("params") for n in row["graph"]["nodes"]}
    assert params[constant["id"]]["value"] == 41.5
    assert row["options"]["params_set"] == {f"{constant['id']}.value": 41.5}  # the run records what was set
    shown = cli(shared_server, "show", run_id)
    assert shown.returncode == 0 and f"{constant['id']}.value=41.5" in shown.stdout, shown.stdout


def test_a_bad_set_exits_2_and_names_what_exists(shared_server):
    before = len(shared_server.get("/api/runs?limit=500")["runs"])
    hello = json.loads((EXAMPLES / "hello.json").read_text())
    ids = sorted(n["id"] for n in hello["nodes"])
    constant = next(n["id"] for n in hello["nodes"] if n["type"] == "core.Constant")
    nowhere = cli(shared_server, "run", HELLO, "--set", "nowhere.value=1")
    assert nowhere.returncode == 2 and ", ".join(ids) in nowhere.stderr, nowhere.stderr
    unknown = cli(shared_server, "run", HELLO, "--set", f"{constant}.colour=red")
    assert unknown.returncode == 2 and "has no param 'colour'; it has value" in unknown.stderr, unknown.stderr
    typed = cli(shared_server, "run", HELLO, "--set", f"{constant}.value=high")
    assert typed.returncode == 2 and "is a number" in typed.stderr
    shape = cli(shared_server, "run", HELLO, "--set", "value")
    assert shape.returncode == 2 and "NODE.PARAM=VALUE" in shape.stderr
    assert len(shared_server.get("/api/runs?limit=500")["runs"]) == before  # nothing was submitted


def test_set_on_exec_and_export(shared_server, tmp_path):
    hello = json.loads((EXAMPLES / "hello.json").read_text())
    constant = next(n["id"] for n in hello["nodes"] if n["type"] == "core.Constant")
    executed = cli(tmp_path / "nohome", "exec", HELLO, "--set", "a.value=100")
    assert executed.returncode == 0, executed.stderr
    assert "val_loss=103" in executed.stdout  # 100 + 3
    exported = cli(shared_server, "export", HELLO, "--set", f"{constant}.value=77", "-o", str(tmp_path / "x.py"))
    assert exported.returncode == 0, exported.stderr
    assert "77" in (tmp_path / "x.py").read_text()


def test_set_changes_a_sweeps_base_graph(shared_server, tmp_path):
    spec = {"name": "set base", "base_graph": json.loads((EXAMPLES / "hello.json").read_text()),
            "sweep_spec": {"method": "grid", "params": [{"node_id": "b", "param": "value", "values": [1, 2]}]},
            "objective": {"metric": "val_loss", "direction": "minimize"}}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    started = cli(shared_server, "sweep", "start", str(path), "--set", "a.value=10", "--detach", "--json")
    assert started.returncode == 0, started.stderr
    sweep_id = json.loads(started.stdout)["sweep_id"]
    runs = shared_server.get(f"/api/runs?sweep_id={sweep_id}")["runs"]
    finals = sorted(shared_server.wait_status(r["id"], "succeeded")["final_loss"] for r in runs)
    assert finals == [11, 12]  # 10 + 1, 10 + 2
    bad = cli(shared_server, "study", "start", str(path), "--set", "a.nothing=1")
    assert bad.returncode == 2 and "it has value" in bad.stderr


def test_set_on_rerun_changes_the_runs_graph_and_is_recorded(shared_server):
    first = shared_server.submit(json.loads((EXAMPLES / "hello.json").read_text()))["run_id"]
    shared_server.wait_status(first, "succeeded")
    again = cli(shared_server, "rerun", first, "--set", "a.value=10", "--detach")
    assert again.returncode == 0, again.stderr
    run_id = again.stdout.split("Run ID")[1].split()[0]
    row = shared_server.wait_status(run_id, "succeeded")
    assert row["final_loss"] == 13 and row["rerun_of"] == first  # 10 + 3
    assert row["options"]["params_set"] == {"a.value": 10.0}
    bad = cli(shared_server, "rerun", first, "--set", "a.colour=1")
    assert bad.returncode == 2 and "it has value" in bad.stderr
    status, reply = shared_server.client.request("POST", f"/api/runs/{first}/rerun", {"params_set": {"z.value": 1}})
    assert status == 400 and reply["error"]["pointer"] == "/params_set/z.value", reply
    # A fault points into the rerun's own body, not into a graph it never sent.
    status, reply = shared_server.client.request("POST", f"/api/runs/{first}/rerun", {"params_set": {"a.value": "x"}})
    assert status == 400 and reply["error"]["pointer"] == "/params_set/a.value", reply
    dotted = shared_server.submit({"version": 1, "nodes": [{"id": "a", "type": "core.Constant", "params": {"value": 1}},
                                                          {"id": "a.value", "type": "core.Constant",
                                                           "params": {"value": 2}}], "edges": []})["run_id"]
    shared_server.wait_status(dotted, "succeeded")
    status, reply = shared_server.client.request("POST", f"/api/runs/{dotted}/rerun",
                                                 {"params_set": {"a.value.value": 3}})
    assert status == 400 and reply["error"]["pointer"] == "/params_set/a.value.value", reply
    assert "not guessed" in reply["error"]["message"]


def test_set_into_a_mapping_the_graph_does_not_hold_as_an_object_is_a_usage_error(tmp_path):
    command = {"id": "train", "type": "script.Command", "params": {"argv": ["/bin/echo", "{x}"], "vars": [1, 2]}}
    path = tmp_path / "g.json"
    path.write_text(json.dumps({"name": "g", "nodes": [command], "edges": []}))
    bad = cli(tmp_path / "nohome", "exec", str(path), "--set", "train.vars.x=1")
    assert bad.returncode == 2 and "train's vars is not an object" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    # nan and 1e999 are no JSON number: the program gets them as the text they are.
    path.write_text(json.dumps({"name": "g", "nodes": [{**command, "params": {"argv": ["/bin/echo", "{x}"]}}],
                                "edges": []}))
    for text in ("nan", "1e999"):
        ran = cli(tmp_path / "nohome", "exec", str(path), "--set", f"train.vars.x={text}")
        assert ran.returncode == 0 and text in ran.stdout, ran.stdout + ran.stderr


def test_a_set_that_could_name_two_nodes_is_a_usage_error_not_a_guess(shared_server, tmp_path):
    path = tmp_path / "dotted.json"
    path.write_text(json.dumps({"version": 1, "edges": [], "nodes": [
        {"id": "a", "type": "script.Command", "params": {"argv": ["/bin/echo", "{value}"], "vars": {"value": 1}}},
        {"id": "a.vars", "type": "core.Constant", "params": {"value": 2}}]}))
    for where, args in ((shared_server, ("run", str(path))), (tmp_path / "nohome", ("exec", str(path)))):
        refused = cli(where, *args, "--set", "a.vars.value=5")
        assert refused.returncode == 2 and "could name a param of two nodes" in refused.stderr, refused.stderr
        assert "a.vars and a" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
