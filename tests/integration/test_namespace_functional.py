"""The installed distribution is one namespace, ``troupe`` (issue 63): a notebook whose
folder holds its own ``protocol.py``, ``cli/`` and ``web/`` (first on ``sys.path``, as a
notebook's folder is) imports troupe, drives a server and runs the CLI unharmed."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

from tests.helpers import base_env

NOTEBOOK = """
import troupe
client = troupe.Client({url!r}, token={token!r})
run = client.run({{"version": 1, "nodes": [{{"id": "a", "type": "core.Constant", "params": {{"value": 2}}}},
                 {{"id": "m", "type": "core.LogMetric", "params": {{"name": "val_loss"}}}}],
                 "edges": [{{"source": "a", "source_port": "value", "target": "m", "target_port": "value"}}]}})
print(run.status, run.metrics()["val_loss"][-1].value)
import protocol, cli, web
print(protocol.MINE, cli.MINE, web.MINE)
"""


def test_the_distribution_is_one_namespace():
    top = importlib.metadata.distribution("troupe").read_text("top_level.txt")
    assert top is not None and top.split() == ["troupe"]
    entry = {e.name: e.value for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "troupe"}
    assert entry == {"troupe": "troupe.cli.main:main"}


def test_a_notebook_with_its_own_protocol_cli_and_web_imports_troupe_unharmed(shared_server, tmp_path):
    (tmp_path / "protocol.py").write_text("MINE = 'protocol'\n")
    for name in ("cli", "web", "actors", "subprocess_runner"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"MINE = {name!r}\n")
    code = NOTEBOOK.format(url=shared_server.url, token=shared_server.token)
    ran = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=base_env(shared_server.home),
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["succeeded", "2.0", "protocol", "cli", "web"]
    version = subprocess.run([sys.executable, "-m", "troupe.cli.main", "--version"], cwd=tmp_path,
                             env=base_env(shared_server.home), capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("troupe "), version.stderr
