"""Request shapes that once answered 500 or logged a traceback: a body that does not
decode under its Content-Encoding, a body cut short, a metrics Accept with a version that
is not a number, a static file name no file system takes, a query parameter given twice."""

from __future__ import annotations

import socket

import pytest

from tests.integration.test_hardening_functional import raw

pytestmark = pytest.mark.timeout(60)


def test_a_body_that_does_not_decode_under_its_content_encoding_is_a_400(shared_server):
    for encoding in ("gzip", "deflate"):
        status, text = raw(shared_server, "POST", "/api/runs", b'{"graph": {}}', {"Content-Encoding": encoding})
        assert status == 400 and '"code": "invalid_request"' in text and "could not be read" in text, text


def test_a_body_cut_short_by_its_sender_logs_no_traceback(make_server):
    server = make_server()
    host, port = server.url.removeprefix("http://").split(":")
    for path, auth in (("/api/runs", f"Authorization: Bearer {server.token}\r\n"), ("/api/login", "")):
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: application/json\r\n"
                     "Content-Length: 4000\r\n\r\n".encode() + b'{"graph":')
        sock.shutdown(socket.SHUT_WR)  # and goes away: the server closes its side
        assert sock.recv(100) == b""
        sock.close()
    assert raw(server, "GET", "/api/info")[0] == 200  # the handlers of both ran before this answer
    said = "".join(server.output)
    assert "Traceback" not in said and "Error handling request" not in said, said[-3000:]


def test_metrics_with_an_accept_version_that_is_not_a_number_answers_the_text_format(shared_server):
    for accept in ("application/openmetrics-text; version=abc", "text/plain; version=1.x"):
        status, text = raw(shared_server, "GET", "/metrics", headers={"Accept": accept})
        assert status == 200 and "# TYPE troupe_queue_depth" in text, (accept, status, text[:200])


def test_a_static_name_no_file_can_have_is_the_json_404_of_any_unknown_path(shared_server):
    for name in ("a" * 300, "a/" * 2100, "nope.js", "%FF", "..%2F..%2Fetc%2Fpasswd"):
        status, text = raw(shared_server, "GET", f"/static/{name}")
        assert status == 404 and '"code": "not_found"' in text, (name[:20], status, text[:200])
    status, text = raw(shared_server, "GET", "/static/app.js")
    assert status == 200 and "import" in text


def test_a_query_parameter_given_twice_is_refused_on_every_route_that_reads_one(shared_server):
    for path in ("/api/runs?status=succeeded&status=running", "/api/runs?q=a&q=b", "/api/runs?mine=true&mine=false",
                 "/api/queue-prediction?queue_key=cpu&queue_key=cuda:0", "/api/ids?prefix=00&prefix=ff"):
        status, text = raw(shared_server, "GET", path)
        assert status == 400 and "given 2 times" in text, (path, status, text[:200])
