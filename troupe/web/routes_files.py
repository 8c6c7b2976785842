"""``/api/files``: files uploaded for runs to read as ``upload:<file id>``. The bytes are
streamed to ``TROUPE_HOME/files`` and hashed on the way in; the file's id is the head of
its sha256, so the same content uploaded twice is one file. With S3 on, each upload is
also put in the bucket (before its row is written), where workers take it from.

Each file records who uploaded it (``uploaded_by``, as a run's ``submitted_by``): a class
session deletes only its own uploads (``troupe/web/change_rights.py``), so it cannot delete the
teacher's dataset, nor another student's, under the runs that read it."""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import BodyPartReader, web

from troupe.actors.errors import FileNotFound, StorageUnavailable
from troupe.actors.store.files import AddFile, DeleteFile, ListFiles
from troupe.protocol.errors import InvalidRequest, PayloadTooLarge
from troupe.protocol.worker import S3Bucket
from troupe.subprocess_runner.digest import CHUNK, pour_async
from troupe.web.change_rights import refuse_theirs
from troupe.web.context import services
from troupe.web.errors import json_reply
from troupe.web.limits import paced
from troupe.web.login import TEACHER, submitter_of
from troupe.web.requests import hex_id

routes = web.RouteTableDef()


async def _chunks(part: BodyPartReader) -> AsyncIterator[bytes]:
    try:
        while chunk := await part.read_chunk(CHUNK):
            yield chunk
    except ValueError as exc:  # aiohttp's reader: a part that ends with no closing boundary
        raise _malformed(exc) from None
    except (ConnectionError, asyncio.IncompleteReadError) as exc:  # the sender went away: its request, not a fault
        raise InvalidRequest(f"the upload was cut short ({exc}); nothing was kept", pointer="") from None


def _malformed(exc: ValueError) -> InvalidRequest:
    return InvalidRequest(f"the form is not well-formed multipart/form-data ({' '.join(str(exc).split())[:200]})",
                          pointer="")


@routes.post("/api/files")
async def upload(request: web.Request) -> web.Response:
    svc = services(request)
    if not request.content_type.startswith("multipart/"):
        raise InvalidRequest("send the file as multipart/form-data, in a field named file", pointer="")
    try:
        reader = await request.multipart()
        part = await reader.next()
    except ValueError as exc:  # no boundary, one too long, a body that does not start with it
        raise _malformed(exc) from None
    if part is None:
        raise InvalidRequest("the form has no field named file", pointer="/file")
    _only_the_file(part)
    assert isinstance(part, BodyPartReader)
    folder = svc.settings.home / "files"
    folder.mkdir(parents=True, exist_ok=True)
    limit = svc.settings.upload_max_mb * 1024 * 1024
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=".upload-")
    try:
        with os.fdopen(handle, "wb") as out:
            size, sha256 = await pour_async(paced(_chunks(part), svc.settings.request_read_timeout_s), out, limit)
        if size > limit:
            raise PayloadTooLarge(f"the file is over {svc.settings.upload_max_mb} MB (TROUPE_UPLOAD_MAX_MB)")
        try:
            extra = await reader.next()
        except ValueError as exc:
            raise _malformed(exc) from None
        if extra is not None:
            _only_the_file(extra)  # another field: refused at its name
            raise InvalidRequest("the form holds a second file; one upload is one file", pointer="/file")
        file_id = sha256[:32]
        if svc.settings.s3 is not None:  # workers take it from the bucket; the copy here serves runs here
            await _to_bucket(svc.settings.s3, Path(temporary), file_id, sha256)  # refused: nothing is in place
        os.replace(temporary, folder / file_id)
    finally:
        Path(temporary).unlink(missing_ok=True)
    # A name sent in bytes that are not UTF-8 is kept readable (U+FFFD for each), never
    # refused: the file is the point, its name only a label.
    name = Path(part.filename or "upload").name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")[:255]
    who = svc.login.who(request)
    row = await svc.store.write(AddFile({"id": file_id, "name": name, "size": size, "sha256": sha256},
                                        uploaded_by=submitter_of(who) if who is not None else None,
                                        takes_over=who is not None and who.kind == TEACHER))
    return json_reply({"file_id": row["id"], "name": row["name"], "size": row["size"], "sha256": row["sha256"],
                       "ref": f"upload:{row['id']}", "uploaded_by": row["uploaded_by"]}, status=201)


def _only_the_file(part: object) -> None:
    """The form holds one field, ``file``: any other is refused, not ignored."""
    name = getattr(part, "name", None)
    if name != "file" or not isinstance(part, BodyPartReader):
        shown = str(name).encode("utf-8", "backslashreplace").decode()[:100]
        raise InvalidRequest(f"the form holds a field {shown!r}; it takes one field, named file",
                             pointer=f"/{shown}", code="unknown_form_field")


async def _to_bucket(bucket: S3Bucket, path: Path, file_id: str, sha256: str) -> None:
    from botocore.exceptions import BotoCoreError, ClientError

    from troupe.subprocess_runner.s3 import put_file, upload_key

    try:
        await put_file(bucket, path, upload_key(bucket, file_id), sha256)
    except (BotoCoreError, ClientError) as exc:
        raise StorageUnavailable(f"the file could not be stored in the bucket {bucket.bucket}: {exc}; nothing was "
                                 "recorded, send it again once the bucket answers") from exc


@routes.get("/api/files")
async def list_files(request: web.Request) -> web.Response:
    return json_reply({"files": await services(request).store.read(ListFiles())})


@routes.get("/api/files/{file_id}/content")
async def file_content(request: web.Request) -> web.StreamResponse:
    """The file's bytes: a worker's run child fetches the uploads it reads this way."""
    file_id = hex_id(request, "file")
    path = services(request).settings.home / "files" / file_id
    if not path.is_file():
        raise FileNotFound(f"no uploaded file {file_id}")
    return web.FileResponse(path, headers={"Content-Type": "application/octet-stream"})


@routes.delete("/api/files/{file_id}")
async def delete_file(request: web.Request) -> web.Response:
    svc = services(request)
    file_id = hex_id(request, "file")
    for row in await svc.store.read(ListFiles(file_id)):  # none: DeleteFile says there is no such file
        await refuse_theirs(svc, svc.login.who(request), "file", f"{file_id} ({row['name']})", row["uploaded_by"],
                            "delete")
    await svc.store.write(DeleteFile(file_id))
    return json_reply({"file_id": file_id, "deleted": True})
