"""Whose an uploaded file is (issue 62): each file records who uploaded it, and a class
session deletes only its own uploads; the teacher's dataset and another student's file
are 403 ``not_your_file`` and stay, with the runs that read them. The teacher deletes
any. A file stored before uploaders were recorded is the teacher's. Through the real
server, as the page and the terminal send an upload (multipart, a bearer token)."""

from __future__ import annotations

import http.client
import json
import urllib.parse

import apsw
import pytest

from tests.helpers import Server, graph, node
from troupe.cli.client import Client

pytestmark = pytest.mark.timeout(180)
DATASET = ("a,b,y\n" + "".join(f"{i},{i * 5},{i % 2}\n" for i in range(30))).encode()


def upload(server: Server, token: str, content: bytes, name: str) -> dict:
    boundary = "troupe-test-boundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n"
            "Content-Type: text/csv\r\n\r\n").encode() + content + f"\r\n--{boundary}--\r\n".encode()
    parsed = urllib.parse.urlsplit(server.url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    conn.request("POST", "/api/files", body=body, headers={
        "Content-Type": f"multipart/form-data; boundary={boundary}", "Authorization": f"Bearer {token}"})
    response = conn.getresponse()
    reply = json.loads(response.read())
    conn.close()
    assert response.status == 201, reply
    return dict(reply)


def refused(reply: tuple[int, dict]) -> str:
    status, body = reply
    assert status == 403 and body["error"]["code"] == "not_your_file", reply
    return str(body["error"]["message"])


def listed(server: Server) -> dict[str, dict]:
    return {f["id"]: f for f in server.get("/api/files")["files"]}


def named(who: Client, name: str) -> str:
    status, reply = who.request("PUT", "/api/sessions/me", {"name": name})
    assert status == 200, reply
    return str(reply["id"])


def test_a_class_session_deletes_its_own_uploads_only_and_the_teacher_anyones(make_server):
    server = make_server()
    ann, bob = server.session(uses=1), server.session(uses=1)
    ann_id, bob_id = named(ann, "Ann"), named(bob, "Bob")
    demo = upload(server, server.token, DATASET, "digits.csv")
    anns = upload(server, str(ann.token), b"x\n1\n", "mine.csv")
    bobs = upload(server, str(bob.token), b"x\n2\n", "bobs.csv")
    assert (demo["uploaded_by"], anns["uploaded_by"], bobs["uploaded_by"]) == ("server", ann_id, bob_id)
    assert {i: f["uploaded_by"] for i, f in listed(server).items()} == {
        demo["file_id"]: "server", anns["file_id"]: ann_id, bobs["file_id"]: bob_id}

    # Ann may not delete the teacher's dataset nor Bob's file: 403, both still there.
    message = refused(ann.request("DELETE", f"/api/files/{demo['file_id']}"))
    assert f"file {demo['file_id']} (digits.csv) is the teacher's (uploaded with the server's token)" in message
    assert "only the files it uploaded itself; only the teacher may delete it" in message, message
    assert "only Bob and the teacher may delete it" in refused(ann.request("DELETE", f"/api/files/{bobs['file_id']}"))
    assert set(listed(server)) == {demo["file_id"], anns["file_id"], bobs["file_id"]}
    assert server.download(f"/api/files/{demo['file_id']}/content") == DATASET
    # Uploading the same bytes again does not make the teacher's file hers (nor rename it).
    again = upload(server, str(ann.token), DATASET, "stolen.csv")
    assert (again["file_id"], again["uploaded_by"], again["name"]) == (demo["file_id"], "server", "digits.csv")
    refused(ann.request("DELETE", f"/api/files/{demo['file_id']}"))
    # The runs that read the teacher's file still run.
    reader = server.submit(graph(node("csv", "torch.CSVDataset", path=demo["ref"], target="y")))["run_id"]
    assert server.events_until_finished(reader, timeout=90)[-1]["payload"]["status"] == "succeeded"

    # Her own: deleted.
    assert ann.request("DELETE", f"/api/files/{anns['file_id']}") == (
        200, {"file_id": anns["file_id"], "deleted": True})
    assert anns["file_id"] not in listed(server)
    # The teacher's upload of a student's bytes makes the file the teacher's: Bob may no longer delete it.
    assert upload(server, server.token, b"x\n2\n", "bobs.csv")["uploaded_by"] == "server"
    refused(bob.request("DELETE", f"/api/files/{bobs['file_id']}"))
    # The teacher (the token, or a teacher's session) deletes anyone's.
    bobs_other = upload(server, str(bob.token), b"x\n3\n", "other.csv")
    assert server.session().request("DELETE", f"/api/files/{bobs_other['file_id']}")[0] == 200
    assert server.client.request("DELETE", f"/api/files/{bobs['file_id']}")[0] == 200
    assert server.client.request("DELETE", f"/api/files/{demo['file_id']}")[0] == 200
    assert listed(server) == {}


def test_a_file_stored_before_uploaders_were_recorded_is_the_teachers(make_server, tmp_path):
    home = tmp_path / "home"
    server = make_server(home)
    ann = server.session(uses=1)
    older = upload(server, str(ann.token), b"x\n1\n", "older.csv")
    mine = upload(server, str(ann.token), b"x\n2\n", "mine.csv")
    server.stop()
    conn = apsw.Connection(str(home / "troupe.db"))  # as a troupe from before the column stored it
    conn.execute("UPDATE files SET uploaded_by = NULL WHERE id = ?", (older["file_id"],))
    conn.close()
    server = make_server(home)  # her session outlives the restart
    ann = Client(server.url, ann.token)
    assert listed(server)[older["file_id"]]["uploaded_by"] is None
    message = refused(ann.request("DELETE", f"/api/files/{older['file_id']}"))
    assert "is the teacher's (it was stored without a record of who uploaded it)" in message, message
    assert ann.request("DELETE", f"/api/files/{mine['file_id']}")[0] == 200
    assert server.client.request("DELETE", f"/api/files/{older['file_id']}")[0] == 200
