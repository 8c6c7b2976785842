"""Storing a run's artifacts, off the training's path: a node writes its checkpoint into
the run's folder and announces it (``ctx.artifact``); a thread of the run then hashes it
and stores it where it belongs, and only then is the ``artifact`` event emitted, with the
backend, size and sha256. A file that could not be stored whole is never announced as
an artifact: its run gets a warning instead.

Where an artifact goes (``destination``): an in-process run's stays in its folder on the
control plane (``local``). A worker run's goes to the control plane's own storage label
when this worker holds it too (``mount``: both machines reach that folder), else to the
S3 bucket when one is configured (``s3``), else to the control plane over the worker's
credential (``transfer``: the control plane checks it on arrival and records it
itself, so its run emits nothing for it). The run waits for the stores still going
before it reports its end.

A transfer goes through the agent's artifact outbox (``troupe.subprocess_runner.outbox``) when
the agent gives one: the file is kept there and announced ``artifact_pending``, and the
agent uploads it, again and again if need be, even after the run ended or the agent was
killed; the control plane marks it stored when all of it arrived.
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import queue
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from troupe.protocol.unix_http import connect
from troupe.protocol.worker import S3Bucket, Storage
from troupe.subprocess_runner import outbox
from troupe.subprocess_runner.digest import copy_hashing, file_sha256
from troupe.subprocess_runner.outbox import OutboxFull
from troupe.subprocess_runner.transfer import ATTEMPTS

log = logging.getLogger("troupe.artifacts")

MOUNT_FOLDER = "troupe-artifacts"  # under a storage label: <label>/troupe-artifacts/<run id>/<path>
# The header a transfer carries the file's sha256 in (the control plane checks it).
SHA256_HEADER = "X-Troupe-Sha256"
FAILED_HEADER = "X-Troupe-Artifact-Failed"  # a worker gave up on the file: the reason, no body
Emit = Callable[[str, str | None, dict[str, Any]], None]


@dataclass(frozen=True)
class Destination:
    backend: str  # local | mount | s3 | transfer
    label: str | None = None  # mount: the storage label; s3: the bucket
    root: Path | None = None  # mount: the label's folder on this machine
    bucket: S3Bucket | None = None
    control_plane: Mapping[str, Any] | None = None  # transfer: url, unix_socket, credential
    max_bytes: int | None = None  # transfer: the most one file may be
    outbox: Path | None = None  # transfer: the agent's artifact outbox, when it keeps one
    outbox_bytes: int = 0  # its size limit


def destination(storage: Storage | None, mounts: Mapping[str, str], control_plane: Mapping[str, Any],
                outbox: Mapping[str, Any] | None = None) -> Destination:
    """A worker run's: mount first, then S3, then transfer (through the outbox when the
    agent keeps one: ``{"folder", "bytes"}``)."""
    if storage is not None and storage.mount_label and storage.mount_label in mounts:
        return Destination("mount", storage.mount_label, root=Path(mounts[storage.mount_label]))
    if storage is not None and storage.s3 is not None:
        return Destination("s3", storage.s3.bucket, bucket=storage.s3)
    limit = storage.transfer_max_mb if storage is not None else None
    return Destination("transfer", control_plane=control_plane,
                       max_bytes=limit * 1024 * 1024 if limit is not None else None,
                       outbox=Path(outbox["folder"]) if outbox else None,
                       outbox_bytes=int(outbox["bytes"]) if outbox else 0)


class Shipper:
    """One run's artifact stores, in the order they were announced, on one thread."""

    def __init__(self, run_id: str, run_dir: Path, where: Destination, emit: Emit, folder_kept: bool = True) -> None:
        self._run_id = run_id
        self._run_dir = run_dir
        self._folder_kept = folder_kept  # a worker run's folder is removed when its process ends
        self._where = where
        self._emit = emit
        self._queue: queue.SimpleQueue[tuple[str | None, str, Path, bool] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, node_id: str | None, kind: str, path: Path, remove: bool = False) -> None:
        """Stores the file; ``remove``: lets go of one stored before (after its store, in
        the order asked), wherever its copies are (``checkpoint_bounds``)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=f"artifacts-{self._run_id[:8]}", daemon=True)
                self._thread.start()
        self._queue.put((node_id, kind, path, remove))

    def close(self) -> None:
        """Waits for every store announced so far (the run ends after them)."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            self._queue.put(None)
            thread.join()

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            node_id, kind, path, remove = item
            if remove:
                self._remove(node_id, kind, path)
                continue
            try:
                stored = self._store(node_id, kind, path)
            except Exception as exc:  # one artifact that fails never fails the run
                log.warning("run %s: artifact %s was not stored: %s", self._run_id, path, exc)
                code = "artifact_outbox_full" if isinstance(exc, OutboxFull) else "artifact_not_stored"
                left = f"it stays at {path}" if self._folder_kept else "it is not kept (the run's folder on the " \
                    "worker is removed when the run ends)"
                self._emit("warning", node_id, {"message": f"artifact {path.name} was not stored "
                                                           f"({self._where.backend}): {exc}; {left}",
                                                "code": code, "path": _relative(path, self._run_dir) or str(path),
                                                "kind": kind})
                continue
            if stored is not None:
                self._emit(stored.pop("event", "artifact"), node_id, {"kind": kind, **stored})

    def _store(self, node_id: str | None, kind: str, path: Path) -> dict[str, Any] | None:
        """Stores one file; returns what its event says, or None when the control plane
        records it itself (transfer)."""
        where = self._where
        relative = _relative(path, self._run_dir)
        if relative is None and where.backend != "local":
            raise ValueError(f"a worker run's artifact must be inside the run's folder {self._run_dir}")
        shown = relative or str(path)
        if where.backend == "mount":
            assert where.root is not None
            size, sha256 = copy_hashing(path, where.root / MOUNT_FOLDER / self._run_id / shown)
            return {"path": shown, "backend": "mount", "label": where.label, "size": size, "sha256": sha256}
        if where.backend == "transfer" and where.outbox is not None:
            self._check_size(path.stat().st_size)
            entry = outbox.put(where.outbox, self._run_id, path, shown, kind, node_id, where.outbox_bytes)
            return {"event": "artifact_pending", "path": shown, "backend": "transfer", "label": None,
                    "size": entry.size, "sha256": entry.sha256}
        size, sha256 = path.stat().st_size, file_sha256(path)
        if where.backend == "s3":
            from troupe.subprocess_runner.s3 import artifact_key, put_file

            assert where.bucket is not None
            asyncio.run(put_file(where.bucket, path, artifact_key(where.bucket, self._run_id, shown), sha256))
            return {"path": shown, "backend": "s3", "label": where.label, "size": size, "sha256": sha256}
        if where.backend == "transfer":
            self._check_size(size)
            self._transfer(path, {"path": shown, "kind": kind, "node": node_id or ""}, size, sha256)
            return None
        return {"path": shown, "backend": "local", "label": None, "size": size, "sha256": sha256}

    def _remove(self, node_id: str | None, kind: str, path: Path) -> None:
        """Deletes the run's file and the copy its backend made (the label's, the
        bucket's, the outbox's while it waits there), then says so: the control plane
        marks its row removed and deletes the copy it holds (one a worker sent)."""
        from troupe.subprocess_runner.artifact_removal import remove_copies

        relative = _relative(path, self._run_dir)
        try:
            remove_copies(self._run_id, path, relative, self._where)
        except Exception as exc:  # a copy that stays is a warning, never a failed run
            log.warning("run %s: artifact %s was not removed everywhere: %s", self._run_id, path, exc)
            self._emit("warning", node_id, {"message": f"artifact {path.name} was not removed everywhere: {exc}",
                                            "code": "checkpoint_not_removed"})
        if relative is not None:
            self._emit("artifact_removed", node_id, {"kind": kind, "path": relative, "backend": self._where.backend})

    def _check_size(self, size: int) -> None:
        limit = self._where.max_bytes
        if limit is not None and size > limit:
            raise ValueError(f"it is {size / 1e6:.0f} MB, over the control plane's {limit // 2**20} MiB a "
                             "transfer (TROUPE_UPLOAD_MAX_MB); give the worker the control plane's storage label, "
                             "or configure S3")

    def _transfer(self, path: Path, query: dict[str, str], size: int, sha256: str) -> None:
        """PUTs the file to the control plane, which keeps it only if all of it arrived
        with this hash; a cut-short or refused attempt is tried again."""
        control = self._where.control_plane or {}
        target = f"/api/runs/{self._run_id}/artifacts?{urllib.parse.urlencode(query)}"
        problem = ""
        for attempt in range(ATTEMPTS):
            if attempt:
                time.sleep(attempt)
            conn = connect(str(control.get("url", "")), control.get("unix_socket"), 60.0, control.get("ca"))
            try:
                with path.open("rb") as body:
                    conn.request("PUT", target, body=body, headers={
                        "Content-Length": str(size), SHA256_HEADER: sha256, "Content-Type": "application/octet-stream",
                        "Authorization": f"Bearer {control.get('credential', '')}"})
                    response = conn.getresponse()
                    answer = response.read(4096).decode("utf-8", "replace")
                if response.status == 201:
                    return
                problem = f"the control plane answered {response.status}: {answer[:300]}"
                if response.status in (401, 404, 409, 413):
                    break  # trying again cannot help
            except (OSError, http.client.HTTPException) as exc:
                problem = f"the transfer was cut short: {exc}"
            finally:
                conn.close()
        raise OSError(problem)


def _relative(path: Path, run_dir: Path) -> str | None:
    try:
        return PurePosixPath(path.resolve().relative_to(run_dir.resolve())).as_posix()
    except ValueError:
        return None
