"""The code record of a command (troupe.subprocess_runner.code_record) against a real git: a
diff past 64 KiB is kept cut, with the digest and size of all of it; a file outside the
command's folders is not recorded; a folder with no git tree records the files alone;
a machine without git records the files and no tree."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from troupe.subprocess_runner import code_record


def _git(folder: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(folder), "-c", "user.email=lab@example.org", "-c", "user.name=lab", *args],
                          check=True, capture_output=True).stdout


def test_a_long_diff_is_cut_with_the_digest_of_all_of_it(tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    _git(tmp_path, "init", "-q", "-b", "main")
    _git(tmp_path, "add", "train.py")
    _git(tmp_path, "commit", "-q", "-m", "one")
    (tmp_path / "train.py").write_text("print(1)\n" + "x = 1  # a long edit\n" * 10_000)
    found = code_record.take([sys.executable, "train.py", "--config=train.py", "/etc/hostname"], tmp_path)
    assert [f["name"] for f in found["files"]] == ["train.py"]  # once, and nothing outside its folder
    (tree,) = found["repos"]
    whole = _git(tmp_path, "diff", "HEAD")
    assert tree["diff_cut"] and len(tree["diff"].encode()) == code_record.DIFF_CAP
    assert (tree["diff_sha256"], tree["diff_bytes"]) == (hashlib.sha256(whole).hexdigest(), len(whole))
    assert tree["dirty"] is True and tree["branch"] == "main"


def test_no_tree_and_no_git_record_the_files_alone(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text("print(1)\n")
    alone = code_record.take(["train.py"], tmp_path)
    assert alone["repos"] == [] and "repo" not in alone["files"][0]
    assert alone["files"][0]["sha256"] == hashlib.sha256(b"print(1)\n").hexdigest()
    _git(tmp_path, "init", "-q")
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    without_git = code_record.take(["train.py"], tmp_path)
    assert without_git["repos"] == [] and without_git["files"][0]["sha256"] is not None
