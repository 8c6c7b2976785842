"""StoreClient: the asyncio face of the Store, which coalesces writes (group commit).

Writes from many actors queue here and go as one batch; ops keep their order within and
across batches (one batch in flight at a time), and ``on_committed`` sees a batch's
writes (with their results) only after the commit, once per batch, so the event hub
never publishes an event the database could still lose.

A batch is taken once a turn of the loop after its first write adds nothing to it (at
most ``BATCH_TURNS_MAX`` turns): what the actors ready in those turns write joins it. A
small batch of the writes a run makes as it goes (its row, a few events) is committed
here, on the loop, by a ``Writer`` on a connection of this client's own: a hand-over to
the store's thread and back costs two thread wake-ups, about 100 us of CPU on a VM, more
than the commit. A large batch, or any other write (retention, recovery, deletes, which
may take long), goes to the store's thread as a ``Commit``, and SQLite works there while
the loop goes on. The loop's connection never
copies the write-ahead log into the database (that ends with an fsync): every
``CHECKPOINT_EVERY`` of its commits, the store's thread does, between two batches.

A few reads that an index and a limit keep small (the run list without a search, the
workers, card policies, a graph's last peak, a stream's first page of a run's events)
are answered on that connection too; every other read goes to the thread.

A run stored since this client started has its log followed here from its first event
while it stays small (a page), and kept for a while once it has ended (``LOGS_FOLLOWED``
runs, ended or not): the stream a script opens right after it submitted a quick run is
then answered without reading back what was just written. Any write other than a run's
row or events (a delete, retention, recovery) forgets them all: what is kept is always
what the database holds.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from troupe.actors.errors import StoreUnavailable
from troupe.actors.store.actor import Checkpoint, Commit
from troupe.actors.store.events import AppendEvents, EventRow
from troupe.actors.store.memory import CardPolicies, LastPeak
from troupe.actors.store.room import Room
from troupe.actors.store.run_list import ListRuns
from troupe.actors.store.runs import InsertRun, ReadStream, UpdateRun
from troupe.actors.store.sweeps import CreateSweep, created_runs
from troupe.actors.store.workers import ListWorkers
from troupe.actors.store.writer import Writer, is_broken
from troupe.actors.threaded import ThreadActorRef
from troupe.protocol import events as ev
from troupe.protocol.errors import TroupeError

log = logging.getLogger("troupe.store")

WRITE_TIMEOUT_S = 30.0
# What the loop commits itself: the writes of a run as it goes, in batches this small,
# counting an op as one row and an ``AppendEvents`` as its events. A burst of many runs,
# or a relayed frame of 500 metric points, goes to the thread, whose SQLite work then
# overlaps the loop's parsing of what comes next.
INLINE_WRITES = frozenset({InsertRun, UpdateRun, AppendEvents})
INLINE_MAX_ROWS = 32
# A batch waits while each turn of the loop adds to it, at most this many turns: a lone
# run's writes go after one turn that added nothing, and runs submitted at once by a
# script's four threads took 30% fewer commits (762 for 1,500 runs, not 1,084) and
# drained 15% faster.
BATCH_TURNS_MAX = 8
CHECKPOINT_EVERY = 200
# A page of a run's events this small is read on the loop: a stream's first page (a
# whole hello run's log is about 3 KB) then costs no hand-over to the thread and back.
LOOP_PAGE_BYTES = 16 * 1024
# Small logs followed from their first event (runs in progress or just ended), for the
# stream a client opens next: a script's four threads need a few, a page a few more.
LOGS_FOLLOWED = 64


def _reads_here(message: Any) -> bool:
    """The reads the loop answers on its own connection: an index and a limit bound them
    to a fraction of a millisecond. On the store's thread, such a read waits for the
    interpreter lock each time SQLite hands a row back while the loop is busy, up to the
    switch interval each time: at scale x4, a list of 50 runs that costs 0.6 ms of CPU took
    50-100 ms. A search, a tag filter or a ``where`` may walk many runs, and stays on the thread."""
    if type(message) is ListRuns:
        return message.search is None and message.tag is None and message.where is None
    if type(message) is ReadStream:
        return 0 < message.cap_bytes <= LOOP_PAGE_BYTES
    return type(message) in _SMALL_READS


_SMALL_READS = frozenset({ListWorkers, CardPolicies, LastPeak})
_THREAD = object()  # what the loop's connection answers for work the thread is to do


@dataclass(slots=True)
class _Log:
    """A run's log as stored, every row of it from its first (while it is small)."""

    rows: list[EventRow]
    size: int
    ended: bool = False


