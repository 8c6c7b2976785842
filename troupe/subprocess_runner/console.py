"""A run's console: whatever its nodes write to stdout and stderr (prints, warnings,
tracebacks, a library's progress output), kept with the run as ``console`` events.

In the control plane every in-process run shares one process, so ``sys.stdout`` and
``sys.stderr`` are replaced once (``install``) by streams that route each write to the
console of the run whose node executes on the writing thread (``routed``), and to the
server's own output otherwise: two runs' output never mix, and the server's logging stays
where it was. A worker run's child owns its process, so there the file descriptors 1 and
2 themselves are captured (``capture_descriptors``), C libraries' writes included.

Each node's lines are kept whole and sent as that node's (the event's ``node_id``): two
nodes printing at once never make one line of two. A line still open is held until its
newline, or sent as it is once it has waited ``PARTIAL_S`` (a progress bar's ``\r``).
Output is coalesced for ``FLUSH_S`` and sent in pieces of at most ``PIECE`` characters.
Past ``cap_bytes`` the head is kept as it came and only the newest tail (half the cap)
is kept after it, with one event saying how many bytes were skipped in between.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import os
import select
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from troupe.subprocess_runner.node_scope import current_node_id

CONSOLE = "console"  # the event: {"stream": "stdout" | "stderr", "text"} or {"skipped": bytes}
FLUSH_S = 0.1
PARTIAL_S = 1.0
PIECE = 32 * 1024
PENDING_MAX = 1024 * 1024  # characters written and not yet sent that are sent at once
Emit = Callable[[str, str | None, dict[str, Any]], None]

_route = threading.local()


class Console:
    """One run's console output, thread-safe: written by its nodes, sent as events."""

    def __init__(self, emit: Emit, cap_bytes: int) -> None:
        self._emit = emit
        self._head_left = cap_bytes // 2 if cap_bytes > 0 else None  # None: no cap
        self._tail: deque[tuple[str | None, str, str]] = deque()
        self._tail_bytes = 0
        self._tail_cap = cap_bytes - cap_bytes // 2
        self._skipped = 0
        self._pending: list[tuple[str | None, str, str]] = []
        self._pending_chars = 0
        # A line still open, by (node, stream): its text so far and when it began.
        self._open: dict[tuple[str | None, str], tuple[str, float]] = {}
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._closed = False

    def write(self, stream: str, text: str, node_id: str | None = None) -> None:
        if not text:
            return
        with self._lock:
            if self._closed:
                return
            key = (node_id, stream)
            held, since = self._open.pop(key, ("", time.monotonic()))
            whole, newline, rest = (held + text).rpartition("\n")
            if newline:
                self._pending.append((node_id, stream, whole + newline))
                self._pending_chars += len(whole) + 1
            if len(rest) >= PIECE:  # a line that goes on and on is sent as it comes, not held
                self._pending.append((node_id, stream, rest))
                self._pending_chars += len(rest)
            elif rest:
                self._open[key] = (rest, since if not newline else time.monotonic())
            if self._pending_chars >= PENDING_MAX:
                self._keep_pending()  # a flood does not wait in memory for the timer
            if self._timer is None:
                self._timer = threading.Timer(FLUSH_S, self.flush)
                self._timer.daemon = True
                self._timer.start()

    def flush(self, everything: bool = False) -> None:
        with self._lock:
            now = time.monotonic()
            for key, (held, since) in list(self._open.items()):
                if everything or now - since >= PARTIAL_S:
                    self._pending.append((key[0], key[1], held))
                    del self._open[key]
            self._timer = None
            if self._open and not self._closed:  # a line still open is looked at again
                self._timer = threading.Timer(FLUSH_S, self.flush)
                self._timer.daemon = True
                self._timer.start()
            self._keep_pending()

    def _keep_pending(self) -> None:
        pending, self._pending, self._pending_chars = self._pending, [], 0
        for node_id, stream, text in _merged(pending):
            self._keep(node_id, stream, text)

    def close(self) -> None:
        """Sends what waits, then the kept tail after the count of what was skipped."""
        self.flush(everything=True)
        with self._lock:
            self._closed = True
            if self._skipped:
                self._emit(CONSOLE, None, {"skipped": self._skipped,
                                           "text": f"\n[... {self._skipped} bytes of console output skipped "
                                                   "(TROUPE_RUN_CONSOLE_CAP_BYTES) ...]\n"})
            for node_id, stream, text in _merged(list(self._tail)):
                self._send(node_id, stream, text)
            self._tail.clear()
            if self._timer is not None:
                self._timer.cancel()

    def _keep(self, node_id: str | None, stream: str, text: str) -> None:
        if self._head_left is None:
            self._send(node_id, stream, text)
            return
        size = len(text.encode("utf-8", "replace"))
        if size <= self._head_left:
            self._head_left -= size
            self._send(node_id, stream, text)
            return
        self._tail.append((node_id, stream, text))
        self._tail_bytes += size
        while self._tail_bytes > self._tail_cap and self._tail:
            dropped_node, dropped_stream, dropped = self._tail.popleft()
            dropped_size = len(dropped.encode("utf-8", "replace"))
            over = self._tail_bytes - self._tail_cap
            if dropped_size > over:  # keep the newest part of this piece
                kept = dropped.encode("utf-8", "replace")[over:].decode("utf-8", "ignore")
                self._tail.appendleft((dropped_node, dropped_stream, kept))
                self._skipped += over
                self._tail_bytes -= over
                break
            self._skipped += dropped_size
            self._tail_bytes -= dropped_size

    def _send(self, node_id: str | None, stream: str, text: str) -> None:
        for start in range(0, len(text), PIECE):
            self._emit(CONSOLE, node_id, {"stream": stream, "text": text[start:start + PIECE]})


