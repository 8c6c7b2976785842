"""A full disk (issue 25, point 4), made real: the server's home is a small tmpfs the test
mounts and fills. What does not fit is refused with ``disk_full`` (507), nothing else
fails with it, and a run whose final write did not fit is not left active: its writes
are tried again and it ends as it ended once there is room, its event log whole."""

from __future__ import annotations

import contextlib
import http.client
import json
import subprocess
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import graph, hello, node, sleeper


@contextlib.contextmanager
def _tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size``, or a skip saying why there is none (CI runs as root: there is)."""
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill (needs root): {made.stderr.strip() or made.returncode}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 24 MB tmpfs."""
    with _tmpfs(tmp_path / "small", "24m") as mount:
        yield mount


@pytest.fixture
def roomy_disk(tmp_path: Path) -> Iterator[Path]:
    """A 32 MB tmpfs: room for a run of 40,000 points (about 12 MB stored) once the filler is gone."""
    with _tmpfs(tmp_path / "roomy", "32m") as mount:
        yield mount


def _fill(disk: Path) -> Path:
    filler = disk / "filler"
    # Unbuffered, and the close inside the suppress: a buffered file's close flushed what
    # the failed write left in its buffer and raised ENOSPC again, outside the suppress.
    with contextlib.suppress(OSError), filler.open("wb", buffering=0) as out:
        while True:
            out.write(b"\0" * 65536)
    return filler


def _upload(server, data: bytes) -> tuple[int, dict]:
    parsed = urllib.parse.urlsplit(server.url)
    body = (b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f.bin\"\r\n\r\n" + data
            + b"\r\n--b--\r\n")
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    conn.request("POST", "/api/files", body=body, headers={
        "Authorization": f"Bearer {server.token}", "Content-Type": "multipart/form-data; boundary=b"})
    response = conn.getresponse()
    reply = json.loads(response.read())
    conn.close()
    return response.status, reply


def _queue(server, key: str) -> dict:
    return next(q for q in server.get("/api/queues")["queues"] if q["queue_key"] == key)


def _metric(server, name: str, labels: str) -> float:
    _status, text = server.client.request("GET", "/metrics")
    for line in str(text).splitlines():
        if line.startswith(f"{name}{{") and labels in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.timeout(120)
def test_a_full_disk_refuses_what_does_not_fit_and_strands_no_run(make_server, small_disk):
    server = make_server(home=small_disk / "home")
    running = server.submit(sleeper(2))["run_id"]
    server.wait_status(running, "running")
    filler = _fill(small_disk)
    said_before = len(server.output)
    try:
        # The run ends while nothing fits: it stays what it last was, and is not lost.
        for _ in range(10):  # a client that keeps trying: each refused, and the log says it once
            server.submit(hello(), expect=507)
        refused = server.submit(hello(), expect=507)["error"]
        assert refused["code"] == "disk_full" and "cannot rollback" not in refused["message"], refused
        status, reply = _upload(server, b"x" * 4 * 1024 * 1024)
        assert (status, reply["error"]["code"]) == (507, "disk_full"), reply
        # The run ends (its slot is free) while its final write cannot be saved.
        server.poll_until(lambda: _queue(server, "cpu")["running"] == 0, timeout=30)
        assert server.get(f"/api/runs/{running}")["status"] == "running"
        said = server.output[said_before:]
        assert len(said) <= 2 and "FOREIGN KEY" not in "".join(said), said  # one line per 30 s
    finally:
        filler.unlink()
    # Once there is room, the run's writes go through: it ends as it ended, log whole.
    events = server.events_until_finished(running, timeout=60)
    assert events[-1]["payload"]["status"] == "succeeded"
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    server.wait_until(lambda: server.get(f"/api/runs/{running}")["status"] == "succeeded")
    assert _queue(server, "cpu")["running"] == 0
    assert _metric(server, "troupe_runs", 'state="running"') == 0  # /metrics agrees with the row
    assert server.client.request("DELETE", f"/api/runs/{running}")[0] == 200
    assert server.submit(hello())["status"] == "queued"  # and the server goes on
    log = "".join(server.output)
    assert "Traceback" not in log and "cannot rollback" not in log, log[-3000:]


FULL_LINE = "is full:"  # the store's warning, said at most once per 30 s while writes are refused


@pytest.mark.timeout(180)
def test_a_full_disk_ends_cleanly_once_there_is_room(make_server, roomy_disk):
    """Issue 62: a run hit by a full disk waits (its producer held, nothing dropped) and
    carries on the moment there is room again; the first write stored after the full disk
    (here, a submission) is what says so, not a pause of the run's own. The disk stays full
    past 30 s, the longest pause a run's retries once grew to: a Ticker run was still
    ``running`` long after the room came back."""
    server = make_server(home=roomy_disk / "home")
    count = 40_000
    ticker = server.submit(graph(node("t", "core.Ticker", count=count, interval=0.0001)))["run_id"]
    server.wait_status(ticker, "running")
    filler = _fill(roomy_disk)
    try:
        server.poll_until(lambda: "".join(server.output).count(FULL_LINE) >= 1, timeout=30)
        server.submit(hello(), expect=507)
        # Refused writes for 30 s and more: the second line of the store's warning.
        server.poll_until(lambda: "".join(server.output).count(FULL_LINE) >= 2, timeout=90)
        assert server.get(f"/api/runs/{ticker}")["status"] == "running"  # waiting for room, not ended
    finally:
        filler.unlink()
    # The very next submission is stored, and the waiting run carries on at once.
    assert server.submit(hello())["status"] == "queued"
    server.poll_until(lambda: server.get(f"/api/runs/{ticker}")["status"] != "running", timeout=15)
    assert server.get(f"/api/runs/{ticker}")["status"] == "succeeded"
    points = server.get(f"/api/runs/{ticker}/metrics")["series"]["tick"]
    assert [p["step"] for p in points] == list(range(1, count + 1))  # nothing dropped while it waited
    events = server.events_until_finished(ticker, timeout=60)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert server.submit(hello())["status"] == "queued"  # what it wrote left room, as it does on a roomy disk
    log = "".join(server.output)
    assert "Traceback" not in log and "while handling Checkpoint" not in log, log[-3000:]


@pytest.mark.timeout(120)
def test_a_busy_run_fits_on_a_disk_its_points_fit_on(make_server, roomy_disk):
    """The store's write-ahead log starts again from its beginning as a run writes: 40,000
    points (about 12 MB stored) fit on a 32 MB disk. The log used to grow by every commit
    of a busy run (1.6 GB for a database of 15 MB), filled this disk within a second and
    could never be copied back into the database: every later write was refused."""
    server = make_server(home=roomy_disk / "home")
    count = 40_000
    ticker = server.submit(graph(node("t", "core.Ticker", count=count, interval=0.0002)))["run_id"]
    server.poll_until(lambda: server.get(f"/api/runs/{ticker}")["status"] != "running", timeout=90)
    assert server.get(f"/api/runs/{ticker}")["status"] == "succeeded"
    assert len(server.get(f"/api/runs/{ticker}/metrics")["series"]["tick"]) == count
    assert server.submit(hello())["status"] == "queued"
    assert FULL_LINE not in "".join(server.output)
