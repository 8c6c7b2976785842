"""A command's TensorBoard event files, read as they grow: each scalar a point of the
run's series of its tag, with its step and the wall time it was written at.

A script that logs with ``SummaryWriter`` (torch's or TensorBoard's) writes
``events.out.tfevents.*`` files; nothing else of troupe would read them. The reader runs
where the command runs (the control plane for an in-process run, the run's child on a
worker), looks at the command's folders on the same beat as its checkpoint folder, and
its points go up the run's own event path as ``metric`` events, as a JSON metric line's
do: on a worker they need no route to the control plane of their own.

The files are read with TensorBoard's own reader (``EventFileLoader``, the ``tensorboard``
package: ``pip install 'troupe[tensorboard]'``), imported only once a file is found. Its
record reader keeps a record that is not whole yet (a writer's buffer flushed half way)
and reads it again, from its start, at the next look; a record whose checksum is wrong
is where that file's reading stops, as it does in TensorBoard. Without the package the
run says once that the files were not read, and goes on.

Which files: the node's own folder (``TROUPE_TENSORBOARD_DIR``) and, when the command
runs in the run's folder, ``SummaryWriter()``'s default ``./runs/`` there. A file is
read by the first reader of the process that finds it: two commands of one run that
share the run's folder never chart its points twice.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from troupe.protocol.events import NAME_MAX, STEP_MAX
from troupe.protocol.graph import node_file_stem

EVENT_FILE_MARK = "tfevents"  # in every event file's name, as TensorBoard looks for them
EXTRA = "troupe[tensorboard]"
FOLDER_VAR = "TROUPE_TENSORBOARD_DIR"  # the folder a command is given for its event files
_SCALARS = "scalars"  # the plugin of a scalar summary (data_compat makes a simple_value one too)

_claimed: set[str] = set()  # event files a reader of this process reads (their resolved paths)
_claimed_lock = threading.Lock()


def command_folders(run_dir: Path, cwd: Path, node_id: str) -> tuple[Path, list[Path]]:
    """The node's own folder for event files (made; ``TROUPE_TENSORBOARD_DIR``), and the
    folders read: that one, and ``./runs/`` when the command runs in the run's folder (a
    shared folder's ``./runs/`` holds other runs' files)."""
    own = run_dir / "tensorboard" / node_file_stem(node_id)
    own.mkdir(parents=True, exist_ok=True)
    read = [own]
    if cwd.resolve() == run_dir.resolve():
        read.append(run_dir / "runs")
    return own, read


def _api() -> tuple[Any, Any] | None:
    """TensorBoard's event file loader and tensor reader, or None where the package is
    not installed (or not one that loads here)."""
    try:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
        from tensorboard.util import tensor_util
    except Exception:  # not installed, or broken by its own dependencies: the run says so, once
        return None
    return EventFileLoader, tensor_util


class TensorBoardFiles:
    """One command's event files: ``look`` reads what they gained since the last look;
    ``close`` lets the files go (another run's reader may not take them: they are this
    run's)."""

    def __init__(self, ctx: Any, folders: Sequence[Path]) -> None:
        self._ctx = ctx
        self._folders = list(folders)
        self._loaders: dict[str, Any] = {}
        self._plugins: dict[tuple[str, str], str] = {}  # (file, tag): its plugin, said on its first value
        self._api: tuple[Any, Any] | None = None
        self._off = False  # the package is missing: said once, nothing more is looked for
        self._warned: set[str] = set()

    def look(self) -> None:
        """Reads every event file's new records; never raises (it runs on the thread that
        waits for the command, which must go on)."""
        if self._off:
            return
        try:
            new = [path for path in self._event_files() if path not in self._loaders]
            if new and not self._open(new):
                return
            for path, loader in list(self._loaders.items()):
                if loader is not None:
                    self._read(path, loader)
        except Exception as exc:  # a folder that vanished half way, a file it could not open
            self._warn_once("look", f"the run's TensorBoard files could not be looked at: {exc}")

    def close(self) -> None:
        with _claimed_lock:
            _claimed.difference_update(self._loaders)
        self._loaders.clear()

    def _event_files(self) -> Iterator[str]:
        for folder in self._folders:
            for parent, _, names in os.walk(folder):
                for name in sorted(names):
                    if EVENT_FILE_MARK in name and not name.startswith("."):
                        yield os.path.realpath(os.path.join(parent, name))

    def _open(self, paths: list[str]) -> bool:
        if self._api is None:
            self._api = _api()
            if self._api is None:
                self._off = True
                self._ctx.warning(f"the run's TensorBoard event files ({os.path.basename(paths[0])}) were not read: "
                                  f"the tensorboard package is not installed here (pip install '{EXTRA}')",
                                  code="tensorboard_not_read")
                return False
        loader_class = self._api[0]
        for path in paths:
            with _claimed_lock:
                mine = path not in _claimed
                _claimed.add(path)
            # Another command of this run reads it: kept as None, so it is not asked again.
            self._loaders[path] = loader_class(path) if mine else None
        return True

    def _read(self, path: str, loader: Any) -> None:
        try:
            for event in loader.Load():
                if event.HasField("summary"):
                    for value in event.summary.value:
                        self._value(path, event, value)
        except Exception as exc:  # the file removed, or a record TensorBoard cannot parse: the rest is not read
            self._loaders[path] = None
            self._warn_once(path, f"TensorBoard file {os.path.basename(path)} is not read further: "
                                  f"{type(exc).__name__}: {exc}")

    def _value(self, path: str, event: Any, value: Any) -> None:
        plugin = value.metadata.plugin_data.plugin_name
        if plugin:
            self._plugins[(path, value.tag)] = plugin
        else:  # only a tag's first value says its plugin (TensorBoard's own writers)
            plugin = self._plugins.get((path, value.tag), "")
        if plugin != _SCALARS or value.WhichOneof("value") != "tensor":
            return  # an image, a histogram, a text: not a point
        number = self._api[1].make_ndarray(value.tensor) if self._api is not None else None
        if number is None or number.size != 1 or number.dtype.kind not in "fiub":
            return
        tag, step = value.tag, int(event.step)
        if not 0 < len(tag) <= NAME_MAX or not 0 <= step <= STEP_MAX:
            self._warn_once(f"point:{tag}", f"TensorBoard scalar {tag[:60]!r} at step {step} is not charted: a "
                                            f"series needs a name of 1 to {NAME_MAX} characters and a step "
                                            "from 0 to 2**53")
            return
        wall_time = float(event.wall_time)
        extra = {"wall_time": round(wall_time, 6)} if math.isfinite(wall_time) else {}
        self._ctx.metric(tag, float(number.reshape(()).item()), step=step, **extra)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            self._ctx.warning(message, code="tensorboard_not_read")
