"""The troupe CLI against a real server: output lines and exit codes."""

from __future__ import annotations

import fcntl
import http.server
import json
import signal
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from tests.helpers import EXAMPLES, REPO, base_env, graph, node, sleeper, troupe_cmd


def cli(server_or_home, *args, timeout=60):
    # A Path has a ``home`` too (the class's Path.home): asked by attribute, a folder once
    # became TROUPE_HOME "<bound method Path.home ...>" in the checkout.
    home = server_or_home if isinstance(server_or_home, Path) else server_or_home.home
    return subprocess.run(troupe_cmd(*args), cwd=REPO, env=base_env(home), capture_output=True, text=True,
                          timeout=timeout)


def write(tmp_path, name, doc):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def test_run_prints_the_id_first_then_nodes_then_the_result(shared_server):
    result = cli(shared_server, "run", str(EXAMPLES / "hello.json"), "--name", "greeting")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "=== Run submitted ===" and lines[1].split()[:2] == ["Run", "ID"]
    run_id = lines[1].split()[-1]
    assert "  ✓ s" in lines and "  ✓ run complete" in lines
    assert lines[-1].split() == ["Result", "succeeded"]
    assert shared_server.get(f"/api/runs/{run_id}")["name"] == "greeting"


def test_run_of_a_failing_graph_exits_1(shared_server, tmp_path):
    path = write(tmp_path, "fail.json", graph(node("f", "core.Fail", message="bad")))
    result = cli(shared_server, "run", path)
    assert result.returncode == 1
    assert "✗ f" in result.stdout and result.stdout.splitlines()[-1].split() == ["Result", "failed"]


