"""The S3 / MinIO backend through aioboto3: put a file (multipart past
``MULTIPART_BYTES``, parts sent side by side), get one into a file, or stream one.

Keys: ``<prefix>files/<file id>`` for uploads, ``<prefix>artifacts/<run id>/<path>`` for
artifacts. An object is whole or absent: S3 makes a multipart upload visible only once
every part arrived, so a put that was cut short leaves nothing under the key. Each
object carries its sha256 in its metadata; a get checks what arrived against it.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from troupe.protocol.worker import S3Bucket
from troupe.subprocess_runner.digest import CHUNK

MULTIPART_BYTES = 8 * 1024 * 1024
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0  # a read that waits this long for a byte fails (and is tried again, 3 tries in all)


def upload_key(bucket: S3Bucket, file_id: str) -> str:
    return f"{bucket.prefix}files/{file_id}"


def artifact_key(bucket: S3Bucket, run_id: str, path: str) -> str:
    return f"{bucket.prefix}artifacts/{run_id}/{path}"


def _client(bucket: S3Bucket) -> Any:
    import aioboto3  # only where S3 is used: the package is heavy to import
    from botocore.config import Config

    # A bucket that accepts the connection and never answers is a refusal after a minute,
    # not a request held for ever.
    return aioboto3.Session().client(
        "s3", endpoint_url=bucket.endpoint_url, region_name=bucket.region,
        aws_access_key_id=bucket.access_key_id, aws_secret_access_key=bucket.secret_access_key,
        config=Config(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S,
                      retries={"max_attempts": 3, "mode": "standard"}))


def _transfer_config() -> Any:
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(multipart_threshold=MULTIPART_BYTES, multipart_chunksize=MULTIPART_BYTES,
                          max_concurrency=4)


async def put_file(bucket: S3Bucket, path: Path, key: str, sha256: str) -> None:
    async with _client(bucket) as s3:
        await s3.upload_file(str(path), bucket.bucket, key, Config=_transfer_config(),
                             ExtraArgs={"Metadata": {"sha256": sha256}})


async def delete_key(bucket: S3Bucket, key: str) -> None:
    """Removes the object (S3 answers a delete of a missing key with success too)."""
    async with _client(bucket) as s3:
        await s3.delete_object(Bucket=bucket.bucket, Key=key)


async def get_file(bucket: S3Bucket, key: str, dest: Path, sha256_head: str | None = None) -> bool:
    """Fetches ``key`` into ``dest`` (whole, by a rename); False when there is no such
    object. What arrived is hashed as it streams in and must match the object's recorded
    sha256 (and start with ``sha256_head`` when given), else ``OSError`` and nothing is
    left at ``dest``."""
    from botocore.exceptions import ClientError

    handle, temporary = tempfile.mkstemp(dir=dest.parent, prefix=".s3-")
    try:
        digest = hashlib.sha256()
        with os.fdopen(handle, "wb") as out:
            async with _client(bucket) as s3:
                try:
                    found = await s3.get_object(Bucket=bucket.bucket, Key=key)
                except ClientError as exc:
                    if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                        return False
                    raise
                body = found["Body"]
                try:
                    while chunk := await body.read(CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                finally:
                    body.close()
        got, expected = digest.hexdigest(), (found.get("Metadata") or {}).get("sha256")
        if (expected and got != expected) or (sha256_head and not got.startswith(sha256_head)):
            raise OSError(f"s3://{bucket.bucket}/{key} arrived with the wrong content (sha256 {got[:16]}...)")
        os.replace(temporary, dest)
        return True
    finally:
        Path(temporary).unlink(missing_ok=True)


async def stream(bucket: S3Bucket, key: str) -> AsyncIterator[bytes]:
    """The object's bytes, a chunk at a time (the client lives as long as the stream)."""
    async with _client(bucket) as s3:
        found = await s3.get_object(Bucket=bucket.bucket, Key=key)
        body = found["Body"]
        try:
            while chunk := await body.read(CHUNK):
                yield chunk
        finally:
            body.close()
