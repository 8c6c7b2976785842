"""Moving a large file: the transfer backend and the S3 backend against ``cp`` and a plain
aioboto3 upload, all on loopback, in one run.

1. ``cp`` of the file to another file on the same disk (the floor).
2. Transfer, worker -> control plane: a real ``troupe start``, a real agent executing a
   run, and the run's artifact sent the way its child sends it (``PUT
   /api/runs/{id}/artifacts``, hashed on both sides, renamed into place, its row written).
3. Transfer, control plane -> worker: the file uploaded (``POST /api/files``), then
   fetched into an empty cache the way a worker run fetches its uploads (sha256 checked).
4. S3 against moto's S3 server: troupe's put (multipart, 8 MiB parts, 4 at once) and a
   plain aioboto3 ``put_object`` of the whole file; troupe's get (checked against the
   object's sha256).

    .venv/bin/python bench/storage.py [--mb 200] [--repeat 3]
"""

# ruff: noqa: E402
from __future__ import annotations

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # the repository, not bench/, first

import argparse
import asyncio
import hashlib
import json
import logging
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable

from tests.helpers import Server, sleeper
from tests.integration.test_workers_functional import enroll, read_until, start_agent
from tests.s3_server import s3_server
from troupe.protocol.worker import S3Bucket
from troupe.subprocess_runner.artifacts import Destination, Shipper
from troupe.subprocess_runner.s3 import _client, get_file, put_file
from troupe.subprocess_runner.transfer import fetch_uploads


def timed(repeat: int, action: Callable[[int], None]) -> list[float]:
    times = []
    for attempt in range(repeat):
        started = time.perf_counter()
        action(attempt)
        times.append(time.perf_counter() - started)
    return times


def _upload(server: Server, path: Path) -> str:
    """POST /api/files with curl (streams the file from disk); returns the file id."""
    out = subprocess.run(["curl", "-sS", "-H", f"Authorization: Bearer {server.token}", "-F", f"file=@{path}",
                          f"{server.url}/api/files"], check=True, capture_output=True, text=True).stdout
    return str(json.loads(out)["file_id"])


def main() -> None:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's server logs every request
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="troupe-bench-storage-") as scratch:
        tmp = Path(scratch)
        source = tmp / "big.bin"
        with source.open("wb") as out:
            for _ in range(args.mb):
                out.write(os.urandom(1024 * 1024))
        sha256 = hashlib.sha256(source.read_bytes()).hexdigest()
        results["cp"] = timed(args.repeat, lambda i: shutil.copyfile(source, tmp / f"copy-{i}.bin"))
        for i in range(args.repeat):
            (tmp / f"copy-{i}.bin").unlink()

        server = Server(tmp / "home", TROUPE_WORKER_HEARTBEAT_S="2", TROUPE_UPLOAD_MAX_MB=str(args.mb * 2),
                        TROUPE_TRANSFER_MAX_MB=str(args.mb * 2)).start()
        agent = None
        try:
            agent = start_agent(server, tmp / "agent", enroll(server, name="bench")["command"])
            read_until(agent, "connected as bench")
            run_id = server.submit(sleeper(600), target={"worker": "bench"})["run_id"]
            server.wait_status(run_id, "running")
            run_dir = tmp / "run"
            (run_dir / "checkpoints").mkdir(parents=True)
            where = Destination("transfer", control_plane={"url": server.url, "credential": server.token})

            def send(i: int) -> None:
                placed = run_dir / "checkpoints" / f"model-{i}.pt"
                os.link(source, placed)
                shipper = Shipper(run_id, run_dir, where, lambda *event: None)
                shipper.submit(None, "checkpoint", placed)
                shipper.close()

            results["transfer worker -> control plane (PUT, hashed both sides)"] = timed(args.repeat, send)
            listed = server.get(f"/api/runs/{run_id}")["artifacts"]
            assert len(listed) == args.repeat and all(a["sha256"] == sha256 for a in listed), listed
            server.client.request("POST", f"/api/runs/{run_id}/cancel")
            file_id = _upload(server, source)

            def fetch(i: int) -> None:
                fetch_uploads({"nodes": [{"params": {"path": f"upload:{file_id}"}}]}, server.url, tmp / f"cache-{i}")
                shutil.rmtree(tmp / f"cache-{i}")

            results["transfer control plane -> worker (GET, sha256 checked)"] = timed(args.repeat, fetch)
        finally:
            if agent is not None:
                agent.terminate()
                agent.wait(30)
            server.stop()

        with s3_server("troupe-bench") as s3:
            bucket = S3Bucket(bucket="troupe-bench", endpoint_url=s3["TROUPE_S3_ENDPOINT_URL"], region="us-east-1",
                              access_key_id=s3["TROUPE_S3_ACCESS_KEY_ID"],
                              secret_access_key=s3["TROUPE_S3_SECRET_ACCESS_KEY"])

            async def plain(i: int) -> None:
                async with _client(bucket) as client:
                    with source.open("rb") as body:
                        await client.put_object(Bucket="troupe-bench", Key=f"plain-{i}", Body=body)

            results["S3 put, plain aioboto3 put_object"] = timed(args.repeat, lambda i: asyncio.run(plain(i)))
            results["S3 put, troupe (multipart, sha256 in metadata)"] = timed(
                args.repeat, lambda i: asyncio.run(put_file(bucket, source, f"troupe-{i}", sha256)))

            def get(i: int) -> None:
                assert asyncio.run(get_file(bucket, f"troupe-{i}", tmp / f"got-{i}.bin"))
                (tmp / f"got-{i}.bin").unlink()

            results["S3 get, troupe (sha256 checked)"] = timed(args.repeat, get)

    print(f"\n{args.mb} MiB file, {args.repeat} times each; MiB/s from the median\n")
    print("| path | median s | MiB/s | all s |\n| --- | --- | --- | --- |")
    for name, times in results.items():
        median = statistics.median(times)
        print(f"| {name} | {median:.2f} | {args.mb / median:.0f} | {', '.join(f'{t:.2f}' for t in times)} |")
    print(f"\nreproduce: .venv/bin/python bench/storage.py --mb {args.mb} --repeat {args.repeat}")


if __name__ == "__main__":
    main()
