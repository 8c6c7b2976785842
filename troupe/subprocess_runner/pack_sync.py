"""An agent's packs: those of its own folders, and, when its owner started it with
``--accept-packs``, those the control plane offers, fetched as a run needs them and kept
in a cache by digest. A run child loads the ones its run names, at the digest the
control plane runs, so a new version reaches the worker with its next run, without a
restart of the agent."""

from __future__ import annotations

import http.client
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from troupe.protocol.unix_http import connect
from troupe.subprocess_runner.errors import PackArchiveRefused
from troupe.subprocess_runner.pack_files import MAX_ARCHIVE_BYTES, cached, unpack
from troupe.subprocess_runner.pack_loader import FolderPack

log = logging.getLogger("troupe.packs")


class PackUnavailable(Exception):
    """A pack a run needs that this agent neither has nor may fetch, or could not fetch."""


@dataclass
class AgentPacks:
    own: Mapping[str, FolderPack]  # the agent's own folder packs (TROUPE_HOME/packs, --packs)
    accept: bool = False  # --accept-packs: fetch the control plane's
    cache: Path | None = None
    control_plane: Mapping[str, Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def paths_for(self, wanted: Mapping[str, str]) -> list[str]:
        """Where the packs ``wanted`` (name -> digest) are on this machine, then the
        agent's other own packs: what a run child loads besides its installed packs."""
        paths = []
        for name, digest in sorted(wanted.items()):
            own = self.own.get(name)
            if own is not None and own.digest == digest:
                paths.append(str(own.path))
            elif self.accept and self.cache is not None:
                with self._lock:  # two runs that need a new pack fetch it once
                    paths.append(str(self._fetch(name, digest)))
            else:
                had = f"this worker has version {own.digest[:12]}" if own is not None else "this worker lacks it"
                raise PackUnavailable(f"the run needs pack {name} ({digest[:12]}); {had}, and it was not started "
                                      "with --accept-packs to take the control plane's")
        paths.extend(str(own.path) for name, own in sorted(self.own.items()) if name not in wanted)
        return paths

    def _fetch(self, name: str, digest: str) -> Path:
        assert self.cache is not None
        found = cached(self.cache, name, digest)
        if found is not None:
            return found
        data = self._download(name)
        try:
            path = unpack(data, name, digest, self.cache)
        except PackArchiveRefused as exc:
            log.error("%s", exc)
            raise
        log.info("pack %s %s fetched from the control plane", name, digest[:12])
        return path

    def _download(self, name: str) -> bytes:
        plane = self.control_plane
        conn = connect(str(plane["url"]), plane.get("unix_socket"), 60.0, plane.get("ca"))
        try:
            credential = plane.get("credential")
            conn.request("GET", f"/api/packs/{quote(name, safe='')}/archive",
                         headers={"Authorization": f"Bearer {credential}"} if credential else {})
            response = conn.getresponse()
            body = response.read(MAX_ARCHIVE_BYTES + 1)
            if response.status != 200:
                raise PackUnavailable(f"pack {name} could not be fetched: the control plane answered "
                                      f"{response.status} ({body[:300].decode('utf-8', 'replace')})")
            return body
        except (OSError, http.client.HTTPException) as exc:
            raise PackUnavailable(f"pack {name} could not be fetched: {exc}") from None
        finally:
            conn.close()
