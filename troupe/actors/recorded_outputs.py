"""The agent's shelf of recorded outputs: a worker run with ``record_outputs`` keeps each
node's outputs here, on the worker, and the inspector reads them through the link
(``read_outputs``). The control plane's database never holds them.

One folder per run, one JSON file per node, written whole (a rename) so a reader never
sees half a file. The same retention as the control plane's recordings: the outputs of
the newest ``keep`` runs stay (TROUPE_RECORDED_OUTPUTS_KEEP, the agent's own setting)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import urllib.parse
from pathlib import Path
from typing import Any

log = logging.getLogger("troupe.agent")


class OutputsShelf:
    def __init__(self, root: Path, keep: int) -> None:
        self._root = root
        self._keep = keep

    def record(self, run_id: str, node_id: str, outputs: dict[str, Any]) -> None:
        """Called from the agent's loop for each node that finished; a failure to write is
        logged (the run goes on: its events still reach the control plane)."""
        if self._keep <= 0:
            return
        try:
            folder = self._folder(run_id)
            if not folder.is_dir():
                folder.mkdir(parents=True)
                self._prune()
            handle, temporary = tempfile.mkstemp(dir=folder, prefix=".node-")
            with os.fdopen(handle, "w") as out:
                json.dump(outputs, out)
            os.replace(temporary, folder / f"{_quote(node_id)}.json")
        except OSError as exc:
            log.warning("run %s: the outputs of node %s were not recorded: %s", run_id, node_id, exc)

    def read(self, run_id: str, node_id: str | None) -> dict[str, Any] | None:
        """Node id -> outputs, or None when nothing is kept for the run."""
        folder = self._folder(run_id)
        if not folder.is_dir():
            return None
        names = [f"{_quote(node_id)}.json"] if node_id is not None else sorted(
            p.name for p in folder.glob("*.json"))
        found: dict[str, Any] = {}
        for name in names:
            try:
                found[urllib.parse.unquote(name.removesuffix(".json"))] = json.loads((folder / name).read_text())
            except (OSError, ValueError):
                continue  # not recorded (that node), or removed meanwhile
        return found

    def _folder(self, run_id: str) -> Path:
        return self._root / _quote(run_id)

    def _prune(self) -> None:
        runs = sorted((p for p in self._root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime_ns)
        for old in runs[: max(0, len(runs) - self._keep)]:
            shutil.rmtree(old, ignore_errors=True)


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")
