"""The S3 backend (issue 16, point 1) against moto's S3 server over real HTTP: an upload
is put in the bucket and a worker run reads it from there; a worker run's checkpoints go
to the bucket and are listed with backend ``s3``; the control plane streams them back."""

from __future__ import annotations

import asyncio
import hashlib
import os

import pytest

from tests.helpers import graph, node
from tests.integration.test_artifacts_functional import trained_on
from tests.integration.test_uploads_functional import upload
from tests.integration.test_workers_functional import enroll, read_until, start_agent
from tests.s3_server import client, s3_server
from troupe.protocol.worker import S3Bucket
from troupe.subprocess_runner.s3 import MULTIPART_BYTES, get_file, put_file


def test_uploads_and_worker_artifacts_live_in_the_bucket(make_server, tmp_path):
    with s3_server() as s3:
        bucket = client(s3)
        server = make_server(TROUPE_WORKER_HEARTBEAT_S="1", **s3)
        rows = ("a,b,y\n" + "".join(f"{i},{i * 7},{i % 2}\n" for i in range(40))).encode()
        status, made = upload(server, rows)
        assert status == 201, made
        stored = bucket.head_object(Bucket="troupe-lab", Key=f"lab/files/{made['file_id']}")
        assert stored["ContentLength"] == len(rows) and stored["Metadata"]["sha256"] == made["sha256"]
        # The server's own copy is spoiled: a worker that fetched it from here would refuse it.
        (server.home / "files" / made["file_id"]).write_bytes(b"x" * len(rows))
        agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"])
        try:
            read_until(agent, "connected as gpu-a")
            reader = graph(node("csv", "torch.CSVDataset", path=made["ref"], target="y"))
            run_id = server.submit(reader, target={"worker": "gpu-a"}, provenance="content")["run_id"]
            assert server.events_until_finished(run_id, timeout=90)[-1]["payload"]["status"] == "succeeded"
            assert server.get(f"/api/runs/{run_id}/provenance")["records"][0]["sha256"] == made["sha256"]

            run_id, artifacts = trained_on(server, "gpu-a")
            assert {(a["backend"], a["label"]) for a in artifacts} == {("s3", "troupe-lab")}
            for artifact in artifacts:
                key = f"lab/artifacts/{run_id}/{artifact['path']}"
                body = bucket.get_object(Bucket="troupe-lab", Key=key)["Body"].read()
                assert hashlib.sha256(body).hexdigest() == artifact["sha256"]
            assert not (server.home / "runs" / run_id / "checkpoints").exists()  # never through here
            # The bucket gone: the artifact cannot be reached, which is not the same as removed.
            for listed in bucket.list_objects_v2(Bucket="troupe-lab").get("Contents", []):
                bucket.delete_object(Bucket="troupe-lab", Key=listed["Key"])
            bucket.delete_bucket(Bucket="troupe-lab")
            status, reply = server.client.request("GET", f"/api/runs/{run_id}/artifacts/{artifacts[0]['id']}")
            assert (status, reply["error"]["code"]) == (409, "artifact_unreachable"), reply
        finally:
            agent.terminate()
            agent.wait(30)


def test_a_large_file_goes_in_parts_and_a_mismatch_is_never_kept(tmp_path):
    with s3_server() as s3:
        where = S3Bucket(bucket="troupe-lab", prefix="lab/", endpoint_url=s3["TROUPE_S3_ENDPOINT_URL"],
                         region="us-east-1", access_key_id=s3["TROUPE_S3_ACCESS_KEY_ID"],
                         secret_access_key=s3["TROUPE_S3_SECRET_ACCESS_KEY"])
        source = tmp_path / "big.bin"
        source.write_bytes(os.urandom(2 * MULTIPART_BYTES + 12345))
        digest = hashlib.sha256(source.read_bytes()).hexdigest()
        asyncio.run(put_file(where, source, "lab/big.bin", digest))
        etag = client(s3).head_object(Bucket="troupe-lab", Key="lab/big.bin")["ETag"]
        assert etag.strip('"').endswith("-3")  # three parts
        back = tmp_path / "back.bin"
        assert asyncio.run(get_file(where, "lab/big.bin", back)) is True
        assert back.read_bytes() == source.read_bytes()
        assert asyncio.run(get_file(where, "lab/absent.bin", tmp_path / "absent.bin")) is False
        asyncio.run(put_file(where, source, "lab/lying.bin", "0" * 64))  # its recorded hash is wrong
        with pytest.raises(OSError, match="wrong content"):
            asyncio.run(get_file(where, "lab/lying.bin", tmp_path / "lying.bin"))
        assert sorted(p.name for p in tmp_path.iterdir()) == ["back.bin", "big.bin"]


def test_an_upload_the_bucket_refuses_leaves_nothing_a_run_could_read(make_server):
    with s3_server() as s3:
        server = make_server(**{**s3, "TROUPE_S3_BUCKET": "no-such-bucket"})
        status, refused = upload(server, b"a,b,y\n1,2,1\n")
        assert status == 503 and refused["error"]["code"] == "storage_unavailable", refused
        assert [p.name for p in (server.home / "files").iterdir()] == []  # not even a copy here
        file_id = hashlib.sha256(b"a,b,y\n1,2,1\n").hexdigest()[:32]
        assert server.client.request("GET", f"/api/files/{file_id}/content")[0] == 404
        reader = graph(node("csv", "torch.CSVDataset", path=f"upload:{file_id}", target="y"))
        assert server.submit(reader, expect=400)["error"]["code"] == "file_not_found"
