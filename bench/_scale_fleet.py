"""The driver's side of the simulated agents of ``bench/scale.py``: their inventories (drawn
from ``--seed``, so two invocations place the same runs on the same cards), their
enrollment tokens, and the process that plays them (``bench/_scale_agents.py``), spoken to
over its stdin and stdout.

The server is started here too, on a port the restart phase can start it on again: the
agents dial a fixed URL, as real agents given a join command do.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from bench._http import HOST, Conn
from bench._measure import BenchError, environ
from bench._troupe import REPO, Server, start_argv, start_server

CARD_MEMORY_MIB = (24_576, 40_960, 81_920)  # a lab's mix of 24, 40 and 80 GB cards


def server_env(heartbeat_s: float) -> dict[str, str]:
    return {"TROUPE_WORKER_HEARTBEAT_S": f"{heartbeat_s:g}"}


def serve(home: Path, port: int, cpu_slots: int, heartbeat_s: float, timeout: float = 60.0) -> Server:
    """``troupe start`` on 127.0.0.1:``port`` (0: a free one) run as ``python -m troupe.cli.main``
    from the repository root, so that a git worktree's server runs the worktree's code
    (the ``troupe`` script beside the interpreter imports what the venv was installed from)."""
    argv = start_argv()
    argv[argv.index("--port") + 1] = str(port)
    return start_server(home, cpu_slots, timeout, server_env(heartbeat_s),
                        [sys.executable, "-m", "troupe.cli.main", *argv])


def fleet_specs(agents: int, seed: int) -> list[dict[str, Any]]:
    """Each simulated agent's name, machine and inventory: 1-8 cards, the same for a seed."""
    rnd = random.Random(seed)
    specs = []
    for i in range(agents):
        memory = rnd.choice(CARD_MEMORY_MIB)
        cards = [{"uuid": f"GPU-sim-{seed}-{i:04d}-{k}", "name": f"Simulated {memory // 1024} GB", "index": k,
                  "memory_total_mib": memory, "memory_free_mib": memory, "pci_bus_id": f"0000:{k + 1:02x}:00.0"}
                 for k in range(rnd.randint(1, 8))]
        specs.append({"name": f"sim-{i:04d}", "machine_id": f"sim-machine-{seed}-{i:04d}",
                      "inventory": {"cpus": rnd.choice((16, 32, 64)), "cards": cards}})
    return specs


def enroll_all(conn: Conn, specs: list[dict[str, Any]]) -> None:
    """One named join token per agent (``POST /api/workers/enrollments``), as an admin
    enrolling each box would; the agents redeem them themselves."""
    for spec in specs:
        status, reply = conn.request("POST", "/api/workers/enrollments", json.dumps({"name": spec["name"]}).encode())
        if status != 201:
            raise BenchError(f"POST /api/workers/enrollments answered {status}: {reply}")
        spec["token"] = reply["token"]


def write_plan(path: Path, server: Server, conn: Conn, specs: list[dict[str, Any]]) -> None:
    status, catalog = conn.request("GET", "/api/nodes")
    if status != 200:
        raise BenchError(f"GET /api/nodes answered {status}")
    plan = {"url": f"http://{HOST}:{server.port}", "digest": catalog["digest"],
            "node_types": sorted(n["type"] for n in catalog["nodes"]), "agents": specs}
    path.write_text(json.dumps(plan))


class Fleet:
    """The agents' process: ``stats`` and ``quit`` down its stdin, one JSON line back each."""

    def __init__(self, plan: Path, log_path: Path) -> None:
        self.log = log_path.open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "bench._scale_agents", str(plan)], cwd=str(REPO),
                                     env=environ(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log)
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        assert self.proc.stdout is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), name="fleet-stdout", daemon=True).start()
        self.log_path = log_path

    def _read(self, stream: IO[bytes]) -> None:
        for line in stream:
            self.lines.put(json.loads(line))
        self.lines.put(None)

    def _next(self, timeout: float) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise BenchError(f"the simulated agents did not answer within {timeout:g}s") from None
        if line is None:
            tail = self.log_path.read_text(errors="replace")[-1500:]
            raise BenchError(f"the simulated agents exited ({self.proc.poll()}):\n{tail}")
        if "fatal" in line:
            raise BenchError(str(line["fatal"]))
        return line

    def _tell(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command.encode() + b"\n")
        self.proc.stdin.flush()

    def stats(self, timeout: float = 60.0) -> dict[str, Any]:
        self._tell("stats")
        return self._next(timeout)

    def wait_enrolled(self, timeout: float) -> None:
        self._next(timeout)

    def wait_connected(self, n: int, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            stats = self.stats()
            if stats["connected"] >= n:
                return stats
            if time.monotonic() > deadline:
                raise BenchError(f"{stats['connected']} of {n} agents connected after {timeout:g}s; "
                                 f"errors {stats['errors']}")
            time.sleep(0.2)

    def close(self, timeout: float = 30.0) -> dict[str, Any] | None:
        """Quits the agents (their final stats), killing the process if it does not exit."""
        final = None
        if self.proc.poll() is None:
            try:
                self._tell("quit")
                final = self._next(timeout)
                self.proc.wait(timeout)
            except (BenchError, OSError, subprocess.TimeoutExpired):
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.log.close()
        return final
