"""What importing troupe's entry modules costs every process that starts from them."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO


def test_the_server_agent_and_run_child_import_no_http_client():
    """troupe.cli.main is imported by the server, by an agent, and again by each run child an
    agent spawns (multiprocessing re-imports the main module); the server's start reads
    its session file through troupe.client's light ``_config``. None of them pays for the
    terminal's and the notebook's HTTP client (troupe.Client on httpx) at its start."""
    code = (
        "import sys\n"
        "import troupe.cli.main, troupe.subprocess_runner.child\n"
        "import troupe.cli.start_cmd, troupe.cli.session, troupe.supervisors.root\n"
        "print(sorted(m for m in ('httpx', 'rich', 'troupe.client._client') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
