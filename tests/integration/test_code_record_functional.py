"""The code a run ran (issue 65, section 3), through the real server, a real agent and
the CLI: a command run records each file its argv names with its sha256 and, in a git
work tree, the commit, the branch, whether the tree was dirty and the uncommitted diff;
a script edited between two runs gives two fingerprints that differ by its sha256 and
its diff, which ``GET /api/runs/{b}/fingerprint?against={a}``, ``troupe compare`` and
``troupe show`` name; a worker's child records the same where it runs."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

import troupe
from tests.helpers import graph, node
from tests.integration.test_cli_functional import cli
from tests.integration.test_workers_functional import enroll, read_until, start_agent

TRAIN = 'import json\nprint(json.dumps({"metric": "loss", "value": 0.5, "step": 1}))\n'


def _git(folder: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(folder), "-c", "user.email=lab@example.org", "-c", "user.name=lab",
                           *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def lab(tmp_path):
    """A git work tree with the lab's script, committed on branch main."""
    folder = tmp_path / "lab"
    folder.mkdir()
    (folder / "train.py").write_text(TRAIN)
    _git(folder, "init", "-q", "-b", "main")
    _git(folder, "add", "train.py")
    _git(folder, "commit", "-q", "-m", "the script")
    return folder


def _command(folder: Path) -> dict:
    return graph(node("train", "script.Command", argv=["{python}", "train.py", "--lr", "0.1"], cwd=str(folder)),
                 name="code")


def _code(server, run_id: str) -> dict:
    return server.get(f"/api/runs/{run_id}")["execution_facts"]["fingerprint"]["code"]["train"]


def _two_runs(server, lab: Path, **options) -> tuple[str, str]:
    """A run of the committed script, then one of the script edited and not committed."""
    first = server.submit(_command(lab), **options)["run_id"]
    assert server.wait_status(first, "succeeded", timeout=90)["status"] == "succeeded"
    (lab / "train.py").write_text(TRAIN + "print('one more line')\n")
    second = server.submit(_command(lab), **options)["run_id"]
    assert server.wait_status(second, "succeeded", timeout=90)["status"] == "succeeded"
    return first, second


def _check_records(server, lab: Path, first: str, second: str) -> None:
    commit = _git(lab, "rev-parse", "HEAD")
    before, after = _code(server, first), _code(server, second)
    (script,) = before["files"]  # the interpreter and "0.1" name no file of the lab's
    assert (script["name"], script["sha256"], script["tracked"]) == \
        ("train.py", hashlib.sha256(TRAIN.encode()).hexdigest(), True)
    (tree,) = before["repos"]
    assert (tree["commit"], tree["branch"], tree["dirty"], tree["diff"]) == (commit, "main", False, "")
    assert after["files"][0]["sha256"] == hashlib.sha256((lab / "train.py").read_bytes()).hexdigest()
    (edited,) = after["repos"]
    assert edited["commit"] == commit and edited["dirty"] is True
    assert "+print('one more line')" in edited["diff"] and not edited["diff_cut"]
    assert edited["diff_sha256"] == hashlib.sha256(_git(lab, "diff", "HEAD").encode() + b"\n").hexdigest()
    compared = server.get(f"/api/runs/{second}/fingerprint?against={first}")
    assert compared["fingerprint_digest"] != compared["against"]["fingerprint_digest"]
    differs = compared["against"]["differs"]
    assert differs["code.train.files.train.py.sha256"] == {"this": after["files"][0]["sha256"],
                                                           "other": script["sha256"]}
    tree_key = f"code.train.repos.{tree['name']}"
    assert differs[f"{tree_key}.diff"]["this"] == edited["diff"] and differs[f"{tree_key}.dirty"]["this"] is True
    assert f"{tree_key}.commit" not in differs  # one commit, an edit on top of it


def test_an_edited_script_gives_two_fingerprints_that_name_its_file_and_diff(make_server, lab):
    server = make_server(TROUPE_DATA_ROOTS=str(lab.parent))
    first, second = _two_runs(server, lab)
    _check_records(server, lab, first, second)
    compared = cli(server, "compare", first, second)
    assert compared.returncode == 0, compared.stderr
    assert "train: file train.py: sha256" in compared.stdout, compared.stdout
    assert "uncommitted diff (sha256)" in compared.stdout and "dirty False -> True" in compared.stdout
    with troupe.Client(server.url, token=server.token) as client:  # a notebook asks the same
        differs = client.get(second).fingerprint(against=first).against.differs  # type: ignore[union-attr]
        assert differs["code.train.files.train.py.sha256"].other == _code(server, first)["files"][0]["sha256"]
    shown = cli(server, "show", second)
    assert "train.py  sha256 " in shown.stdout and "(git main " in shown.stdout and ", dirty" in shown.stdout


def test_a_workers_child_records_the_code_it_ran(make_server, lab, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1", TROUPE_DATA_ROOTS=str(lab.parent))
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"], TROUPE_DATA_ROOTS=str(lab.parent))
    try:
        read_until(agent, "connected as gpu-a")
        first, second = _two_runs(server, lab, target={"worker": "gpu-a"})
    finally:
        agent.terminate()
        agent.wait(30)
    _check_records(server, lab, first, second)
    assert server.get(f"/api/runs/{second}")["execution_facts"]["fingerprint_source"] == "run_process"
