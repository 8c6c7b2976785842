"""docs/cli.md lists every command and option as the CLI has them (its reference part is
rendered from the CLI's own tree by ``make cli-reference``), each option has a line of
help, and no flag's help shows a ``<bool>`` as if it took a value."""

from __future__ import annotations

import subprocess

from tests.helpers import REPO, troupe_cmd
from troupe.cli.main import app
from troupe.cli.reference import END, START, commands, markdown, options


def test_docs_cli_md_lists_every_command_and_option_as_the_cli_has_them():
    page = (REPO / "docs" / "cli.md").read_text()
    written = page.partition(START)[2].partition(END)[0].strip()
    assert written == markdown(app).strip(), "docs/cli.md is behind the CLI: run `make cli-reference`"
    paths = [path for path, _ in commands(app)]
    for wanted in ("troupe tag", "troupe compare", "troupe workers", "troupe queues", "troupe packs",
                   "troupe study resume", "troupe agent start"):
        assert wanted in paths


def test_every_argument_and_option_has_a_line_of_help():
    bare = [f"{path} {how}" for path, command in commands(app) for how, text in options(command) if not text.strip()]
    assert bare == []


def test_help_shows_no_bool_marker_beside_a_flag():
    shown = subprocess.run(troupe_cmd("run", "--help"), cwd=REPO, capture_output=True, text=True, timeout=60,
                           env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"})
    assert shown.returncode == 0 and "--detach" in shown.stdout and "--json" in shown.stdout, shown.stderr
    ours = [line for line in shown.stdout.splitlines() if "--" in line and "--help" not in line]
    assert ours and not [line for line in ours if "<bool>" in line]  # typer's own --help keeps typer's column
