"""A database damaged in the middle (a bad disk sector, a copy cut short): what touches
the damaged pages fails alone with 503 ``database_damaged``, and the server goes on
serving the rest, however often those pages are asked for (a restart of the store would
meet them again, and enough restarts would end the whole server)."""

from __future__ import annotations

import os

import apsw
import pytest

from tests.helpers import graph, node, sleeper

pytestmark = pytest.mark.timeout(120)


def _damage(db: str, table: str) -> None:
    """Random bytes over the middle leaf pages of ``table`` (past each page's header)."""
    conn = apsw.Connection(db)
    pages = [page for page, in conn.execute(
        "SELECT pageno FROM dbstat WHERE name = ? AND pagetype = 'leaf' ORDER BY pageno", (table,))]
    size = conn.execute("PRAGMA page_size").fetchall()[0][0]
    conn.close()
    with open(db, "r+b") as file:
        for page in pages[len(pages) // 2 - 2: len(pages) // 2 + 2]:
            file.seek((page - 1) * size + 8)
            file.write(os.urandom(size - 8))


def _unreadable(db: str, table: str, run_ids: list[str]) -> list[str]:
    conn = apsw.Connection(db)
    found = []
    for run_id in run_ids:
        try:
            list(conn.execute(f"SELECT * FROM {table} WHERE run_id = ?", (run_id,)))
        except apsw.Error:
            found.append(run_id)
    conn.close()
    return found


def test_a_damaged_page_fails_what_reads_it_and_the_server_serves_the_rest(make_server, tmp_path):
    home = tmp_path / "home"
    server = make_server(home=home)
    ids = [server.submit(graph(node("t", "core.Ticker", count=50, interval=0), name=f"t{i}"))["run_id"]
           for i in range(40)]
    for run_id in ids:
        server.wait_status(run_id, "succeeded", timeout=60)
    server.stop()
    server.start()  # a second life, as a user's server has had: its start has analysed the tables already
    server.stop()
    db = str(home / "troupe.db")
    _damage(db, "metrics")
    damaged = _unreadable(db, "metrics", ids)
    assert damaged, "no run's metrics sit on the damaged pages"
    server.start()
    running = server.submit(sleeper(30))["run_id"]
    server.wait_status(running, "running")
    for _ in range(8):  # more than the store's restarts the supervisor forgives
        status, reply = server.client.request("GET", f"/api/runs/{damaged[0]}/metrics")
        assert status == 503 and reply["error"]["code"] == "database_damaged", reply
    assert server.proc.poll() is None
    assert server.get(f"/api/runs/{running}")["status"] == "running"  # the rest still serves
    assert server.client.request("GET", "/api/queues")[0] == 200
    server.client.request("POST", f"/api/runs/{running}/cancel")
