"""A fault-injecting TCP proxy on loopback, between an agent and the control plane.

It forwards bytes both ways until told to ``cut()``: then every open connection is
closed and new ones are accepted and closed at once (the agent sees a refused link and
retries with its backoff), until ``restore()``. ``hold()`` is the other kind of cut: the
connections stay open and silent (no byte passes either way), as when a laptop sleeps or
its network changes, so only missed heartbeats reveal it. It runs its own event loop in
a thread, so synchronous tests drive it directly.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any


class FaultProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port  # may change: a restarted server binds anew
        self.port = 0
        self.connections = 0  # accepted while not cut, over the proxy's life
        self.refused = 0  # closed at once while cut
        self._refusals = threading.Condition()
        self._loop = asyncio.new_event_loop()
        self._cut = False
        self._held = asyncio.Event()
        self._open: set[asyncio.StreamWriter] = set()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="faultproxy", daemon=True)
        self._server: Any = None

    def start(self) -> FaultProxy:
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the proxy did not start")
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut(self) -> None:
        """Closes every connection and refuses new ones until ``restore``."""
        self._call(self._do_cut)

    def hold(self) -> None:
        """Keeps the connections open but lets no byte through until ``restore``."""
        self._call(self._held.set)

    def restore(self) -> None:
        self._call(self._do_restore)

    def wait_refused(self, count: int, timeout: float = 60.0) -> None:
        """Returns once ``count`` connections in all were refused while cut: a client
        that tries again has tried that many times."""
        with self._refusals:
            if not self._refusals.wait_for(lambda: self.refused >= count, timeout):
                raise TimeoutError(f"{self.refused} connections refused, not {count}")

    def close(self) -> None:
        self._call(self._do_cut)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    # On the proxy's loop ---------------------------------------------------------
    def _call(self, fn: Any) -> None:
        done = threading.Event()

        def run() -> None:
            fn()
            done.set()

        self._loop.call_soon_threadsafe(run)
        done.wait(10)

    def _do_cut(self) -> None:
        self._cut = True
        for writer in list(self._open):
            writer.transport.abort()
        self._open.clear()

    def _do_restore(self) -> None:
        self._cut = False
        self._held.clear()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._started.set()
        self._loop.run_forever()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            writer.transport.abort()
            with self._refusals:
                self.refused += 1
                self._refusals.notify_all()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        self.connections += 1
        self._open |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                while self._held.is_set() and not self._cut:
                    await asyncio.sleep(0.05)  # silent: nothing passes, nothing closes
                if self._cut:
                    break
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.transport.abort()
            self._open.discard(writer)
