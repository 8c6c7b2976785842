"""The transfer backend, run side: a worker's run child fetches the uploads its graph
reads (``upload:<file id>``) from the control plane, into a cache named by content.

A file's id is the head of its sha256, so what arrives is checked against it: a copy
that does not match (cut short, corrupted) is thrown away and fetched again, and never
used. Fetched files stay in the cache for the next run that reads them. With S3 on,
uploads are taken from the bucket instead, checked the same way."""

from __future__ import annotations

import asyncio
import functools
import http.client
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from troupe.protocol.graph import node_file_stem
from troupe.protocol.unix_http import connect
from troupe.protocol.worker import S3Bucket
from troupe.subprocess_runner.digest import CHUNK, pour

ATTEMPTS = 3


UPLOAD_ID = re.compile(r"[0-9a-f]{32}")  # what POST /api/files names an upload


def upload_ids(graph: Mapping[str, Any]) -> set[str]:
    """The uploads a graph reads (``upload:ID``); an id that is not one is a ValueError
    that says so in the words a missing upload gets, before any file is looked at (a
    name such as ``../../etc/passwd`` must never be a question about this machine)."""
    found = {str(value).split(":", 1)[1] for node in graph.get("nodes", [])
             if isinstance(value := (node.get("params") or {}).get("path"), str) and value.startswith("upload:")}
    for file_id in sorted(found):
        if not UPLOAD_ID.fullmatch(file_id):
            raise ValueError(f"no uploaded file {file_id[:80]!r} (GET /api/files lists them)")
    return found


def fetch_uploads(graph: Mapping[str, Any], url: str, cache: Path, unix_socket: str | None = None,
                  bucket: S3Bucket | None = None, credential: str = "", ca: str | None = None) -> Path:
    """Makes every upload the graph reads present in ``cache`` (checked); returns it.
    With a bucket, an upload is taken from there when it is in it (uploaded while S3
    was on), else from the control plane. ``credential``: the worker's, which a control
    plane shared over a network asks of every read; ``ca``: the authority of a
    self-signed control plane's certificate."""
    cache.mkdir(parents=True, exist_ok=True)
    for file_id in sorted(upload_ids(graph)):
        if (cache / file_id).is_file():
            continue
        if bucket is not None:
            from troupe.subprocess_runner.s3 import get_file, upload_key

            if asyncio.run(get_file(bucket, upload_key(bucket, file_id), cache / file_id, file_id)):
                continue
        fetch_checked(f"/api/files/{file_id}/content", cache / file_id, functools.partial(_named_by, file_id),
                      url, unix_socket, f"upload {file_id}", credential, ca)
    return cache


def _named_by(file_id: str, sha256: str) -> bool:
    return sha256[:32] == file_id


def fetch_checked(path: str, target: Path, fits: Callable[[str], bool], url: str, unix_socket: str | None,
                  what: str, credential: str = "", ca: str | None = None) -> None:
    """GETs ``path`` from the control plane into ``target``, kept only when its sha256
    ``fits``; a cut or a wrong copy is tried again."""
    problem = ""
    for _ in range(ATTEMPTS):
        conn = connect(url, unix_socket, 60.0, ca)
        handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=".fetch-")
        try:
            conn.request("GET", path, headers={"Authorization": f"Bearer {credential}"} if credential else {})
            response = conn.getresponse()
            if response.status != 200:
                raise FileNotFoundError(f"the control plane answered {response.status} for {what}")
            with os.fdopen(handle, "wb") as out:
                _, sha256 = pour(iter(functools.partial(response.read, CHUNK), b""), out)
            if fits(sha256):
                os.replace(temporary, target)
                return
            problem = f"{what} arrived with the wrong content (sha256 {sha256[:16]}...)"
        except (OSError, http.client.HTTPException) as exc:
            problem = f"{what} could not be fetched: {exc}"
        finally:
            conn.close()
            Path(temporary).unlink(missing_ok=True)
    raise OSError(f"{problem} ({ATTEMPTS} attempts)")


def fetch_resume(resume: Mapping[str, Mapping[str, Any]], url: str, folder: Path,
                 unix_socket: str | None = None, credential: str = "",
                 ca: str | None = None) -> dict[str, dict[str, str]]:
    """A resumed worker run's checkpoints, fetched into ``folder`` and checked: node id ->
    {"weights", "state"} paths, as the TrainingLoop reads them."""
    folder.mkdir(parents=True, exist_ok=True)
    found: dict[str, dict[str, str]] = {}
    for node_id, files in resume.items():
        paths = {}
        for part in ("weights", "state"):
            target = folder / f"{node_file_stem(node_id)}-{part}.pt"
            expected = str(files[f"{part}_sha256"])
            fetch_checked(str(files[part]), target, expected.__eq__, url, unix_socket,
                          f"the {part} of {node_id}'s checkpoint (epoch {files['epoch']})", credential, ca)
            paths[part], paths[f"{part}_sha256"] = str(target), expected
        found[node_id] = paths
    return found
