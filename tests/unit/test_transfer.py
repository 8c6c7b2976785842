"""The transfer backend's fetch: a copy that does not match its id is thrown away and
fetched again, and never used."""

from __future__ import annotations

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from troupe.subprocess_runner.transfer import ATTEMPTS, fetch_uploads

CONTENT = b"a,b,y\n1,2,0\n"
FILE_ID = hashlib.sha256(CONTENT).hexdigest()[:32]


def serve(answers: list[bytes]) -> tuple[ThreadingHTTPServer, list[str]]:
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            body = answers[min(len(asked) - 1, len(answers) - 1)]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, asked


def graph_reading(file_id: str) -> dict:
    return {"nodes": [{"id": "csv", "type": "torch.CSVDataset", "params": {"path": f"upload:{file_id}"}}]}


def test_a_corrupted_copy_is_fetched_again_and_the_good_one_kept(tmp_path):
    server, asked = serve([b"a,b,y\n1,2,X\n", CONTENT])
    try:
        cache = fetch_uploads(graph_reading(FILE_ID), f"http://127.0.0.1:{server.server_port}", tmp_path)
    finally:
        server.shutdown()
    assert (cache / FILE_ID).read_bytes() == CONTENT and asked == [f"/api/files/{FILE_ID}/content"] * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [FILE_ID]  # no partial copy left behind
    fetch_uploads(graph_reading(FILE_ID), "http://127.0.0.1:1", tmp_path)  # cached: nothing is asked


def test_a_copy_that_never_matches_is_never_used(tmp_path):
    server, asked = serve([b"wrong"])
    try:
        with pytest.raises(OSError, match="wrong content"):
            fetch_uploads(graph_reading(FILE_ID), f"http://127.0.0.1:{server.server_port}", tmp_path)
    finally:
        server.shutdown()
    assert len(asked) == ATTEMPTS and list(tmp_path.iterdir()) == []
