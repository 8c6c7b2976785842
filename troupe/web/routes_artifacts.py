"""``/api/runs/{id}/artifacts``: a worker sends a run's artifact here (transfer backend),
and anyone reads one wherever it lives.

The PUT is the worker's: its credential (or, from this machine, the session token)
names the worker the run executes on. The bytes go to a temporary file in the run's
folder, hashed on the way; only when all of them arrived and the hash is the one the
worker announced is the file renamed into place and its row written (by the run's
actor, which also logs the ``artifact`` event). Anything less leaves no file and no row.
"""

from __future__ import annotations

import errno
import hmac
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from aiohttp import web

from troupe.actors.errors import (
    ArtifactNotFound,
    ArtifactRefused,
    ArtifactUnreachable,
    RunNotFound,
)
from troupe.actors.placer.book import INSTANCE_MARK
from troupe.actors.run_messages import ArtifactArrived
from troupe.actors.store.artifacts import FAILED, REMOVED, GetArtifact, RecordArtifact, RecordLateArtifact
from troupe.actors.store.runs import GetRun
from troupe.protocol import events as ev
from troupe.protocol.errors import InvalidRequest, PayloadTooLarge, StateConflict, Unauthorized
from troupe.subprocess_runner.artifacts import FAILED_HEADER, MOUNT_FOLDER, SHA256_HEADER
from troupe.subprocess_runner.digest import CHUNK, pour_async
from troupe.web.context import Services, services
from troupe.web.errors import disk_full, json_reply, too_large_a_file
from troupe.web.limits import paced
from troupe.web.requests import one_query, run_id_from
from troupe.web.ws_worker import LOOPBACK, credential_owner

routes = web.RouteTableDef()
_SHA256 = re.compile(r"[0-9a-f]{64}")


@routes.put("/api/runs/{run_id}/artifacts")
async def receive_artifact(request: web.Request) -> web.Response:
    svc = services(request)
    run_id = run_id_from(request)
    if FAILED_HEADER in request.headers:
        return await _given_up(svc, request, run_id)
    path, sha256, size = _announced(request, svc.settings.upload_max_mb)
    row = await svc.store.read(GetRun(run_id))
    if row is None:
        raise RunNotFound(f"no run {run_id}")
    worker = row.get("worker")
    await _authorize(svc, request, worker)
    if worker is None:
        raise StateConflict(f"run {run_id} did not execute on a worker; only a worker sends its run's artifacts",
                            code="run_not_executing")
    # A run still held takes it through its actor; one that ended (the file waited in its
    # worker's outbox while the control plane was away) is written here.
    run = svc.registry.lookup(f"runs/{run_id}") if row["status"] in (ev.RUNNING, ev.DISCONNECTED) else None
    final = _placed(svc.settings.home / "runs" / run_id, path)
    # Not named after the file: a name near 255 bytes, with a prefix and a suffix, would
    # be too long for the file system, and the worker would be told 500 forever.
    handle, temporary = tempfile.mkstemp(dir=final.parent, prefix=".arriving-")
    try:
        with os.fdopen(handle, "wb") as out:
            try:
                received, got = await pour_async(
                    paced(request.content.iter_chunked(CHUNK), svc.settings.request_read_timeout_s), out, size)
            except (OSError, ValueError, web.HTTPException) as exc:  # the sender went away mid-file
                if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise disk_full(exc) from exc
                if isinstance(exc, OSError) and exc.errno == errno.EFBIG:
                    raise too_large_a_file(exc) from exc
                raise ArtifactRefused(f"the transfer of {path} was cut short: {exc}") from exc
        if received != size or got != sha256:
            raise ArtifactRefused(f"{path}: {received} of {size} bytes arrived, sha256 {got[:16]}... "
                                  f"(announced {sha256[:16]}...); nothing was kept", pointer=f"/{SHA256_HEADER}")
        try:
            os.replace(temporary, final)
        except (IsADirectoryError, NotADirectoryError):  # another file of the run made a folder of it meanwhile
            raise ArtifactRefused(f"{path}: a folder of that name is in the run's folder", pointer="?path",
                                  code="artifact_path_conflict") from None
        except FileNotFoundError:  # retention pruned the run, and its folder, while the file arrived
            raise RunNotFound(f"no run {run_id} (it was pruned while its file {path} arrived)") from None
    finally:
        Path(temporary).unlink(missing_ok=True)
    node, kind = one_query(request, "node") or None, one_query(request, "kind") or "file"
    try:
        written = await run.ask(ArtifactArrived(worker, node, kind, path, size, sha256)) if run is not None else None
        if written is None:  # no actor holds the run (any more): the store writes row and event
            await svc.store.write(RecordLateArtifact(RecordArtifact(run_id, node, kind, path, "transfer", None, size,
                                                                    sha256)))
        else:
            await written
    except BaseException:
        final.unlink(missing_ok=True)  # no row: no file either, nor the folders made for it
        _remove_empty(final.parent, svc.settings.home / "runs")
        raise
    return json_reply({"run_id": run_id, "path": path, "size": size, "sha256": sha256}, status=201)


