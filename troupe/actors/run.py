"""RunActor: one per active run, the owner of its events' ``seq`` and its status.

States: queued -> running -> succeeded | failed | cancelled | interrupted. When the
graph ends the slot and lane counters are released *first*, then the final status and
``run_finished`` are written, so a client that sees the run end and submits again is
never refused for a slot the finished run still held (two running rows may show on a
limit-1 key for that moment; nothing runs twice).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from troupe.actors import executor
from troupe.actors.base import Actor, Registry, Shutdown
from troupe.actors.cpus import LedgerGate
from troupe.actors.executor import GraphEnded, NodeEvents
from troupe.actors.placer.messages import Released
from troupe.actors.placer.queue import Beside, Occupying, Release
from troupe.actors.run_assign import assign_frame, local_execute
from troupe.actors.run_effects import EventRows, opening_events, peak_row
from troupe.actors.run_messages import (
    Abandon,
    ArtifactArrived,
    Cancel,
    Discard,
    NeverFits,
    Placement,
    ReportOccupancy,
    Start,
    WorkerBack,
    WorkerFailed,
    WorkerFrames,
    WorkerGone,
    WorkerLost,
)
from troupe.actors.run_writes import RetryWrites, RunWrites, Unwritten, Written
from troupe.actors.store import StoreClient
from troupe.actors.store.events import AppendEvents
from troupe.actors.store.retention import Prune
from troupe.actors.store.runs import UpdateRun
from troupe.actors.worker import AssignRun, CancelOnWorker, Persisted
from troupe.protocol import events as ev
from troupe.protocol import jsonsafe
from troupe.protocol import worker as wire
from troupe.protocol.run_record import Adoption, RunRecord
from troupe.protocol.settings import Settings
from troupe.subprocess_runner import pack_watch
from troupe.subprocess_runner.engine import ExecutableGraph
from troupe.subprocess_runner.fingerprint import CONTROL_PLANE, execution_facts
from troupe.subprocess_runner.node_cache import NodeCache

log = logging.getLogger("troupe.run")

# Retention follows a run's end by this much, once for all the runs that ended meanwhile.
RETENTION_DELAY_S = 0.1


@dataclass(frozen=True)
class _OneShotTimeout:
    """A run for a one-shot agent has waited for one as long as it may."""


class RunActor(Actor):
    def __init__(
        self,
        record: RunRecord,
        graph: ExecutableGraph,
        store: StoreClient,
        registry: Registry,
        settings: Settings,
        executor_pool: Executor,
        node_pool: Executor | None = None,
        node_cache: NodeCache | None = None,
        adoption: Adoption | None = None,
    ) -> None:
        super().__init__(f"runs/{record.id}")
        self._executor_pool = executor_pool
        self._node_pool = node_pool
        self._node_cache = node_cache
        self.run_id = record.id
        # As admitted; once a pool places it, the record of where it went (still frozen).
        self._record = record
        self._adoption = adoption
        self._holds: tuple[tuple[str, str], ...] = adoption.holds if adoption is not None else ()
        self._graph = graph
        self._store = store
        self._registry = registry
        self._settings = settings
        self._status = ev.QUEUED
        self._next_seq = 1
        # Made when this process executes it: a worker run, or one that never starts,
        # has no executor to stop (and a lab queues thousands of runs).
        self._cancel: threading.Event | None = None
        self._stop_as: str | None = None  # the status a requested stop ends in
        self._stop_reason: str | None = None
        self._released = False
        self._caps: dict[str, int] = {}  # the shared cards it holds: device -> card total MiB
        self._outbox: list[dict[str, Any]] = []
        self._worker: str | None = record.worker
        # A worker run: the highest frame counter applied (persisted with the events), the
        # frames applied since the last write, and the newest write in flight.
        self._applied = adoption.worker_counter if adoption is not None else 0
        self._frames = 0
        self._events_dropped = 0  # by a worker's outbox across outages, in all
        self._open_nodes: dict[str, None] = {}  # started and not yet ended, in order (worker runs)
        self._row_ahead: dict[str, Any] = {}  # the start's row fields, written with the end's
        self._writes = RunWrites(self.run_id, record.study_id, store, registry, self.ref)
        self._effects = EventRows(self.run_id, record.record_outputs, settings.recorded_outputs_keep)

    async def on_start(self) -> None:
        record = self._record
        if self._adoption is not None:
            # The last server left this run executing on its worker: the log goes on
            # from the last persisted seq once the worker reports the run again.
            self._status = ev.DISCONNECTED
            self._next_seq = self._adoption.next_seq
            self._write(UpdateRun(self.run_id, {"status": ev.DISCONNECTED}))
            self._emit(ev.WARNING, None, {"message": f"the control plane restarted; waiting for worker "
                                                     f"{self._worker} to report this run", "code": "worker_adopting"})
            self._flush_events()
            return
        if record.one_shot:  # a batch job's agent may never come: the wait is bounded
            waited = time.time() - datetime.fromisoformat(record.created_at).timestamp()
            asyncio.get_running_loop().call_later(max(0.0, self._settings.worker_one_shot_queue_timeout_s - waited),
                                                  self.ref.tell, _OneShotTimeout())
        self._emit(ev.RUN_QUEUED, None, {"queue_key": str(record.queue_key), "lane": record.lane})
        for kind, node_id, payload in opening_events(record):
            self._emit(kind, node_id, payload)
        self._flush_events()

    async def receive(self, message: Any) -> Any:
        try:
            return self._dispatch(message)
        finally:
            self._flush_events()

    def _dispatch(self, message: Any) -> Any:
        match message:
            case Start(worker, device, holds, caps):
                self._caps = dict(caps)
                self._start(worker, device, holds)
            case WorkerFrames(worker, frames):
                self._on_worker_frames(worker, frames)
            case NodeEvents(events, settled):
                for event in events:
                    self._on_node_event(event.type, event.node_id, event.payload)
                if settled is not None:  # their producer goes on once they are stored (held while the disk is full)
                    self._flush_events()
                    self._writes.after_settled(functools.partial(settled, len(events)))
            case GraphEnded(outcome):
                self._finish(outcome.status, outcome.error, outcome.node_id,
                             memory=(outcome.peak_memory_mib, False, outcome.out_of_memory))
            case Cancel(reason):
                return self._request_stop(ev.CANCELLED, reason)
            case ArtifactArrived(worker, node_id, kind, path, size, sha256):
                if worker != self._worker or self._status not in (ev.RUNNING, ev.DISCONNECTED) or \
                        self._effects.was_removed(path):  # (a removed one: the store refuses it)
                    return None
                self._on_node_event(ev.ARTIFACT, node_id, {"kind": kind, "path": path, "backend": "transfer",
                                                           "label": None, "size": size, "sha256": sha256})
                return self._writes.last
            case _OneShotTimeout() if self._status == ev.QUEUED:
                self._finish(ev.INTERRUPTED, f"no one-shot agent took the run within "
                             f"{self._settings.worker_one_shot_queue_timeout_s:g} s "
                             "(TROUPE_WORKER_ONE_SHOT_QUEUE_TIMEOUT_S)", None, reason="one_shot_queue_timeout")
            case NeverFits(reason) if self._status == ev.QUEUED:
                self._finish(ev.FAILED, reason, None, reason="memory_budget_too_large")
            case _OneShotTimeout() | NeverFits():
                pass  # it started meanwhile
            case Unwritten() | RetryWrites() | Written():
                self._writes.handle(message)
            case Discard():
                self._discard()
            case Shutdown(leave_worker_runs):
                if leave_worker_runs and (self._worker is not None or self._status == ev.QUEUED):
                    self.stop_self("left for the next start")  # its row stays as it is
                else:
                    self._request_stop(ev.INTERRUPTED)
            case WorkerGone() | WorkerBack() | WorkerLost() | WorkerFailed():
                self._on_worker_link(message)
            case Placement():
                record = self._record
                return {"run_id": self.run_id, "status": self._status, "lane": record.lane,
                        "editor_session": record.editor_session, "worker": self._worker,
                        "seeded": record.seeded and self._worker is None,
                        "holds": list(self._holds), "released": self._released,
                        "budget_mib": record.memory_budget_mib}
            case Abandon():
                self._finish(ev.INTERRUPTED, "the server stopped; the run did not stop within the grace period", None)
            case ReportOccupancy():
                queue = self._registry.lookup(f"queues/{self._record.queue_key}")
                if queue is not None and self._status in (ev.RUNNING, ev.DISCONNECTED) and not self._released:
                    who = self._record.submitted_by or ""
                    queue.tell(Occupying(self.run_id, who) if self._record.lane == ev.LANE_QUEUED
                               else Beside(self.run_id, who))
            case _:
                raise TypeError(f"{self.name} got an unknown message {message!r}")
        return None

    def _on_worker_link(self, message: WorkerGone | WorkerBack | WorkerLost | WorkerFailed) -> None:
        """What the worker connection says of the link of a worker run."""
        match message:
            case WorkerGone():
                if self._status == ev.RUNNING:
                    self._status = ev.DISCONNECTED
                    self._write(UpdateRun(self.run_id, {"status": ev.DISCONNECTED}))
                    self._emit(ev.WARNING, None, {"message": f"worker {self._worker} disconnected",
                                                  "code": "worker_disconnected"})
            case WorkerBack(worker):
                if self._status == ev.DISCONNECTED and worker == self._worker:
                    self._status = ev.RUNNING
                    self._write(UpdateRun(self.run_id, {"status": ev.RUNNING}))
            case WorkerLost():
                self._finish(ev.INTERRUPTED, "worker_lost", None, reason="worker_lost")
            case WorkerFailed(worker):
                if worker == self._worker:
                    self._finish(ev.INTERRUPTED, "worker_failed", None, reason="worker_failed")

    # Lifecycle ---------------------------------------------------------------------
    def _start(self, worker: str | None, device: str | None, holds: tuple[tuple[str, str], ...] = ()) -> None:
        if self._status != ev.QUEUED:
            return  # cancelled while the grant was on its way; the slot is already back
        changed = pack_watch.changed(self._graph.folder_packs())  # in-process or on a worker alike (pack_watch)
        if changed is not None:
            return self._finish(ev.FAILED, changed, None, reason="pack_changed")
        self._status = ev.RUNNING
        fields: dict[str, Any] = {"status": ev.RUNNING, "started_at": ev.utc_now()}
        if holds:
            self._holds = tuple(holds)
            fields["holds"] = [list(hold) for hold in holds]
        record = self._record
        started: dict[str, Any] = {"device": device or record.device, "seed": record.seed}
        if self._caps:
            started["memory_budget_mib"] = record.memory_budget_mib
        if worker is not None:  # placed by target ``any``
            self._worker = fields["worker"] = started["worker"] = worker
            fields["device"] = started["device"]
            # ``auto`` became the device it was placed on.
            self._record = record.with_changes(worker=worker, device=started["device"], devices=(
                (started["device"],) if len(record.devices) == 1 else record.devices))
        if self._worker is not None:
            self._write(UpdateRun(self.run_id, fields))
            self._emit(ev.RUN_STARTED, None, started)
            self._send_to_worker("assign")
            return
        # This process executes it (a worker's child reports its own facts).
        fields["execution_facts"] = self._effects.took(execution_facts(CONTROL_PLANE, self._graph.folder_packs()))
        self._emit(ev.RUN_STARTED, None, started)
        execute = local_execute(self._record, self._graph, self._settings, self._executor_cancel(), self._node_pool,
                                self._cpu_gate(), self._node_cache)
        walked = executor.start(self._executor_pool, execute, asyncio.get_running_loop(), self.ref)
        if walked is None:
            self._write(UpdateRun(self.run_id, fields))
            return
        # A few quick nodes, walked already: the row goes from queued to its end in one
        # update, written after the events in one commit. No reader could have seen it
        # running, and moving it through "running" as well rewrote its index entries twice.
        self._row_ahead = fields
        self._dispatch(NodeEvents(walked.events))
        self._dispatch(GraphEnded(walked.outcome))

    def _send_to_worker(self, what: str) -> None:
        connection = self._registry.lookup(f"workers/{self._worker}")
        if connection is None:
            if what == "assign":
                self._finish(ev.INTERRUPTED, "worker_lost", None, reason="worker_lost")
            return
        if what == "assign":
            connection.tell(AssignRun(self.run_id, assign_frame(self._record, self._settings, self._caps, self._graph)))
        else:
            connection.tell(CancelOnWorker(self.run_id))

    def _cpu_gate(self) -> LedgerGate | None:
        ledger = self._registry.lookup("cpus")
        return LedgerGate(asyncio.get_running_loop(), ledger) if ledger is not None else None

    def _request_stop(self, final_status: str, reason: str | None = None) -> dict[str, Any]:
        """Replies the run's status and ``repeat``: a stop was already asked for (a second
        cancel has no effect, and a sweep does not count it again)."""
        if self._status in ev.TERMINAL_STATES:  # ended, its actor not gone yet: nothing to stop
            return {"run_id": self.run_id, "status": self._status, "repeat": True}
        if self._status == ev.QUEUED:
            message = "cancelled before it started" if final_status == ev.CANCELLED else "the server stopped"
            self._finish(final_status, reason or message, None)
            return {"run_id": self.run_id, "status": final_status, "repeat": False}
        repeat = self._stop_as is not None
        if not repeat:
            self._stop_as = final_status
            self._stop_reason = reason
        self._stop_executor()
        if self._worker is not None:
            self._send_to_worker("cancel")
        return {"run_id": self.run_id, "status": self._status, "repeat": repeat}

    def _executor_cancel(self) -> threading.Event:
        self._cancel = threading.Event()
        return self._cancel

    def _stop_executor(self) -> None:
        if self._cancel is not None:
            self._cancel.set()

    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        queue = self._registry.lookup(f"queues/{self._record.queue_key}")
        if queue is not None and (self._record.lane == ev.LANE_QUEUED or self._record.submitted_by):
            queue.tell(Release(self.run_id))  # an interactive run counted there beside the line
        placer = self._registry.lookup("placer")
        if placer is not None:
            placer.tell(Released(self.run_id))

    def _finish(self, status: str, error: str | None, node_id: str | None, reason: str | None = None,
                memory: tuple[int | None, bool, bool] | None = None) -> None:
        """``memory``: the run's peak in MiB, whether it is exact (its own process), and
        whether it ran out of memory."""
        if self._status in ev.TERMINAL_STATES:
            return
        # A cancelled engine outcome ends as whatever stop was asked for.
        if status == ev.CANCELLED and self._stop_as is not None:
            status = self._stop_as
            if status == ev.INTERRUPTED:
                error = "the server stopped while this run was executing"
            elif self._stop_reason:
                error = self._stop_reason
        self._release()
        # A worker's child that died (or a worker lost) leaves nodes started and never
        # ended: each ends failed, with the run's error, before the run does.
        for open_node in self._open_nodes:
            self._emit(ev.NODE_FAILED, open_node, {"error": error or f"the run ended {status}"})
        self._open_nodes.clear()
        self._status = status
        fields: dict[str, Any] = {**self._row_ahead, "status": status, "finished_at": ev.utc_now(), "error": error}
        self._row_ahead = {}
        payload: dict[str, Any] = {"status": status, "error": error}
        if memory is not None and memory[0] is not None:
            fields.update(peak_memory_mib=memory[0], peak_memory_exact=memory[1], out_of_memory=memory[2])
        if node_id is not None:
            payload["node_id"] = node_id
        if reason is not None:
            payload["reason"] = reason
        # The last event first: the run's events since its last write then go as one, and
        # its row's end follows them in the same commit (one handler's writes are one batch).
        self._emit(ev.RUN_FINISHED, None, payload)
        self._write(UpdateRun(self.run_id, fields))
        peak = peak_row(self._record, status, memory)
        if peak is not None:
            self._write(peak)
        if self._settings.run_retention_keep_last >= 0:
            self._store.write_soon(Prune(self._settings.run_retention_keep_last), RETENTION_DELAY_S)
        # It stops once its final writes are stored (the run keeps no slot meanwhile).
        self._writes.then(functools.partial(self.ref.stop, "finished"))

    def _discard(self) -> None:
        self._writes.discard()
        self._outbox.clear()
        self._stop_executor()
        self._release()
        self._status = ev.FAILED
        self.stop_self("not stored")

    async def on_failure(self, error: BaseException) -> None:
        # A crashed RunActor fails its run; it is never silently retried.
        self._stop_executor()
        self._release()
        if self._status not in ev.TERMINAL_STATES:
            message = f"internal error: {type(error).__name__}: {error}"
            self._write(UpdateRun(self.run_id, {"status": ev.FAILED, "finished_at": ev.utc_now(),
                                                      "error": message}))
            self._emit(ev.RUN_FINISHED, None, {"status": ev.FAILED, "error": message, "internal": True})
            self._flush_events()

    # Worker frames -----------------------------------------------------------------
    def _on_worker_frames(self, worker: str, frames: tuple[wire.RunFrame, ...]) -> None:
        """Applies each frame once: a frame whose counter was applied already (replayed
        after a reconnect, or sent twice) is dropped, and so is one from a worker this
        run was not assigned to. Applied frames are acknowledged once persisted."""
        if worker != self._worker:
            log.warning("run %s: dropped frames from worker %s; it executes on %s", self.run_id, worker, self._worker)
            return
        for frame in frames:
            if frame.counter <= self._applied or self._status in ev.TERMINAL_STATES:
                continue
            self._frames += 1
            applied, self._applied = self._applied, frame.counter
            if isinstance(frame, wire.RunEvents):  # from the first event not applied yet
                for kind, node_id, text in frame.events[max(0, applied - frame.first + 1):]:
                    self._on_worker_event(kind, node_id, text)
            elif isinstance(frame, wire.Gap):
                self._dropped(frame.dropped)
            else:
                self._finish(frame.status, frame.error, frame.node_id,
                             memory=(frame.peak_memory_mib, True, frame.out_of_memory))
        self._flush_events()
        self._acknowledge()

    def _dropped(self, count: int) -> None:
        """A worker's outbox overflowed: what was lost is said in the run's events and in
        its row's warnings, where a list and ``show`` read it."""
        self._events_dropped += count
        warning = {"message": f"the worker's outbox overflowed while the link to the control plane was down: "
                              f"{self._events_dropped} events of this run were dropped (TROUPE_AGENT_OUTBOX_MB)",
                   "code": "events_dropped", "count": self._events_dropped}
        self._emit(ev.WARNING, None, {**warning, "count": count})
        self._write(UpdateRun(self.run_id, {"warnings": [*self._record.warnings, warning]}))

    def _acknowledge(self) -> None:
        """Tells the worker connection, once the newest write committed, which counter
        it may acknowledge (a write commits after every write before it)."""
        persisted = Persisted(self.run_id, self._applied, max(self._frames, 1), self._status in ev.TERMINAL_STATES)
        self._frames = 0
        self._writes.after_committed(functools.partial(_tell, self._registry, f"workers/{self._worker}", persisted))

    def _on_worker_event(self, kind: str, node_id: str | None, text: str) -> None:
        """An event of an ``events`` frame, its payload still JSON text (kept as the
        stored encoding when nothing in it has to change)."""
        try:
            payload = jsonsafe.loads(text)
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            self._refuse(kind, node_id, "its payload is not a JSON object")
            return
        self._on_node_event(kind, node_id, payload, remote=True, text=text)

    # Events ------------------------------------------------------------------------
    def _on_node_event(self, kind: str, node_id: str | None, payload: dict[str, Any], remote: bool = False,
                       text: str | None = None) -> None:
        if kind == ev.CODE or (kind == ev.ENVIRONMENT and remote):  # facts of the run, not events of its log
            self._write(self._effects.fact_row(kind, node_id, payload))
            return
        payload, encoded, refused = ev.admit_event(kind, payload, text)
        if refused is None and remote and kind in (ev.ARTIFACT, ev.ARTIFACT_PENDING):
            refused = ev.worker_artifact_problem(payload, pending=kind == ev.ARTIFACT_PENDING)
        if refused is not None:
            self._refuse(kind, node_id, refused)
            return
        if remote and node_id is not None:
            if kind == ev.NODE_STARTED:
                self._open_nodes[node_id] = None
            elif kind in (ev.NODE_FINISHED, ev.NODE_FAILED):
                self._open_nodes.pop(node_id, None)
        row = self._effects.row_for(kind, node_id, payload, remote, self._worker)
        if row is not None:
            self._write(row)
        self._emit(kind, node_id, payload, encoded)

    def _refuse(self, kind: str, node_id: str | None, why: str) -> None:
        log.warning("run %s: refused a %s event of node %s: %s", self.run_id, kind, node_id, why)
        self._emit(ev.WARNING, node_id, {"message": f"a {kind} event was refused: {why}",
                                         "code": "event_rejected", "kind": kind})

    def _emit(self, kind: str, node_id: str | None, payload: dict[str, Any], encoded: str | None = None) -> None:
        # The events of one write share the time the first of them was taken: a frame
        # of 500 metric points came in one piece, and a timestamp each was a tenth of
        # what the control plane spent on a relayed event.
        ts = self._outbox[0]["ts"] if self._outbox else None
        self._outbox.append(ev.make_event(self._next_seq, kind, node_id, payload,
                                          self._settings.run_event_payload_cap_bytes, encoded, ts))
        self._next_seq += 1

    def _flush_events(self) -> None:
        """The events of one message go to the store as one write."""
        if self._outbox:
            events, self._outbox = tuple(self._outbox), []
            counter = self._applied if self._worker is not None else None
            self._send(AppendEvents(self.run_id, events, counter))

    def _write(self, op: Any) -> None:
        # Events emitted so far go first, so rows and events reach the disk in order.
        self._flush_events()
        self._send(op)

    def _send(self, op: Any) -> None:
        self._writes.send(op)




def _tell(registry: Registry, name: str, message: Any) -> None:
    ref = registry.lookup(name)
    if ref is not None:
        ref.tell(message)


__all__ = ["RunActor"]
