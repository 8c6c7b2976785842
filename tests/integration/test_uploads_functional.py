"""Uploads (issue 16, point 1): a file posted to ``/api/files`` is read by runs in this
server as ``upload:<file id>``; the same content is one file; a file a live run reads is
not deleted from under it."""

from __future__ import annotations

import concurrent.futures
import hashlib
import http.client
import json
import resource
import socket
import urllib.parse

from tests.helpers import graph, node
from tests.integration.test_workers_functional import enroll, read_until, start_agent

ROWS = ("a,b,y\n" + "".join(f"{i},{i * 5},{i % 2}\n" for i in range(30))).encode()


def upload(server, content: bytes, name: str = "train.csv", token: bool = True) -> tuple[int, dict]:
    boundary = "troupe-test-boundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n"
            "Content-Type: text/csv\r\n\r\n").encode() + content + f"\r\n--{boundary}--\r\n".encode()
    parsed = urllib.parse.urlsplit(server.url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    if token:
        headers["Authorization"] = f"Bearer {server.token}"
    conn.request("POST", "/api/files", body=body, headers=headers)
    response = conn.getresponse()
    reply = json.loads(response.read())
    conn.close()
    return response.status, reply


def test_an_upload_is_read_by_a_run_here_and_kept_while_a_run_reads_it(make_server):
    server = make_server(TROUPE_UPLOAD_MAX_MB="1")
    status, made = upload(server, ROWS)
    assert status == 201 and made["sha256"] == hashlib.sha256(ROWS).hexdigest() and made["size"] == len(ROWS)
    assert made["ref"] == f"upload:{made['file_id']}" and made["file_id"] == made["sha256"][:32]
    assert upload(server, ROWS, "again.csv")[1]["file_id"] == made["file_id"]  # one content, one file
    reader = graph(node("csv", "torch.CSVDataset", path=made["ref"], target="y"))
    run_id = server.submit(reader, provenance="content")["run_id"]
    assert server.events_until_finished(run_id, timeout=90)[-1]["payload"]["status"] == "succeeded"
    assert server.get(f"/api/runs/{run_id}/provenance")["records"][0]["sha256"] == made["sha256"]
    slow = graph(node("z", "core.Sleep", seconds=60), node("csv", "torch.CSVDataset", path=made["ref"], target="y"))
    busy = server.submit(slow)["run_id"]
    server.wait_status(busy, "running")
    status, reply = server.client.request("DELETE", f"/api/files/{made['file_id']}")
    assert (status, reply["error"]["code"]) == (409, "file_in_use") and busy in reply["error"]["message"]
    server.client.request("POST", f"/api/runs/{busy}/cancel")
    server.events_until_finished(busy)
    assert server.client.request("DELETE", f"/api/files/{made['file_id']}")[0] == 200
    assert server.get("/api/files")["files"] == []
    gone = server.submit(reader, expect=400)["error"]
    assert gone["code"] == "file_not_found"


def test_refusals_too_large_no_token_and_over_the_transfer_limit(make_server):
    server = make_server(TROUPE_UPLOAD_MAX_MB="1", TROUPE_TRANSFER_MAX_MB="0")
    status, reply = upload(server, b"x" * (1024 * 1024 + 1))
    assert (status, reply["error"]["code"]) == (413, "payload_too_large")
    assert server.get("/api/files")["files"] == []  # nothing half-written is listed
    assert upload(server, ROWS, token=False)[0] == 401
    made = upload(server, ROWS)[1]
    reader = graph(node("csv", "torch.CSVDataset", path=made["ref"], target="y"))
    error = server.submit(reader, expect=400, target={"worker": "any"})["error"]
    assert error["code"] == "upload_too_large" and "TROUPE_TRANSFER_MAX_MB" in error["message"]
    status, reply = server.client.request("POST", "/api/files", {"file": "not multipart"})
    assert status == 400 and reply["error"]["code"] == "invalid_request"


def test_a_worker_run_fetches_the_upload_it_reads_and_checks_it(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    made = upload(server, ROWS)[1]
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"])
    try:
        read_until(agent, "connected as gpu-a")
        reader = graph(node("csv", "torch.CSVDataset", path=made["ref"], target="y"))
        run_id = server.submit(reader, provenance="content", target={"worker": "gpu-a"})["run_id"]
        assert server.events_until_finished(run_id, timeout=90)[-1]["payload"]["status"] == "succeeded"
        (record,) = server.get(f"/api/runs/{run_id}/provenance")["records"]
        assert record["sha256"] == made["sha256"] and record["ref"] != made["ref"]  # read from the worker's cache
    finally:
        agent.terminate()
        agent.wait(30)


def _post(server, content_type: str, body: bytes) -> tuple[int, dict]:
    parsed = urllib.parse.urlsplit(server.url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    conn.request("POST", "/api/files", body=body, headers={"Content-Type": content_type,
                                                          "Authorization": f"Bearer {server.token}"})
    response = conn.getresponse()
    reply = json.loads(response.read())
    conn.close()
    return response.status, reply


def test_a_form_that_is_not_well_formed_is_a_400_and_keeps_nothing(shared_server):
    head = b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.csv"\r\n\r\nrows'
    for content_type, body in [
            ("multipart/form-data", head + b"\r\n--b--\r\n"),  # no boundary named
            ("multipart/form-data; boundary=" + "b" * 71, head + b"\r\n--b--\r\n"),  # longer than 70
            ("multipart/", head + b"\r\n--b--\r\n"),
            ("multipart/form-data; boundary=b", b""),
            ("multipart/form-data; boundary=other", head + b"\r\n--b--\r\n"),  # not the boundary it names
            ("multipart/form-data; boundary=b", head),  # the file never ends
            ("multipart/form-data; boundary=b", head + b"\r\n--b\r\nContent-Disposition: form-data; name=\"file\"; "
                                                b"filename=\"b.csv\"\r\n\r\nmore\r\n--b--\r\n")]:  # two files
        status, reply = _post(shared_server, content_type, body)
        assert status == 400 and reply["error"]["code"] == "invalid_request", (content_type, body[-30:], reply)
    assert shared_server.get("/api/files")["files"] == []


def test_an_upload_and_a_delete_of_the_same_file_at_once_never_leave_a_row_without_its_bytes(shared_server):
    content = b"a,y\n1,0\n"
    file_id = hashlib.sha256(content).hexdigest()[:32]
    parsed = urllib.parse.urlsplit(shared_server.url)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for _ in range(100):
            uploaded = pool.submit(upload, shared_server, content)
            deleted = pool.submit(shared_server.client.request, "DELETE", f"/api/files/{file_id}")
            status, reply = uploaded.result()
            assert status in (201, 409), reply  # 409 upload_deleted: its bytes went with the delete
            deleted.result()
            listed = [f["id"] for f in shared_server.get("/api/files")["files"]]
            conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
            conn.request("GET", f"/api/files/{file_id}/content",
                         headers={"Authorization": f"Bearer {shared_server.token}"})
            content_status = conn.getresponse().status
            conn.close()
            assert (file_id in listed) == (content_status == 200), (listed, content_status)


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (4 * 1024 * 1024, 4 * 1024 * 1024))


def test_a_file_past_what_the_server_may_write_is_refused_and_the_server_goes_on(make_server):
    server = make_server(preexec=_limit_file_size)  # a file system's largest file, as ulimit -f gives it
    status, reply = upload(server, b"x" * (5 * 1024 * 1024))
    assert (status, reply["error"]["code"]) == (413, "payload_too_large"), reply
    kept = upload(server, ROWS)
    assert kept[0] == 201, kept
    assert [f["id"] for f in server.get("/api/files")["files"]] == [kept[1]["file_id"]]


def test_an_upload_cut_short_is_the_senders_request_not_a_fault_of_the_server(make_server):
    server = make_server()
    start = (b"--cut\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.csv\"\r\n\r\n" + b"A" * 50000)
    parsed = urllib.parse.urlsplit(server.url)
    for _ in range(3):  # a sender gone in the middle of its file, again and again
        with socket.create_connection((parsed.hostname, parsed.port), timeout=30) as sock:
            sock.sendall((f"POST /api/files HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {server.token}\r\n"
                          "Content-Type: multipart/form-data; boundary=cut\r\nContent-Length: 200000\r\n"
                          "Connection: close\r\n\r\n").encode() + start)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):  # its answer, then the close
                pass
    assert server.get("/api/files")["files"] == [] and list((server.home / "files").iterdir()) == []
    server.stop()
    assert "Traceback" not in "".join(server.output), "".join(server.output)[-3000:]