async def _given_up(svc: Services, request: web.Request, run_id: str) -> web.Response:
    """The worker gave up on a file of the run (refused for good, or refused each time
    it was sent): its row says ``failed`` with the reason, not ``pending`` for ever."""
    path = one_query(request, "path", "")
    problem = ev.outside_run_dir(path)
    if problem is not None:
        raise InvalidRequest(problem, pointer="?path")
    row = await svc.store.read(GetRun(run_id))
    if row is None:
        raise RunNotFound(f"no run {run_id}")
    await _authorize(svc, request, row.get("worker"))
    if row.get("worker") is None:
        raise StateConflict(f"run {run_id} did not execute on a worker; only a worker gives up on its run's files",
                            code="run_not_executing")
    # A header is any bytes; aiohttp keeps those that are not UTF-8 as lone surrogates.
    reason = request.headers[FAILED_HEADER][:500].encode("utf-8", "replace").decode() or "the worker gave up on it"
    node, kind = one_query(request, "node") or None, one_query(request, "kind") or "file"
    await svc.store.write(RecordArtifact(run_id, node, kind, path, "transfer", None, None, None, FAILED, reason))
    return json_reply({"run_id": run_id, "path": path, "state": FAILED, "reason": reason})


def _remove_empty(folder: Path, runs: Path) -> None:
    """``folder`` and the folders above it, up to the run's own, while they are empty (a
    deleted run keeps the files it had: only what this transfer made goes)."""
    while folder != runs and runs in folder.parents:
        try:
            folder.rmdir()
        except OSError:  # not empty, or gone
            return
        folder = folder.parent


def _placed(folder: Path, path: str) -> Path:
    """Where an artifact goes: under the run's folder through real folders only, never
    through a link or a file of that name, and never onto a folder or a link."""
    here = folder
    here.mkdir(parents=True, exist_ok=True)
    *parents, name = path.split("/")
    for part in parents:
        here = here / part
        if here.is_symlink() or (here.exists() and not here.is_dir()):
            raise ArtifactRefused(f"{path}: {part!r} is a file or a link in the run's folder, not a folder",
                                  pointer="?path", code="artifact_path_conflict")
        here.mkdir(exist_ok=True)
    final = here / name
    if final.is_symlink() or final.is_dir():
        raise ArtifactRefused(f"{path}: a folder or a link of that name is in the run's folder",
                              pointer="?path", code="artifact_path_conflict")
    return final


def _announced(request: web.Request, max_mb: int) -> tuple[str, str, int]:
    path = one_query(request, "path", "")
    problem = ev.outside_run_dir(path)
    if problem is not None:
        raise InvalidRequest(problem, pointer="?path")
    sha256 = request.headers.get(SHA256_HEADER, "")
    if not _SHA256.fullmatch(sha256):
        raise InvalidRequest(f"the {SHA256_HEADER} header must carry the file's sha256 (64 lowercase hex digits)",
                             pointer=f"/{SHA256_HEADER}")
    size = request.content_length
    if size is None:
        raise InvalidRequest("send the artifact with a Content-Length", pointer="/Content-Length")
    if size > max_mb * 1024 * 1024:
        raise PayloadTooLarge(f"the artifact is over {max_mb} MB (TROUPE_UPLOAD_MAX_MB)")
    return path, sha256, size


async def _authorize(svc: Services, request: web.Request, worker: str | None) -> None:
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret:
        raise Unauthorized("an artifact is sent by the run's worker, with its credential")
    given = secret.encode("utf-8", "surrogateescape")
    if hmac.compare_digest(given, svc.token.encode()) and (request.remote or "") in LOOPBACK:
        return  # an agent on this machine uses the session token
    owner, reason = await credential_owner(svc, secret)
    if owner is None:
        raise Unauthorized(reason)
    if worker is None or owner != worker.split(INSTANCE_MARK)[0]:
        raise Unauthorized(f"worker {owner} does not execute this run")