def test_queued_runs_print_their_position_and_key(make_server, tmp_path):
    server = make_server(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="1")
    first = server.submit(sleeper(seconds=3))["run_id"]  # long enough for the CLI to connect
    server.wait_status(first, "running")
    server.submit(sleeper(seconds=0.2))
    path = write(tmp_path, "quick.json", graph(node("c", "core.Constant", value=1)))
    result = cli(server, "run", path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "  ○ queued  position 2 on cpu" in result.stdout
    assert "  ○ queued  position 1 on cpu" in result.stdout


def test_detach_exits_0_at_once_and_the_run_goes_on(shared_server, tmp_path):
    path = write(tmp_path, "s.json", sleeper(seconds=0.2))
    result = cli(shared_server, "run", path, "--detach")
    assert result.returncode == 0 and "Result" not in result.stdout
    run_id = result.stdout.splitlines()[1].split()[-1]
    assert shared_server.events_until_finished(run_id)[-1]["payload"]["status"] == "succeeded"


def test_timeout_exits_1_and_leaves_the_run_running(shared_server, tmp_path):
    path = write(tmp_path, "s.json", sleeper(seconds=30))
    result = cli(shared_server, "run", path, "--timeout", "0.5")
    assert result.returncode == 1 and "stopped waiting" in result.stdout
    run_id = result.stdout.splitlines()[1].split()[-1]
    assert shared_server.get(f"/api/runs/{run_id}")["status"] in ("queued", "running")
    shared_server.client.request("POST", f"/api/runs/{run_id}/cancel")


def test_ctrl_c_exits_130_and_the_run_goes_on(shared_server, tmp_path):
    path = write(tmp_path, "s.json", sleeper(seconds=30))
    # As in a terminal: SIGINT at its default, even when the suite itself was started in
    # the background (where a shell ignores SIGINT, and children inherit that).
    proc = subprocess.Popen(troupe_cmd("run", path), cwd=REPO, env=base_env(shared_server.home),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout is not None
    run_id = None
    for line in proc.stdout:
        if line.startswith("  Run ID"):
            run_id = line.split()[-1]
        if "started" in line:
            break
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 130
    assert shared_server.get(f"/api/runs/{run_id}")["status"] == "running"
    shared_server.client.request("POST", f"/api/runs/{run_id}/cancel")


def test_cancelled_run_exits_1(shared_server, tmp_path):
    path = write(tmp_path, "s.json", sleeper(seconds=30))
    proc = subprocess.Popen(troupe_cmd("run", path), cwd=REPO, env=base_env(shared_server.home),
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("  Run ID"):
            shared_server.client.request("POST", f"/api/runs/{line.split()[-1]}/cancel")
    assert proc.wait(30) == 1


def test_rejected_submission_exits_1_with_the_pointer(shared_server, tmp_path):
    path = write(tmp_path, "bad.json", graph(node("x", "core.Nope")))
    result = cli(shared_server, "run", path)
    assert result.returncode == 1
    assert "graph_invalid" in result.stderr and "/graph/nodes/0/type" in result.stderr


def test_missing_graph_file_exits_1(shared_server, tmp_path):
    result = cli(shared_server, "run", str(tmp_path / "nope.json"))
    assert result.returncode == 1 and "cannot read" in result.stderr and "nope.json" in result.stderr


def test_usage_errors_exit_2(shared_server):
    assert cli(shared_server, "run").returncode == 2
    assert cli(shared_server, "run", "x.json", "--seed", "abc").returncode == 2
    assert cli(shared_server, "run", "x.json", "--bogus").returncode == 2


def test_no_server_exits_1_with_a_hint(tmp_path):
    result = cli(tmp_path / "empty", "run", str(EXAMPLES / "hello.json"), "--port", "9")
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1 and "troupe start" in result.stderr


def test_exec_runs_offline_and_exits_by_outcome(tmp_path):
    ok = cli(tmp_path, "exec", str(EXAMPLES / "hello.json"), "--seed", "1")
    assert ok.returncode == 0 and "val_loss=5" in ok.stdout and ok.stdout.splitlines()[-1].split()[-1] == "succeeded"
    bad = cli(tmp_path, "exec", write(tmp_path, "f.json", graph(node("f", "core.Fail"))))
    assert bad.returncode == 1
    invalid = cli(tmp_path, "exec", write(tmp_path, "i.json", graph(node("f", "core.Nope"))))
    assert invalid.returncode == 1 and "/nodes/0/type" in invalid.stderr
    assert not (tmp_path / "troupe.db").exists()  # no server, no database


def _one_line(result, code: int, words: str) -> None:
    assert result.returncode == code, (result.returncode, result.stderr)
    # A usage error's box wraps its words where the path's length puts the edge.
    said = " ".join(result.stderr.replace("│", " ").split())
    assert "Traceback" not in result.stderr and words in said, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 or code == 2, result.stderr  # typer boxes a usage error


def test_files_and_addresses_that_are_no_use_end_in_one_line_and_an_exit_code(shared_server, tmp_path):
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"name": "caf\xe9"}')
    _one_line(cli(shared_server, "run", str(latin)), 1, "not UTF-8")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    _one_line(cli(shared_server, "sweep", "start", str(deep)), 1, "nested too deep")
    _one_line(cli(tmp_path, "exec", write(tmp_path, "n.json", {"version": 1, "nodes": 5, "edges": []})), 1, "nodes")
    odd = graph(node("a", "core.Constant", value=1))
    odd["nodes"][0]["params"] = [1]
    _one_line(cli(tmp_path, "exec", write(tmp_path, "p.json", odd), "--set", "a.value=2"), 2, "not an object")
    ticker = write(tmp_path, "t.json", graph(node("t", "core.Ticker", count=1, interval=0)))
    _one_line(cli(tmp_path, "exec", ticker, "--set", "t.count=" + "9" * 5000), 2, "is an int")  # past int()'s digits
    _one_line(cli(shared_server, "ls", "--port", "70000"), 2, "65535")
    _one_line(cli(shared_server, "ls", "--host", "[::1"), 2, "not a server's address")
    _one_line(cli(tmp_path, "login", "http://[::1"), 1, "not a server's address")
    # A batch task's id names the agent's files: one with a "/" would place them elsewhere.
    _one_line(cli(tmp_path, "agent", "start", "--url", shared_server.url, "--token", "t", "--name", "w",
                  "--one-shot", "--instance", "../../escaped"), 2, "task id")
    _one_line(cli(tmp_path, "agent", "start", "--url", shared_server.url, "--token", "t", "--name", "w",
                  "--one-shot", "--deadline", "nan"), 2, "epoch seconds")
    _one_line(cli(tmp_path / "other", "start", "--examples", str(tmp_path / "nowhere")), 2, "does not exist")


def test_something_else_at_the_address_is_never_read_as_a_servers_answer(tmp_path):
    class NotTroupe(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self._reply()

        def do_DELETE(self):
            self._reply()

        def _reply(self) -> None:
            body, kind = (b"[1, 2]", "application/json") if "runs" in self.path else (b"<html>hi</html>", "text/html")
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotTroupe)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        port = str(other.server_address[1])
        _one_line(cli(tmp_path, "ls", "--port", port), 1, "not a troupe server")
        _one_line(cli(tmp_path, "rm", "a" * 32, "--port", port), 1, "not a troupe server")
        _one_line(cli(tmp_path, "workers", "--port", port), 1, "not a troupe server")
    finally:
        other.shutdown()


class _OtherJson(http.server.BaseHTTPRequestHandler):
    """Another JSON service: objects without a troupe server's fields, and a run stream
    that a proxy cuts in the middle of a chunk."""

    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.path.split("?")[0].endswith("/stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"40\r\nevent: run_event\n")  # a chunk of 64 bytes, cut after 17
            self.wfile.flush()
            self.close_connection = True
            return
        self._reply({"id": "b" * 32, "status": "running", "device": "cpu", "queue_key": "cpu", "name": "n"})

    def do_POST(self):
        self._reply({"ok": True})

    def do_DELETE(self):
        self._reply({"ok": True})

    def _reply(self, found) -> None:
        body = json.dumps(found).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.mark.timeout(120)
def test_an_answer_without_a_troupe_servers_fields_or_a_cut_stream_is_one_line_never_a_success(tmp_path):
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _OtherJson)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        port, run_id = str(other.server_address[1]), "b" * 32
        _one_line(cli(tmp_path, "ls", "--port", port), 1, "has no 'runs'; is this a troupe server's address")
        _one_line(cli(tmp_path, "cancel", run_id, "--port", port), 1, "has no 'status'")  # not "cancelled", exit 0
        _one_line(cli(tmp_path, "rm", run_id, "--port", port), 1, "has no 'deleted'")
        # A stream cut again and again is opened again, then given up: never an exit 0 a script reads as the end.
        _one_line(cli(tmp_path, "logs", run_id, "-f", "--port", port), 1, "stream ended 3 times with nothing new")
        _one_line(cli(tmp_path, "attach", run_id, "--port", port), 1, "stream ended 3 times with nothing new")
    finally:
        other.shutdown()


def test_ids_and_filters_are_sent_as_they_were_typed(shared_server, tmp_path):
    _one_line(cli(shared_server, "show", "café"), 2, "'café' is not a run id")  # a usage mistake, said here
    _one_line(cli(shared_server, "cancel", "x?y=1"), 2, "'x?y=1' is not a run id")  # not the run x
    _one_line(cli(shared_server, "rm", ""), 2, "an empty run id")
    _one_line(cli(shared_server, "links", "--revoke", "x?y"), 1, "no login link 'x?y'")  # not the link x
    whole = shared_server.submit(graph(node("a", "core.Constant", value=1)))["run_id"]
    shown = cli(shared_server, "show", f" {whole.upper()}\r")  # pasted with a space, a return, in capitals
    assert shown.returncode == 0 and whole in shown.stdout, shown.stderr
    _one_line(cli(shared_server, "ls", "--search", "x\udcffy"), 2, "not valid UTF-8")
    # A session file another hand changed is no session; one without a pid is never signalled as pid 0
    # (this terminal's whole process group).
    home = tmp_path / "pidless"
    home.mkdir()
    (home / "session.json").write_text(json.dumps({"url": "http://127.0.0.1:1", "token": "t"}))
    with open(home / "troupe.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stopped = subprocess.run(troupe_cmd("stop", "--timeout", "2"), cwd=REPO, env=base_env(home),
                                 capture_output=True, text=True, timeout=60, start_new_session=True)
    _one_line(stopped, 1, "names no server pid")
    (home / "session.json").write_text(json.dumps({"url": 5, "token": "t", "pid": 1}))
    _one_line(cli(home, "ls"), 1, "no troupe server answers")
    # --events-json writes JSON lines only; the warning goes to stderr.
    local = cli(tmp_path, "exec", str(EXAMPLES / "hello.json"), "--events-json", "--device", "mps")  # never on Linux
    assert local.returncode == 0 and "is not available" in local.stderr, local.stderr
    assert [json.loads(line)["type"] for line in local.stdout.splitlines()][-1] == "run_finished"


def test_a_server_that_cannot_start_says_why_in_a_line(tmp_path):
    (tmp_path / "taken").write_text("a file where the home would be")
    _one_line(cli(tmp_path / "taken", "start", "--port", "0"), 1, "cannot hold the server's files")
    unscoped = cli(tmp_path / "v6", "start", "--host", "fe80::1", "--port", "0")  # link-local needs its scope
    assert unscoped.returncode == 1 and "Traceback" not in unscoped.stderr, unscoped.stderr
    assert "cannot listen on fe80::1" in unscoped.stderr, unscoped.stderr
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        result = cli(tmp_path / "home", "start", "--port", str(holder.getsockname()[1]))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "cannot listen on 127.0.0.1 port" in result.stderr and "address already in use" in result.stderr


def test_stop_signals_the_locks_holder_not_a_pid_a_dead_servers_session_names(tmp_path):
    home = tmp_path / "restarting"
    home.mkdir()
    bystander = subprocess.Popen(["sleep", "60"])  # the dead server's pid, now another process's
    holder = subprocess.Popen(["sleep", "60"])  # the server that holds the lock and is still starting
    try:
        (home / "session.json").write_text(json.dumps({"url": "http://127.0.0.1:1", "token": "t",
                                                       "pid": bystander.pid}))
        with open(home / "troupe.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            lock.write(f"{holder.pid}\n")
            lock.flush()
            stopped = subprocess.run(troupe_cmd("stop", "--timeout", "1"), cwd=REPO, env=base_env(home),
                                     capture_output=True, text=True, timeout=60)
        assert holder.wait(10) == -signal.SIGTERM, stopped.stderr
        assert bystander.poll() is None
    finally:
        for process in (bystander, holder):
            process.kill()
            process.wait()


def test_a_second_server_is_refused_even_after_the_lock_file_was_deleted(make_server):
    server = make_server()
    running = server.submit(sleeper(30))["run_id"]
    server.wait_status(running, "running")
    (server.home / "troupe.lock").unlink()
    second = cli(server.home, "start", "--port", "0")
    _one_line(second, 1, "already runs")
    assert server.get(f"/api/runs/{running}")["status"] == "running"
    server.client.request("POST", f"/api/runs/{running}/cancel")


def test_a_host_alone_takes_the_port_of_the_last_start_and_a_port_alone_its_host(shared_server):
    port = shared_server.url.rsplit(":", 1)[1]
    for args in (("--host", "127.0.0.1"), ("--port", port)):
        listed = cli(shared_server, "ls", *args)
        assert listed.returncode == 0, listed.stderr


def test_a_warning_the_submission_printed_is_not_printed_again_by_the_follow(shared_server):
    result = cli(shared_server, "run", str(EXAMPLES / "hello.json"), "--device", "cuda:7")
    assert result.returncode == 0, result.stderr
    warned = [line for line in result.stdout.splitlines() if line.startswith("  ⚠ ")]
    assert len(warned) == 1 and "cuda:7" in warned[0], result.stdout
    again = cli(shared_server, "rerun", result.stdout.split("Run ID")[1].split()[0], "--detach")
    lines = again.stdout.splitlines()
    assert lines[1].index(lines[1].split()[-1]) == lines[2].index(lines[2].split()[-1]), again.stdout  # aligned


def test_a_host_alone_beside_a_session_file_that_names_no_address_is_one_line(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "session.json").write_text(json.dumps({"url": "http://127.0.0.1:x", "token": "t", "pid": 1}))
    for args in (("--host", "127.0.0.1", "--port", "1"), ("--port", "1")):  # port 1: nothing answers there
        listed = cli(home, "ls", *args)
        assert listed.returncode == 1 and listed.stderr.startswith("troupe: no troupe server answers"), listed.stderr
        assert "Traceback" not in listed.stderr and len(listed.stderr.strip().splitlines()) == 1
    listed = cli(home, "ls", "--host", "127.0.0.2")  # the port: the settings' (the file gives none)
    assert listed.returncode == 1 and ":8765" in listed.stderr and "Traceback" not in listed.stderr, listed.stderr