def _merged(pieces: list[tuple[str | None, str, str]]) -> Iterator[tuple[str | None, str, str]]:
    """Neighbouring writes of one node to one stream as one text."""
    where: tuple[str | None, str] | None = None
    parts: list[str] = []
    for node_id, name, text in pieces:
        if (node_id, name) != where and parts and where is not None:
            yield where[0], where[1], "".join(parts)
            parts = []
        where = (node_id, name)
        parts.append(text)
    if parts and where is not None:
        yield where[0], where[1], "".join(parts)


@contextlib.contextmanager
def routed(console: Console | None) -> Iterator[None]:
    """What this thread writes to sys.stdout and sys.stderr goes to ``console``."""
    if console is None:
        yield
        return
    before = getattr(_route, "console", None)
    _route.console = console
    try:
        yield
    finally:
        _route.console = before


class _RoutedStream(io.TextIOBase):
    def __init__(self, name: str, real: Any) -> None:
        super().__init__()
        self._name = name
        self._real = real

    def write(self, text: str) -> int:
        console = getattr(_route, "console", None)
        if console is not None:
            console.write(self._name, text, current_node_id())
        else:
            self._real.write(text)
        return len(text)

    def flush(self) -> None:
        self._real.flush()

    def fileno(self) -> int:
        return int(self._real.fileno())

    def isatty(self) -> bool:
        return bool(self._real.isatty())

    @property
    def encoding(self) -> str:  # type: ignore[override]  # a property on TextIOBase's type stub
        return str(getattr(self._real, "encoding", "utf-8"))

    def writable(self) -> bool:
        return True


def install() -> None:
    """Routes sys.stdout and sys.stderr of this process by thread (the control plane)."""
    if not isinstance(sys.stdout, _RoutedStream):
        sys.stdout = _RoutedStream("stdout", sys.stdout)
    if not isinstance(sys.stderr, _RoutedStream):
        sys.stderr = _RoutedStream("stderr", sys.stderr)


