"""The thread caps a process settles on: an undeclared node's share of the cap, whether
the cap is set up once (a fresh child) or again in a child forked from the zygote, where
the zygote's own setting is already in the environment."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers import REPO

_SHARE = """
import os
os.cpu_count = lambda: 16  # a 16-core machine: a cap of 15
from troupe.subprocess_runner.seeding import cap_threads, node_threads
cap_threads()
{again}
print(node_threads(None, 5), node_threads(2, 5))
"""


def _shares(again: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                               "OPENBLAS_NUM_THREADS")}
    done = subprocess.run([sys.executable, "-c", _SHARE.format(again=again)], cwd=REPO, env={**clean, **env},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_an_undeclared_node_gets_its_share_whether_the_cap_was_set_once_or_again():
    assert _shares("") == "3 2"  # 15 // 5 parallel nodes; a node that declares 2 cpus gets 2
    assert _shares("cap_threads()") == "3 2"  # a forked child sets it up again: still the share


def test_an_operators_own_omp_num_threads_wins_for_undeclared_nodes():
    assert _shares("cap_threads()", OMP_NUM_THREADS="4") == "4 2"
