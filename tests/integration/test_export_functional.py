"""Export: the script runs without a server and matches troupe exec exactly."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import REPO, base_env, edge, graph, node, troupe_cmd
from tests.integration.test_training_functional import quick_digits


def metric_lines(stdout: str) -> list[dict]:
    events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return [e for e in events if e["type"] == "metric"]


def test_the_exported_seeded_digits_script_matches_troupe_exec(tmp_path):
    path = tmp_path / "digits.json"
    path.write_text(json.dumps(quick_digits(epochs=2)))
    env = base_env(tmp_path / "home")
    script = tmp_path / "digits.py"
    made = subprocess.run(troupe_cmd("export", str(path), "-o", str(script), "--seed", "11"), cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    exported = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
    assert exported.returncode == 0, exported.stderr
    offline = subprocess.run(troupe_cmd("exec", str(path), "--seed", "11", "--events-json"), cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=300)
    assert offline.returncode == 0, offline.stderr
    ours, theirs = metric_lines(exported.stdout), metric_lines(offline.stdout)
    assert len(ours) == 2 * 3 + 2 and ours == theirs


def test_export_of_an_invalid_graph_exits_1(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(graph(node("x", "core.Nope"))))
    result = subprocess.run(troupe_cmd("export", str(path)), cwd=tmp_path, env=base_env(tmp_path),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "/nodes/0/type" in result.stderr


def test_post_export_returns_a_runnable_script(shared_server, tmp_path):
    g = graph(node("a", "core.Constant", value=4), node("m", "core.LogMetric", name="val_loss"),
              edges=(edge("a", "value", "m", "value"),), name="four")
    status, reply = shared_server.client.request("POST", "/api/export", {"graph": g, "seed": 5})
    assert status == 200 and reply["filename"] == "four.py"
    script = tmp_path / reply["filename"]
    script.write_text(reply["script"])
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                         env=base_env(tmp_path))
    assert run.returncode == 0, run.stderr
    assert metric_lines(run.stdout)[0]["payload"] == {"name": "val_loss", "step": 1, "value": 4.0}
    status, reply = shared_server.client.request("POST", "/api/export", {"graph": graph(node("x", "core.Nope"))})
    assert status == 400 and reply["error"]["pointer"] == "/graph/nodes/0/type"
    status, _ = shared_server.anonymous.request("POST", "/api/export", {"graph": g})
    assert status == 401


def test_an_exported_script_and_exec_read_this_machines_pack_folders_and_storage_labels(tmp_path):
    home, lab = tmp_path / "home", tmp_path / "lab"
    (home / "packs").mkdir(parents=True)
    (home / "packs" / "labpack.py").write_text((REPO / "examples" / "packs" / "labpack.py").read_text())
    (lab / "scripts").mkdir(parents=True)
    (lab / "scripts" / "where.py").write_text("import json, os\nprint(json.dumps({'result': os.getcwd()}))\n")
    env = {**base_env(home), "TROUPE_MOUNT_PATH": str(lab)}
    packed = json.loads((REPO / "examples" / "packs" / "labpack_graph.json").read_text())
    command = graph(node("s", "script.Command", argv=["{python}", "where.py"], cwd="data:scripts"), name="where")
    for name, g in (("packed", packed), ("command", command)):
        (tmp_path / f"{name}.json").write_text(json.dumps(g))
        made = subprocess.run(troupe_cmd("export", f"{name}.json", "-o", f"{name}.py"), cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)
        assert made.returncode == 0, made.stderr
        exported = subprocess.run([sys.executable, f"{name}.py"], cwd=tmp_path, env=env, capture_output=True,
                                  text=True, timeout=120)
        assert exported.returncode == 0, exported.stderr
        offline = subprocess.run(troupe_cmd("exec", f"{name}.json", "--events-json"), cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=120)
        assert offline.returncode == 0, offline.stdout + offline.stderr
        for out in (exported.stdout, offline.stdout):
            if name == "packed":
                assert {"name": "mean", "step": 1, "value": 5.5} in [m["payload"] for m in metric_lines(out)]
            else:  # the command ran in the label's folder and printed it
                assert json.dumps({"result": str(lab / "scripts")}) in out.splitlines(), out
    # Without the label, the script says so in a line and exits 1.
    unlabelled = {k: v for k, v in env.items() if k != "TROUPE_MOUNT_PATH"}
    refused = subprocess.run([sys.executable, "command.py"], cwd=tmp_path, env=unlabelled, capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 1 and "label 'data' is not mounted" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr


def test_export_refuses_a_file_no_script_could_hold(tmp_path):
    nan = graph(node("a", "core.Constant", value=1))
    nan["nodes"][0]["position"] = {"x": 0, "y": 0}  # a layout, which no param check reads
    (tmp_path / "nan.json").write_text(json.dumps(nan).replace('"x": 0', '"x": NaN'))
    deep: dict = {"x": 1}
    for _ in range(100):
        deep = {"x": deep}
    (tmp_path / "deep.json").write_text(json.dumps(graph(node("a", "core.Constant", value=deep))))
    for name, said in (("nan", "NaN is not a JSON number"), ("deep", "nested deeper than 64 levels")):
        result = subprocess.run(troupe_cmd("export", f"{name}.json"), cwd=tmp_path, env=base_env(tmp_path),
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 1 and said in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert not (tmp_path / f"{name}.py").exists()
