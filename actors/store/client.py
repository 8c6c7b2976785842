"""StoreClient: the asyncio face of the Store, which coalesces writes (group commit).

Writes from many actors queue here and go to the store thread as one ``Commit`` batch;
ops keep their order within and across batches (one batch in flight at a time), and
``on_committed`` sees a batch's writes (with their results) only after the commit, once
per batch, so the event hub never publishes an event the database could still lose.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from actors.errors import StoreUnavailable
from actors.store.actor import Commit
from actors.threaded import ThreadActorRef
from protocol.errors import TroupeError

log = logging.getLogger("troupe.store")

WRITE_TIMEOUT_S = 30.0


def _log_failed_write(future: asyncio.Future[Any]) -> None:
    # Retrieving the exception here also keeps asyncio from calling it "never retrieved"
    # for writers that do not wait on their write.
    if future.cancelled():
        return
    error = future.exception()
    # A TroupeError (no such run, still active) is an answer its writer handles.
    if error is not None and not isinstance(error, TroupeError):
        log.warning("store write failed: %s", error)


@dataclass
class _Pending:
    op: Any
    future: asyncio.Future[Any]


@dataclass
class StoreClient:
    """Queues writes and sends them to the store thread in batches (group commit)."""

    # None until the store's actor started (``bind``): the root makes the client first.
    ref: ThreadActorRef | None = None
    on_committed: Callable[[tuple[tuple[Any, Any], ...]], None] = lambda writes: None
    _pending: list[_Pending] = field(default_factory=list)
    _flushing: asyncio.Task[None] | None = None
    _idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._idle.set()

    def bind(self, ref: ThreadActorRef) -> None:
        """The store's actor (again, after a restart)."""
        self.ref = ref

    def _store(self) -> ThreadActorRef:
        if self.ref is None:
            raise StoreUnavailable("the store has not started")
        return self.ref

    async def read(self, message: Any, timeout: float = 10.0) -> Any:
        return await self._store().ask(message, timeout)

    def write(self, op: Any) -> asyncio.Future[Any]:
        """Returns a future that resolves once ``op`` is committed (or failed)."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_log_failed_write)
        self._pending.append(_Pending(op, future))
        self._idle.clear()
        if self._flushing is None:
            self._flushing = asyncio.get_running_loop().create_task(self._flush(), name="store-flush")
        return future

    async def drain(self) -> None:
        """Waits until every write made so far is committed."""
        await self._idle.wait()

    async def _flush(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    reply = self._store().submit(Commit(tuple(p.op for p in batch)))
                    outcomes = await asyncio.wait_for(asyncio.wrap_future(reply), WRITE_TIMEOUT_S)
                except Exception as exc:
                    log.error("store write of %d ops failed: %s", len(batch), exc)
                    failure = exc if isinstance(exc, TroupeError) else StoreUnavailable(f"the store failed: {exc}")
                    for pending in batch:
                        if not pending.future.done():
                            pending.future.set_exception(failure)
                    continue
                committed = tuple((p.op, outcome) for p, outcome in zip(batch, outcomes, strict=True)
                                  if not isinstance(outcome, Exception))
                if committed:
                    try:
                        self.on_committed(committed)
                    except Exception:
                        log.exception("on_committed failed for a batch of %d writes", len(committed))
                for pending, outcome in zip(batch, outcomes, strict=True):
                    if pending.future.done():
                        continue
                    if isinstance(outcome, Exception):
                        pending.future.set_exception(outcome)
                    else:
                        pending.future.set_result(outcome)
        finally:
            self._flushing = None
            self._idle.set()
