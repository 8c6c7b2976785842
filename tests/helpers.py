"""Test helpers: a real control plane in a subprocess, and graph builders."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, cast

from troupe.cli.client import Client
from troupe.protocol import worker as wire

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


def troupe_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "troupe.cli.main", *args]


def base_env(home: Path, **settings: str) -> dict[str, str]:
    # The tests say which cards a process sees; the machine's own setting must not leak in.
    # Nor the width of the terminal the tests run in (pytest-xdist's workers are given one).
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TROUPE_") and k not in ("CUDA_VISIBLE_DEVICES", "COLUMNS", "LINES")}
    env["TROUPE_HOME"] = str(home)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(settings)
    return env


class Server:
    """``troupe start --port 0`` in its own process; ``url`` and ``token`` come from the
    session file it writes once it serves."""

    def __init__(self, home: Path, preexec: Any = None, port: int = 0, **settings: str) -> None:
        self.home = home
        self.port = port  # 0: a free one
        self.preexec = preexec  # run in the server's process before it starts (resource limits)
        self.env = base_env(home, **settings)
        self.proc: subprocess.Popen[str] | None = None
        self.output: list[str] = []
        self.url = ""
        self.token = ""
        self.login_url = ""  # the one-time link that logs a browser in
        self.ca: str | None = None  # the certificate an https server serves
        self._printed = threading.Condition()

    def printed(self, text: str, timeout: float = 30.0) -> str:
        """What the server printed so far, once ``text`` is in it (the lines after
        "serving on" come a moment later)."""
        with self._printed:
            self._printed.wait_for(lambda: text in "".join(self.output), timeout)
            return "".join(self.output)

    def start(self, timeout: float = 30.0) -> Server:
        self.proc = subprocess.Popen(
            troupe_cmd("start", "--port", str(self.port), "--examples", str(EXAMPLES)),
            cwd=REPO, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=self.preexec,
        )
        ready = threading.Event()

        def pump() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                with self._printed:
                    self.output.append(line)
                    self._printed.notify_all()
                if "serving on" in line:
                    ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(timeout) or self.proc.poll() is not None:
            raise RuntimeError("server did not start:\n" + "".join(self.output))
        session = json.loads((self.home / "session.json").read_text())
        self.url, self.token, self.login_url = session["url"], session["token"], session["login_url"]
        self.ca = session.get("ca")
        return self

    @property
    def client(self) -> Client:
        return Client(self.url, self.token, ca=self.ca)

    @property
    def anonymous(self) -> Client:
        return Client(self.url, None, ca=self.ca)

    def session(self, **link: Any) -> Client:
        """A client with a session opened from a fresh login link (``uses=`` a class
        link, ``read_only=True``; nothing: the teacher's)."""
        status, made = self.client.request("POST", "/api/login-links", link)
        assert status == 201, made
        token = urllib.parse.urlsplit(made["login_url"]).query.removeprefix("token=")
        status, reply = self.anonymous.request("POST", "/api/login", {"token": token})
        assert status == 201, reply
        return Client(self.url, reply["session"], ca=self.ca)

    def submit(self, graph: dict[str, Any], expect: int = 201, **options: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"graph": graph, "options": options}
        status, reply = self.client.request("POST", "/api/runs", body)
        assert status == expect, (status, reply)
        return cast(dict[str, Any], reply)

    def get(self, path: str) -> Any:
        status, reply = self.client.request("GET", path)
        assert status == 200, (path, status, reply)
        return reply

    def download(self, path: str) -> bytes:
        """The bytes of a GET that answers a file (an artifact, an upload's content)."""
        with urllib.request.urlopen(self.url + path, timeout=60) as response:
            return cast(bytes, response.read())

    def events_until_finished(self, run_id: str, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Follows the run's stream until ``run_finished``; returns every event."""
        events = []
        for kind, data in self.client.stream(f"/api/runs/{run_id}/stream", read_timeout=timeout):
            if kind == "run_event":
                events.append(data)
                if data["type"] == "run_finished":
                    return events
        raise AssertionError(f"stream of {run_id} ended without run_finished: {events}")

    def wait_status(self, run_id: str, status: str, timeout: float = 30.0) -> dict[str, Any]:
        """Waits, on the global stream, for ``run_id`` to reach ``status``."""
        row: dict[str, Any] = self.get(f"/api/runs/{run_id}")
        if row["status"] == status:
            return row
        for kind, data in self.client.stream("/api/stream", read_timeout=timeout):
            if kind == "hello":
                row = self.get(f"/api/runs/{run_id}")
                if row["status"] == status:
                    return row
            elif kind == "run" and data.get("run_id") == run_id and data.get("status") == status:
                return cast(dict[str, Any], self.get(f"/api/runs/{run_id}"))
        raise AssertionError(f"{run_id} never reached {status}")

    def wait_until(self, predicate: Any, timeout: float = 30.0) -> None:
        """Checks ``predicate()`` when the global stream opens and after each change it
        announces, until it holds."""
        for kind, _ in self.client.stream("/api/stream", read_timeout=timeout):
            if kind in ("hello", "run") and predicate():
                return
        raise AssertionError("the condition never held")

    def poll_until(self, predicate: Any, timeout: float = 30.0) -> None:
        """For what no stream announces (a worker's connection, a process elsewhere):
        checks ``predicate()`` every 0.1 s until it holds."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"the condition did not hold within {timeout} s")
            time.sleep(0.1)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def rss_mib(self) -> float:
        """The server process's resident memory now, in MiB (Linux /proc)."""
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS for the server process")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)


def run_event(run_id: str, counter: int, kind: str, payload: dict[str, Any], node_id: str | None = None) -> str:
    """A worker's frame of one event of a run, as JSON text for the socket."""
    frame = wire.RunEvents(run_id=run_id, counter=counter, events=[(kind, node_id, json.dumps(payload))])
    return frame.model_dump_json()


def graph(*nodes: dict[str, Any], edges: tuple[dict[str, Any], ...] = (), device: str | None = None,
          name: str = "test") -> dict[str, Any]:
    doc: dict[str, Any] = {"version": 1, "name": name, "nodes": list(nodes), "edges": list(edges)}
    if device is not None:
        doc["settings"] = {"device": device}
    return doc


def node(node_id: str, kind: str, **params: Any) -> dict[str, Any]:
    return {"id": node_id, "type": kind, "params": params}


def edge(source: str, source_port: str, target: str, target_port: str) -> dict[str, Any]:
    return {"source": source, "source_port": source_port, "target": target, "target_port": target_port}


def sleeper(seconds: float = 30.0, device: str | None = None) -> dict[str, Any]:
    return graph(node("z", "core.Sleep", seconds=seconds), device=device, name="sleeper")


def hello() -> dict[str, Any]:
    return cast(dict[str, Any], json.loads((EXAMPLES / "hello.json").read_text()))
