"""What a ``script.Command``'s program does to the process that runs it, through the real
server: output with no newline (a flood, a progress bar redrawn with ``\\r``) reaches the
console as it comes and costs the server no more than a chunk; a process that left the
group (``setsid``) is stopped with the run and holds nothing of the server's; a script that
removes its own checkpoint folder still succeeds; a real-time signal is named; a NUL in
argv is refused at submission and a missing cwd is named."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import graph, node
from tests.integration.test_command_node_functional import _alive


def shell(line: str, **params) -> dict:
    return graph(node("job", "script.Command", argv=["/bin/sh", "-c", line], **params), name="shell")


def peak_mib(server) -> float:
    status = Path(f"/proc/{server.proc.pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024


@pytest.mark.timeout(120)
def test_a_flood_without_a_newline_costs_the_server_a_chunk_not_the_flood(make_server):
    server = make_server()
    warm = server.submit(shell("echo warm"))["run_id"]
    server.wait_status(warm, "succeeded")
    before = peak_mib(server)
    run_id = server.submit(shell("head -c 200000000 /dev/zero | tr '\\0' x; echo; echo done"))["run_id"]
    assert server.wait_status(run_id, "succeeded", timeout=90)["status"] == "succeeded"
    assert peak_mib(server) - before < 100, (before, peak_mib(server))  # 200 MB went by
    console, after = [], 0
    while True:  # page by page: the kept tail is more than one reply holds
        page = server.get(f"/api/runs/{run_id}/events?after={after}")
        console += [e["payload"] for e in page["events"] if e["type"] == "console"]
        if not page["events"]:
            break
        after = page["events"][-1]["seq"]
    assert any("skipped" in c for c in console) and "done" in "".join(c.get("text", "") for c in console)


@pytest.mark.timeout(60)
def test_a_progress_bar_redrawn_on_one_line_reaches_the_console_while_it_runs(make_server):
    server = make_server()
    run_id = server.submit(shell("printf 'step 1/3\\r'; sleep 30; echo"))["run_id"]
    for kind, event in server.client.stream(f"/api/runs/{run_id}/stream", read_timeout=30):
        if kind == "run_event" and event["type"] == "console" and "step 1/3" in event["payload"].get("text", ""):
            break
        assert not (kind == "run_event" and event["type"] == "run_finished"), event
    assert server.get(f"/api/runs/{run_id}")["status"] == "running"
    server.client.request("POST", f"/api/runs/{run_id}/cancel")


@pytest.mark.timeout(60)
def test_a_process_that_left_the_group_is_stopped_with_the_run(make_server):
    server = make_server()
    line = "setsid sleep 300 & echo $! ; rm -rf \"$TROUPE_CHECKPOINT_DIR\""
    run_id = server.submit(shell(line))["run_id"]
    row = server.wait_status(run_id, "succeeded", timeout=30)  # its checkpoint folder gone: no failure
    assert row["status"] == "succeeded"
    pid = int(next(e["payload"]["text"] for e in server.get(f"/api/runs/{run_id}/events")["events"]
                   if e["type"] == "console").split()[0])
    server.poll_until(lambda: not _alive(pid), timeout=15)


def test_a_real_time_signal_is_named_and_bad_arguments_are_said(make_server, tmp_path):
    server = make_server(TROUPE_DATA_ROOTS=str(tmp_path))
    run_id = server.submit(shell("echo bye >&2; kill -40 $$"))["run_id"]
    error = server.events_until_finished(run_id)[-1]["payload"]["error"]
    assert "was killed by signal 40" in error and "bye" in error, error
    refused = server.submit(shell("echo {x}", vars={"x": "a\u0000b"}), expect=400)["error"]
    assert refused["pointer"] == "/graph/nodes/0/params/vars/x" and "NUL" in refused["message"], refused
    nowhere = server.submit(shell("true", cwd=str(tmp_path / "gone")))["run_id"]
    error = server.events_until_finished(nowhere)[-1]["payload"]["error"]
    assert "gone" in error and "is not a folder" in error, error
