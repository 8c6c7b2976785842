"""Every shell and JSON example in README.md and docs/ runs against a real server, so the
docs cannot drift from the program again (issue 28).

The rules an example follows (docs/decisions.md, "Examples that run"):

* a ```` ```sh ```` block runs, in bash with ``set -euo pipefail``, after the blocks
  before it in the same file (a variable set in one is there in the next); where its
  lines start with ``$ ``, those are the commands and the other lines show their output;
* ``http://127.0.0.1:8765`` and the other example addresses reach the test's server,
  ``troupe`` and ``python`` are this checkout's, the working folder has ``examples/``,
  and the server's label ``data`` is a copy of it;
* a ```` ```json ```` block parses; after ``<!-- check: METHOD PATH TEMPLATE -->`` it
  is sent (``$`` in the template stands for the block) and must be accepted;
* the ```` ```python ```` blocks of a page are one notebook session: they run in one
  interpreter, in order, after the page's shell blocks, with ``TROUPE_HOME`` the test
  server's (so ``troupe.Client()`` finds it) and the checkout's ``troupe`` importable;
* a block after ``<!-- not run: REASON -->`` is left out, and the reason printed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import REPO, base_env

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"(?:<!--\s*(?P<note>[^>]*?)\s*-->\s*\n)?```(?P<lang>\w*)\n(?P<body>.*?)```", re.S)
ADDRESSES = ("http://127.0.0.1:8765", "http://laptop.lan:8765", "http://control:8765")


@dataclass(frozen=True)
class Example:
    path: Path
    lang: str
    body: str
    note: str

    @property
    def skipped(self) -> str | None:
        return self.note.removeprefix("not run:").strip() if self.note.startswith("not run:") else None


def examples(path: Path) -> list[Example]:
    return [Example(path, m["lang"], m["body"], m["note"] or "") for m in BLOCK.finditer(path.read_text())]


def shell_of(body: str) -> str:
    lines = body.splitlines()
    if any(line.startswith("$ ") for line in lines):
        return "\n".join(line[2:] for line in lines if line.startswith("$ "))
    return body


def test_every_example_is_runnable_or_says_why_not():
    for path in DOCS:
        for example in examples(path):
            if example.skipped is not None:
                assert example.skipped, f"{path.name}: a block left out without a reason"
                print(f"{path.name}: not run ({example.skipped})")
            elif example.lang == "json":
                json.loads(example.body)  # no placeholders such as {...} in a JSON example


@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", [p for p in DOCS if any(
    e.lang in ("sh", "json", "python") and e.skipped is None for e in examples(p))], ids=lambda p: p.name)
def test_the_examples_of(path, make_server, tmp_path):
    if shutil.which("curl") is None:
        pytest.skip("the docs' examples use curl (.ci/run installs it)")
    # The label ``data`` is a copy of examples/ (docs/scripts.md runs a script from it):
    # a run writes nothing into the checkout.
    mounted = shutil.copytree(REPO / "examples", tmp_path / "mount", ignore=shutil.ignore_patterns("__pycache__"))
    server = make_server(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="2", TROUPE_MOUNT_PATH=str(mounted))
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "examples").symlink_to(REPO / "examples")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, target in (("troupe", f'{sys.executable} -m troupe.cli.main'), ("python", sys.executable),
                         ("python3", sys.executable)):
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec {target} "$@"\n')
        shim.chmod(0o755)
    env = {**base_env(server.home), "PATH": f"{bin_dir}:{base_env(server.home)['PATH']}", "PYTHONPATH": str(REPO),
           "XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_STATE_HOME": str(tmp_path / "state")}
    script, notebook = ["set -euo pipefail"], []
    for number, example in enumerate(examples(path)):
        if example.skipped is not None:
            continue
        if example.lang == "sh":
            body = shell_of(example.body)
            for address in ADDRESSES:
                body = body.replace(address, server.url)
            script += [f"echo '--- block {number}' >&2", body]
        elif example.lang == "python":
            notebook.append(f"print('--- cell {number}', file=__import__('sys').stderr)\n{example.body}")
        elif example.lang == "json" and example.note.startswith("check:"):
            method, target, template = example.note.removeprefix("check:").split(None, 2)
            sent = json.loads(template.replace("$", example.body))
            status, reply = server.client.request(method, target, sent)
            assert status < 300, (path.name, number, status, reply)
    if notebook:
        (tmp_path / "notebook.py").write_text("\n".join(notebook))
        script += [f"python {tmp_path / 'notebook.py'}"]
    if len(script) == 1:
        return
    ran = subprocess.run(["bash", "-c", "\n".join(script)], cwd=folder, env=env, capture_output=True, text=True,
                         timeout=840)
    assert ran.returncode == 0, f"{path.name}:\n{ran.stdout[-3000:]}\n{ran.stderr[-3000:]}"
