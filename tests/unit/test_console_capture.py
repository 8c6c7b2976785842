"""A worker run's console capture (descriptors 1 and 2 of its process), in a process of
its own: what was written before ``close`` is all passed on, in order and whole, and
``close`` does not wait for a process the run started that still holds a descriptor."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent("""
    import json, os, subprocess, sys, threading
    sys.path.insert(0, sys.argv[1])
    from troupe.subprocess_runner.console import Console, DescriptorCapture

    got = []
    capture = DescriptorCapture()
    capture.attach(Console(lambda kind, node, payload: got.append(payload), 0))
    lines = [f"line {i:05d} " + "x" * 100 + "\\n" for i in range(2000)]  # 232 KB: more than a pipe holds
    for line in lines:
        os.write(1, line.encode())
    os.write(2, "caf\\u00e9 on stderr\\n".encode())
    # A process the run left behind, holding both descriptors open: the close must not
    # wait for it (the old one waited until a watchdog here ended it).
    lingering = subprocess.Popen(["sleep", "60"])
    watchdog = threading.Timer(5.0, lingering.kill)
    watchdog.start()
    capture.close()
    alive_after_close = lingering.poll() is None
    watchdog.cancel()
    lingering.kill()
    out = "".join(p["text"] for p in got if p.get("stream") == "stdout")
    err = "".join(p["text"] for p in got if p.get("stream") == "stderr")
    print(json.dumps({"stdout_whole": out == "".join(lines), "stderr": err,
                      "alive_after_close": alive_after_close}))
""")


def test_capture_passes_on_everything_written_before_close_and_does_not_wait_for_a_lingering_process():
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(REPO)], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said == {"stdout_whole": True, "stderr": "caf\u00e9 on stderr\n", "alive_after_close": True}