def _carries_on(log_so_far: _Log, op: AppendEvents) -> bool:
    """Adds ``op``'s rows as they were stored to the log followed so far, when they carry
    it on (the next seqs, none missing, not past its end, within a page); False, and the
    log is to be dropped, when they do not. A worker's frames (a counter) may repeat,
    and are not followed."""
    if op.counter is not None or log_so_far.ended:
        return False
    rows, size = log_so_far.rows, log_so_far.size
    for event in op.events:
        seq = len(rows) + 1
        if event["seq"] != seq:
            return False
        payload = ev.payload_json(event)
        size += len(payload) + 96
        if size > LOOP_PAGE_BYTES:
            return False
        rows.append((seq, event["type"], event["ts"], event.get("node_id"), payload))
        if event["type"] == ev.RUN_FINISHED:
            log_so_far.ended = True
    log_so_far.size = size
    return True


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
    # Opens the loop's own connection (None: every batch goes to the thread). It opens
    # once the store's thread has committed a batch: the file is migrated by then.
    open_inline: Callable[[], Writer] | None = None
    _inline: Writer | None = None
    _thread_committed: bool = False
    _since_checkpoint: int = 0
    _pending: list[_Pending] = field(default_factory=list)
    _flushing: asyncio.Task[None] | None = None
    _soon: set[Any] = field(default_factory=set)  # ops ``write_soon`` will write
    _idle: asyncio.Event = field(default_factory=asyncio.Event)
    # run id -> its log as stored, every row from the first, while it is small
    _logs: OrderedDict[str, _Log] = field(default_factory=OrderedDict)
    # Whether the disk had room at the last write, and who waits for it to have some.
    room: Room = field(init=False)

    def __post_init__(self) -> None:
        self._idle.set()
        self.room = Room(self.write, lambda: self.ref is not None and self.ref.is_alive)

    def bind(self, ref: ThreadActorRef) -> None:
        """The store's actor (again, after a restart: the loop's connection opens again
        after the new one has committed)."""
        self.ref = ref
        self.close()

    def close(self) -> None:
        """Closes the loop's connection (the server stops, or the store restarts)."""
        if self._inline is not None:
            self._inline.close()
            self._inline = None
        self._thread_committed = False
        self._logs.clear()

    def _store(self) -> ThreadActorRef:
        if self.ref is None:
            raise StoreUnavailable("the store has not started")
        return self.ref

    async def read(self, message: Any, timeout: float = 10.0) -> Any:
        if type(message) is ReadStream and message.run_id in self._logs:
            kept = self._kept_stream(message)
            if kept is not None:
                return kept
        if _reads_here(message):
            found = self._here(lambda writer: writer.read(message))
            if found is not _THREAD:
                return found
        elif not Writer.reads(message):
            self._logs.clear()  # a write asked for its answer: it may delete runs
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

    def write_soon(self, op: Any, delay_s: float) -> None:
        """Writes ``op`` ``delay_s`` from now, once however often an equal op is asked for
        meanwhile: retention after each run's end is then one prune for a burst of runs,
        not part of every run's last batch (which it sent to the store's thread, where a
        script's next submit then waited for it). Nothing is written for a store that has
        stopped by then (the server stops; retention runs again at its start)."""
        if op in self._soon:
            return
        self._soon.add(op)
        asyncio.get_running_loop().call_later(delay_s, self._write_later, op)

    def _write_later(self, op: Any) -> None:
        self._soon.discard(op)
        if self.ref is not None and self.ref.is_alive:
            self.write(op)

    async def drain(self) -> None:
        """Waits until every write made so far is committed."""
        await self._idle.wait()

    async def _flush(self) -> None:
        try:
            # Turns of the loop first, while each adds writes: the handlers already
            # ready add theirs to this batch. A submitted run's row and its first events
            # (written in its actor's first turn) are then one commit, not two, published
            # in one batch; a burst of submissions is a few commits, not two a run.
            size = 0
            for _ in range(BATCH_TURNS_MAX):
                if len(self._pending) == size:
                    break
                size = len(self._pending)
                await asyncio.sleep(0)
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    outcomes = await self._commit(tuple(p.op for p in batch))
                except Exception as exc:
                    log.error("store write of %d ops failed: %s", len(batch), exc)
                    failure = exc if isinstance(exc, TroupeError) else StoreUnavailable(f"the store failed: {exc}")
                    for pending in batch:
                        if not pending.future.done():
                            pending.future.set_exception(failure)
                    continue
                committed = tuple((p.op, outcome) for p, outcome in zip(batch, outcomes, strict=True)
                                  if not isinstance(outcome, Exception))
                self.room.saw(outcomes, bool(committed))
                self._follow_logs(committed)
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

    def _follow_logs(self, committed: tuple[tuple[Any, Any], ...]) -> None:
        """Follows the logs of the runs stored since this client started, from their
        first event, keeping those that ended; forgets what any other write may have
        changed. A run restored from an earlier start numbers its events from 1 again,
        over what its first life stored: it is never followed."""
        logs = self._logs
        for op, _ in committed:
            kind = type(op)
            if kind is AppendEvents:
                log_so_far = logs.pop(op.run_id, None)
                if log_so_far is not None and _carries_on(log_so_far, op):
                    logs[op.run_id] = log_so_far
            elif kind is InsertRun or kind is CreateSweep:  # a run, or a sweep's runs: new logs
                for record in created_runs(op):
                    logs[record.id] = _Log([], 0)
                    if len(logs) > LOGS_FOLLOWED:
                        logs.popitem(last=False)
            elif kind is not UpdateRun:  # a row's fields are not its log
                logs.clear()

    def _kept_stream(self, query: ReadStream) -> tuple[list[EventRow], None, None, bool] | None:
        """``ReadStream``'s answer from a kept log (the run has ended, so it has no queue
        position), or None when there is none or the page would be cut (then the
        database answers)."""
        kept = self._logs[query.run_id]
        if not kept.ended:
            return None
        rows = [row for row in kept.rows if row[0] > query.after]
        if query.cap_bytes > 0 and sum(len(row[4]) + 96 for row in rows) > query.cap_bytes:
            return None
        ended = query.after > 0 and any(row[1] == ev.RUN_FINISHED and row[0] <= query.after for row in kept.rows)
        return rows, None, None, ended

    async def _commit(self, ops: tuple[Any, ...]) -> list[Any]:
        """One outcome per op: its result, or the exception it raised alone."""
        if self._since_checkpoint >= CHECKPOINT_EVERY:
            self._since_checkpoint = 0
            await self._checkpoint()
        here = self._commit_here(ops)
        if here is not None:
            return here
        reply = self._store().submit(Commit(ops))
        outcomes: list[Any] = await asyncio.wait_for(asyncio.wrap_future(reply), WRITE_TIMEOUT_S)
        self._thread_committed = True
        return outcomes

    def _commit_here(self, ops: tuple[Any, ...]) -> list[Any] | None:
        """The batch's outcomes, committed on the loop; None when the thread is to."""
        rows = 0
        for op in ops:
            if type(op) not in INLINE_WRITES:
                return None
            rows += len(op.events) if isinstance(op, AppendEvents) else 1
        if rows > INLINE_MAX_ROWS:
            return None
        outcomes = self._here(lambda writer: writer.commit(ops))
        if outcomes is _THREAD:
            return None
        self._since_checkpoint += 1
        return outcomes

    async def _checkpoint(self) -> None:
        """The write-ahead log copied into the database by the store's thread, between two
        batches: no write of the loop's runs beside the copy, so it copies every frame, and the
        next write starts the log again from its beginning. Told beside the loop's writes,
        it never caught up with them, and the log was never started again: a Ticker at
        interval 0 grew it by 100 MB a second (1.6 GB for a database of 15 MB), which
        filled a small disk in a second and took back any room a full one was given."""
        try:
            await asyncio.wait_for(asyncio.wrap_future(self._store().submit(Checkpoint())), WRITE_TIMEOUT_S)
        except Exception as exc:  # the next one copies what this one did not
            log.warning("copying the store's write-ahead log failed: %s: %s", type(exc).__name__, exc)

    def _here(self, work: Callable[[Writer], Any]) -> Any:
        """``work`` done with the loop's connection; ``_THREAD`` when the thread is to do
        it (no such connection, or it broke)."""
        writer = self._writer()
        if writer is None:
            return _THREAD
        try:
            return work(writer)
        except Exception as exc:
            if not is_broken(exc):
                raise
            # The file is gone or broken: the thread meets the same error, and the store
            # restarts (and with it, later, this connection).
            log.error("the loop's store connection broke: %s", exc)
            self.close()
            return _THREAD

    def _writer(self) -> Writer | None:
        if self._inline is None and self._thread_committed and self.open_inline is not None:
            try:
                self._inline = self.open_inline()
                self._inline.conn.execute("PRAGMA wal_autocheckpoint=0")
            except Exception as exc:
                log.error("cannot open the loop's store connection; the store's thread commits everything: %s", exc)
                self.open_inline = None
        return self._inline
