"""What importing the terminal's entry module costs every process that starts from it."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO


def test_the_entry_module_imports_no_http_client_until_a_request():
    """cli.main is imported by the server, by an agent, and again by each run child an
    agent spawns (multiprocessing re-imports the main module): the terminal's HTTP client
    (troupe.Client on httpx) comes with the first request, not with the import."""
    code = (
        "import sys\n"
        "import cli.main, subprocess_runner.child\n"
        "print(sorted(m for m in ('httpx', 'rich', 'troupe.client') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
