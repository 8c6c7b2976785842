"""moto's S3 server on a free loopback port (RECIPES), a real HTTP S3 API for the S3
backend's tests: ``start_s3()`` returns its settings, or skips with the reason."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

ACCESS = {"TROUPE_S3_ACCESS_KEY_ID": "troupe-test", "TROUPE_S3_SECRET_ACCESS_KEY": "troupe-test-secret",
          "TROUPE_S3_REGION": "us-east-1"}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def s3_server(bucket: str = "troupe-lab") -> Iterator[dict[str, str]]:
    """The ``TROUPE_S3_*`` settings of a fresh bucket on a moto server of its own."""
    try:
        import boto3  # noqa: F401  (the tests' own client)
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        pytest.skip(f"moto's S3 server is not installed ({exc}); `make test` installs moto[server]")
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        settings = {"TROUPE_S3_ENABLED": "1", "TROUPE_S3_ENDPOINT_URL": f"http://127.0.0.1:{port}",
                    "TROUPE_S3_BUCKET": bucket, "TROUPE_S3_PREFIX": "lab", **ACCESS}
        client(settings).create_bucket(Bucket=bucket)
        yield settings
    finally:
        server.stop()


def client(settings: dict[str, str]) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=settings["TROUPE_S3_ENDPOINT_URL"],
                        aws_access_key_id=ACCESS["TROUPE_S3_ACCESS_KEY_ID"],
                        aws_secret_access_key=ACCESS["TROUPE_S3_SECRET_ACCESS_KEY"], region_name="us-east-1")
