"""Packs that cannot stop a start (issue 62, section 4), through the real server, a real
agent and the CLI: a folder pack is imported first in a short-lived process with a time
limit and an address-space limit, so one that sleeps at import, or allocates 3 GiB, is
listed broken with that reason while the server binds its port (and holds none of the
memory), and an agent connects without its own such pack; a worker run that names a
broken pack's node is refused with `pack_broken` and its error, as an in-process run."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
from pathlib import Path

import pytest

from tests.helpers import Server
from tests.integration.test_cli_functional import cli
from tests.integration.test_packs_functional import GRAPH, LABPACK
from tests.integration.test_workers_functional import enroll, start_agent

TIMEOUT_S = "3"  # short, so the tests stay quick; the default is 10 s
HANGS = "import time\n\ntime.sleep(3600)\n"
GREEDY = ("held = b'x' * (3 * 2**30)  # written, so resident if it is ever allowed\n\nfrom troupe import node\n\n\n"
          "@node\ndef f(x: float) -> float:\n    return x\n")
BROKEN = "import lab_secret_library\n"


def _one_node(node_type: str) -> dict:
    return {"version": 1, "nodes": [{"id": "a", "type": node_type}], "edges": []}


def _printed(proc, text: str, timeout: float) -> bool:
    """Whether the process printed ``text`` within ``timeout`` s (read on a thread, so a
    process that hangs fails the test instead of holding it)."""
    seen = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            if text in line:
                seen.set()
                return

    threading.Thread(target=read, daemon=True).start()
    return seen.wait(timeout)


@pytest.mark.timeout(120)
def test_a_pack_that_hangs_or_grows_at_import_is_listed_broken_and_the_server_serves(tmp_path):
    home = tmp_path / "home"
    (home / "packs").mkdir(parents=True)
    (home / "packs" / "hangs.py").write_text(HANGS)
    (home / "packs" / "greedy.py").write_text(GREEDY)
    shutil.copy(LABPACK, home / "packs")
    server = Server(home, TROUPE_PACK_IMPORT_TIMEOUT_S=TIMEOUT_S)
    try:
        server.start(timeout=60)  # today it never binds: the import of hangs.py sleeps in the server
        listed = cli(server, "packs")
        assert listed.returncode == 0, listed.stderr
        assert f"hangs: its import took longer than {TIMEOUT_S} s (TROUPE_PACK_IMPORT_TIMEOUT_S)" in listed.stdout
        assert ("greedy: its import went past the 2048 MiB of address space a pack's import may take "
                "(TROUPE_PACK_IMPORT_MEMORY_MIB): MemoryError") in listed.stdout, listed.stdout
        assert any(line.startswith("labpack") for line in listed.stdout.splitlines()), listed.stdout
        broken = {p["name"]: p["error"] for p in server.get("/api/packs")["broken"]}
        assert set(broken) == {"hangs", "greedy"}, broken
        assert server.rss_mib() < 1024  # 3 GiB more if greedy.py had been imported here

        refused = server.submit(_one_node("greedy.f"), expect=400)["error"]
        assert refused["code"] == "pack_broken" and "MemoryError" in refused["message"], refused
        assert refused["pointer"] == "/graph/nodes/0/type"
        # A pack that passes is imported here as before, and runs.
        run_id = server.submit(GRAPH)["run_id"]
        assert server.wait_status(run_id, "succeeded", timeout=60)["status"] == "succeeded"
    finally:
        if server.proc is not None:
            server.kill()


@pytest.mark.timeout(180)
def test_an_agent_starts_without_its_hanging_pack_and_worker_runs_naming_broken_packs_are_pack_broken(tmp_path):
    home = tmp_path / "home"
    (home / "packs").mkdir(parents=True)
    (home / "packs" / "broken.py").write_text(BROKEN)
    server = Server(home, TROUPE_WORKER_HEARTBEAT_S="1").start()
    agent_home = tmp_path / "gpu-a" / "home"
    (agent_home / "packs").mkdir(parents=True)
    (agent_home / "packs" / "slow.py").write_text(HANGS)
    agent = start_agent(server, tmp_path / "gpu-a", enroll(server, name="gpu-a")["command"], machine="machine-a",
                        TROUPE_HOME=str(agent_home), TROUPE_PACK_IMPORT_TIMEOUT_S=TIMEOUT_S,
                        TROUPE_WORKER_HEARTBEAT_S="1")
    try:
        # Today the agent never connects: the import of its slow.py sleeps in it.
        assert _printed(agent, "connected as gpu-a", 60)

        # A pack broken on the server: its error, as for a run in the server (today
        # worker_lacks_node_types, while the worker lacks nothing the server has).
        for target in ({"worker": "gpu-a"}, {"worker": "any"}):
            refused = server.submit(_one_node("broken.read"), expect=400, target=target)["error"]
            assert refused["code"] == "pack_broken", (target, refused)
            assert "lab_secret_library" in refused["message"] and refused["pointer"] == "/graph/nodes/0/type"

        # A pack broken on the worker: the worker's error, not that it lacks the type.
        for target in ({"worker": "gpu-a"}, {"worker": "any"}):
            refused = server.submit(_one_node("slow.f"), expect=400, target=target)["error"]
            assert refused["code"] == "pack_broken", (target, refused)
            assert "pack slow failed to load on worker gpu-a: its import took longer than " \
                   f"{TIMEOUT_S} s (TROUPE_PACK_IMPORT_TIMEOUT_S)" in refused["message"], refused
    finally:
        agent.kill()
        agent.wait(30)
        server.kill()


def _starts_sleep(pids: Path, then: str = "") -> str:
    """A pack that starts ``sleep 300`` in a session of its own at import and appends its
    pid to ``pids`` (the check's import writes the first line, the server's the next)."""
    return (f"import subprocess\n\n_sleep = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
            f"with open({str(pids)!r}, 'a') as _pids:\n    _pids.write(f'{{_sleep.pid}}\\n')\n{then}{NODE}")


def _double_forks(pids: Path) -> str:
    """A pack that daemonizes ``sleep 300`` at import: fork, setsid, fork, and the middle
    process exits (its pid goes to ``pids`` as above)."""
    return ("import os\n\n_read, _write = os.pipe()\n_middle = os.fork()\nif _middle == 0:\n    os.setsid()\n"
            "    _sleep = os.fork()\n    if _sleep == 0:\n        os.execvp('sleep', ['sleep', '300'])\n"
            "    os.write(_write, f'{_sleep}\\n'.encode())\n    os._exit(0)\nos.close(_write)\n"
            f"os.waitpid(_middle, 0)\nwith open({str(pids)!r}, 'a') as _pids:\n"
            f"    _pids.write(os.read(_read, 64).decode())\n{NODE}")


NODE = "\nfrom troupe import node\n\n\n@node\ndef f(x: float) -> float:\n    return x\n"


def _gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()


@pytest.mark.timeout(120)
def test_nothing_a_packs_import_starts_outlives_its_check(tmp_path):
    """A process the check's import started in a session of its own, by a double fork, or
    before it hung, is ended with the check (the check's child is their subreaper):
    before, only the child's process group was, and they ran on under init."""
    home, pids = tmp_path / "home", {name: tmp_path / f"{name}.pids" for name in ("loner", "daemon", "stuck")}
    (home / "packs").mkdir(parents=True)
    (home / "packs" / "loner.py").write_text(_starts_sleep(pids["loner"]))
    (home / "packs" / "daemon.py").write_text(_double_forks(pids["daemon"]))
    (home / "packs" / "stuck.py").write_text(_starts_sleep(pids["stuck"], then="import time\n\ntime.sleep(3600)\n"))
    server = Server(home, TROUPE_PACK_IMPORT_TIMEOUT_S=TIMEOUT_S)
    try:
        server.start(timeout=60)
        listed = cli(server, "packs")
        assert listed.returncode == 0, listed.stderr
        names = [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]
        assert "loner" in names and "daemon" in names, listed.stdout
        assert f"stuck: its import took longer than {TIMEOUT_S} s" in listed.stdout, listed.stdout
        checked = {name: int(path.read_text().split()[0]) for name, path in pids.items()}
        server.poll_until(lambda: all(_gone(pid) for pid in checked.values()), timeout=20)
        # The server's own import of the packs that passed started theirs: the pack's to run.
        for name in ("loner", "daemon"):
            own = pids[name].read_text().split()
            assert len(own) == 2 and not _gone(int(own[1])), (name, own)
    finally:
        server.kill()
        for path in pids.values():
            for pid in path.read_text().split() if path.exists() else ():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