class DescriptorCapture:
    """File descriptors 1 and 2 of this process, read by threads of their own from the
    moment it is made: what they read goes to the console ``attach`` gives (before that,
    on to where the descriptors wrote). A forked run child makes one while it waits for
    its run, so that the run's start pays for no pipe and no thread.

    ``close`` takes what is left in the pipes itself, under each reader's lock, rather
    than waiting for the readers to wake and end: a run's end waited for two thread
    wake-ups (about 0.4 ms on a small VM), and for as long as 5 s when a process the
    run started still held a descriptor open."""

    def __init__(self) -> None:
        self._console: Console | None = None
        self._saved: list[tuple[int, int]] = []  # (descriptor, a copy of what it was)
        self._readers: list[_Reader] = []
        for fd, name in ((1, "stdout"), (2, "stderr")):
            sys.stdout.flush() if fd == 1 else sys.stderr.flush()
            read_end, write_end = os.pipe()
            os.set_blocking(read_end, False)
            copy = os.dup(fd)
            self._saved.append((fd, copy))
            os.dup2(write_end, fd)
            os.close(write_end)
            reader = _Reader(read_end, name, copy)
            self._readers.append(reader)
            threading.Thread(target=self._pump, args=(reader,), name=f"console-{name}", daemon=True).start()

    def attach(self, console: Console) -> None:
        self._console = console

    def close(self) -> None:
        """Puts the descriptors back and returns once everything written to them is
        passed on (and the console closed). A second call does nothing."""
        saved, self._saved = self._saved, []
        if not saved:
            return
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        for fd, copy in saved:  # the pipes' write ends close: nothing more comes (but from a process that kept one)
            os.dup2(copy, fd)
        for reader in self._readers:
            with reader.lock:
                for _ in range(_DRAIN_READS):  # bounded: a process the run left behind may go on writing
                    if self._take(reader) is not _MORE:
                        break
                self._pass(reader, b"", final=True)
                reader.closed = True
                os.close(reader.read_end)
        for _, copy in saved:  # only now: no reader passes output on to it any more
            os.close(copy)
        if self._console is not None:
            self._console.close()

    def _pump(self, reader: _Reader) -> None:
        poller = select.poll()
        poller.register(reader.read_end, select.POLLIN)
        while True:
            with contextlib.suppress(InterruptedError):
                poller.poll()
            with reader.lock:
                if reader.closed or self._take(reader) is _END:
                    return

    def _take(self, reader: _Reader) -> object:
        """Passes on one read of the pipe, under its lock: ``_MORE``, ``_EMPTY`` for now, or ``_END``."""
        try:
            chunk = os.read(reader.read_end, 65536)
        except BlockingIOError:
            return _EMPTY
        if not chunk:
            return _END
        self._pass(reader, chunk)
        return _MORE

    def _pass(self, reader: _Reader, chunk: bytes, final: bool = False) -> None:
        console = self._console
        if console is not None:
            console.write(reader.name, reader.decoder.decode(chunk, final=final))
        elif chunk:  # not attached yet: on to where the descriptor wrote, as it came
            with contextlib.suppress(OSError):
                os.write(reader.before, chunk)


_MORE, _EMPTY, _END = object(), object(), object()
_DRAIN_READS = 64  # what close takes itself, at most (64 reads of 64 KiB)


class _Reader:
    """One captured descriptor's pipe: its read end, what the descriptor was before,
    and the lock its reading thread and ``close`` take turns under."""

    def __init__(self, read_end: int, name: str, before: int) -> None:
        self.read_end, self.name, self.before = read_end, name, before
        self.lock = threading.Lock()
        self.closed = False
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")  # a character split between reads stays whole


@contextlib.contextmanager
def capture_descriptors(console: Console, made: DescriptorCapture | None = None) -> Iterator[None]:
    """Everything written to file descriptors 1 and 2 of this process goes to ``console``
    (a worker run's child: the whole process is the run's). ``made``: a capture made
    ahead, which this one closes."""
    capture = made if made is not None else DescriptorCapture()
    capture.attach(console)
    try:
        yield
    finally:
        capture.close()