@routes.get("/api/runs/{run_id}/artifacts/{artifact_id}")
async def read_artifact(request: web.Request) -> web.StreamResponse:
    svc = services(request)
    run_id = run_id_from(request)
    raw = request.match_info["artifact_id"]
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise ArtifactNotFound(f"{raw[:40]!r} is not an artifact id (a number from the run's artifacts)")
    found = await svc.store.read(GetArtifact(run_id, int(raw)))
    if found is None:
        raise ArtifactNotFound(f"run {run_id} has no artifact {raw}")
    if found.get("state") == REMOVED:
        raise ArtifactNotFound(f"artifact {raw} of run {run_id} was let go (past its node's keep_checkpoints)",
                               code="artifact_removed")
    name = Path(found["path"]).name
    headers = {"Content-Disposition": f'attachment; filename="{_quoted(name)}"',
               "Content-Type": "application/octet-stream"}
    if found["sha256"]:
        headers[SHA256_HEADER] = found["sha256"]
    if found["backend"] == "s3":
        return await _stream_from_bucket(svc, request, run_id, found, headers)
    where = local_file(svc, run_id, found)
    if not where.is_file():
        raise ArtifactNotFound(f"artifact {raw} of run {run_id} is listed, but its file {where} is gone "
                               "(removed by hand, or with its run's folder)", code="artifact_gone")
    return web.FileResponse(where, headers=headers)


def local_file(svc: Services, run_id: str, found: dict[str, Any]) -> Path:
    settings = svc.settings
    if found["backend"] == "mount":
        if found["label"] != settings.mount_label or settings.mount_path is None:
            raise ArtifactUnreachable(
                f"this artifact lives under the storage label {found['label']!r}, which this server does not mount "
                "(TROUPE_MOUNT_LABEL and TROUPE_MOUNT_PATH); read it on a machine that does")
        return settings.mount_path / MOUNT_FOLDER / run_id / found["path"]
    run_dir = settings.home / "runs" / run_id
    path = Path(found["path"])
    where = path if path.is_absolute() else run_dir / path  # absolute: a row from before artifacts had a backend
    # A link inside the run's folder is never followed out of it, nor round in a loop.
    try:
        inside = where.resolve().is_relative_to(run_dir.resolve())
    except (RuntimeError, OSError):  # a symbolic link loop (RuntimeError before Python 3.13)
        raise ArtifactUnreachable(f"artifact {found['id']} names {found['path']}, a link that cannot be followed "
                                  "(it loops)") from None
    if not inside:
        raise ArtifactUnreachable(f"artifact {found['id']} names {found['path']}, which leads outside its run's folder")
    return where


async def _stream_from_bucket(svc: Services, request: web.Request, run_id: str, found: dict[str, Any],
                              headers: dict[str, str]) -> web.StreamResponse:
    from troupe.subprocess_runner.s3 import artifact_key, stream

    bucket = svc.settings.s3
    if bucket is None or bucket.bucket != found["label"]:
        raise ArtifactUnreachable(f"this artifact is in the bucket {found['label']!r}, which this server is not "
                                  "configured for (TROUPE_S3_ENABLED, TROUPE_S3_BUCKET)")
    response = web.StreamResponse(headers=headers)
    if found["size"] is not None:
        response.content_length = found["size"]
    from botocore.exceptions import BotoCoreError, ClientError

    chunks = stream(bucket, artifact_key(bucket, run_id, found["path"]))
    try:
        first = await anext(chunks, b"")  # a missing object fails here, before the status is sent
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("NoSuchKey", "404", "NotFound"):  # refused, no bucket
            raise ArtifactUnreachable(f"the bucket {bucket.bucket} refused to give artifact {found['id']}: {exc}") \
                from exc
        raise ArtifactNotFound(f"artifact {found['id']} of run {run_id} is listed, but the bucket answered: {exc}",
                               code="artifact_gone") from exc
    except BotoCoreError as exc:
        raise ArtifactUnreachable(f"the bucket {bucket.bucket} cannot be reached: {exc}") from exc
    await response.prepare(request)
    await response.write(first)
    async for chunk in chunks:
        await response.write(chunk)
    await response.write_eof()
    return response


def _quoted(name: str) -> str:
    return "".join(c if c.isprintable() and c not in '"\\' else "_" for c in name)[:200]
