"""WorkerConnection: one per enrolled worker, named ``workers/<name>``; the one owner of
what the control plane knows of that worker (its hello, inventory, state, missing node
types, the runs it executes).

The websocket lives in its aiohttp handler task, which only authenticates the agent, then
tells this actor ``Attached`` (with an outbox queue the handler drains onto the socket),
``FromWorker`` for every frame, and ``Detached``. This actor answers the hello, routes
run frames to their RunActors and acknowledges them once the RunActor reports them
persisted (``Persisted``), batched: at every heartbeat, after 256 frames, once a run's end
is persisted, or a second after the first unacknowledged one.

Lifecycle: three missed heartbeats, or the socket closing, make the worker
``disconnected``; a reconnect within ``TROUPE_WORKER_RESUME_GRACE_S`` rebinds the runs
the agent reports (it then replays what was not acknowledged); past the grace its runs
end ``interrupted`` (``worker_lost``) and the actor stops normally (transient: not
restarted). After a control-plane restart the root starts this actor without a socket,
already ``disconnected``, with the runs it adopts (``Adopted``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from troupe.actors.base import Actor, Registry, Shutdown, Snapshot
from troupe.actors.errors import WorkerNotConnected
from troupe.actors.placer.book import WorkerOffer
from troupe.actors.placer.messages import CardMemory, Reannounce, WorkerOffline, WorkerOnline
from troupe.actors.run_messages import WorkerBack, WorkerFrames, WorkerGone, WorkerLost
from troupe.actors.worker_view import NO_DEVICES, ConnectionView, LastHeard, Said, offered_devices, said_of
from troupe.protocol import worker as wire
from troupe.subprocess_runner.catalog import OfferedPacks

log = logging.getLogger("troupe.worker")

ACK_EVERY_FRAMES = 256
# A second: an agent keeps a second of frames more, and a run whose Ticker reports every
# 100 ms costs one ack a second instead of ten; a run's end is acknowledged at once.
ACK_AFTER_S = 1.0


@dataclass(frozen=True)
class Attached:
    """The handler authenticated an agent whose first frame was ``hello``."""

    hello: wire.Hello
    outbox: asyncio.Queue[Any]


@dataclass(frozen=True)
class FromWorker:
    """The frames of one websocket message after the hello, parsed and deduplicated."""

    frames: tuple[Any, ...]


@dataclass(frozen=True)
class Detached:
    outbox: asyncio.Queue[Any]


@dataclass(frozen=True)
class Revoked:
    """The worker's credential was revoked: refuse it and close."""


@dataclass(frozen=True)
class Drain:
    pass


@dataclass(frozen=True)
class AssignRun:
    """From a RunActor that was admitted on this worker."""

    run_id: str
    frame: wire.Assign


@dataclass(frozen=True)
class CancelOnWorker:
    run_id: str


@dataclass(frozen=True)
class Persisted:
    """From a RunActor: its frames up to ``counter`` are committed; ``frames`` of them
    since the last report. The agent may now forget them. ``ended``: the run's end is
    among them, and the run is no longer this worker's (only the RunActor knows: an
    ``ended`` frame it drops, replayed or numbered below what it applied, ends nothing)."""

    run_id: str
    counter: int
    frames: int = 1
    ended: bool = False


@dataclass(frozen=True)
class Adopted:
    """From the root at start: a run the last server left executing on this worker."""

    run_id: str
    device: str


@dataclass(frozen=True)
class ReadRecordedOutputs:
    """Ask: a future of what the agent keeps of one of its runs' recorded outputs (node id
    -> outputs; None: it keeps none), or ``WorkerNotConnected`` when the agent is not here."""

    run_id: str
    node_id: str | None = None


@dataclass(frozen=True)
class _Check:
    """The timer's: is a deadline (three missed heartbeats, the grace's end) passed?"""


@dataclass(frozen=True)
class _FlushAcks:
    pass


CLOSE = object()  # put in an outbox: the handler closes the socket
# Frames of runs assigned to another worker (or to none: in-process runs) that one
# connection may send before it is closed as misbehaving.
FOREIGN_LIMIT = 50
# A card's free memory is told to the placer when it moved by this much since last told.
FREE_MEMORY_STEP_MIB = 256


@dataclass(frozen=True)
class Close:
    """Put in an outbox: the handler closes the socket with this code and reason."""

    code: int
    reason: str


class WorkerConnection(Actor):
    publishes_view = True
    # A _Check says itself when it disconnected the worker.
    quiet_messages = frozenset({Persisted, _FlushAcks, Snapshot, ReadRecordedOutputs, CancelOnWorker, _Check})

    def __init__(self, name: str, heartbeat_s: float, grace_s: float, registry: Registry,
                 limit_for: Callable[[str], int] = lambda key: 1, catalog_types: frozenset[str] = frozenset(),
                 catalog_digest: str = "", on_spent: Callable[[str], None] = lambda name: None,
                 offered_packs: OfferedPacks | None = None) -> None:
        super().__init__(f"workers/{name}")
        # A one-shot agent that took its run and exited: it leaves the Workers list (its
        # history stays with its run).
        self._on_spent = on_spent
        self.worker = name
        self._registry, self._limit_for = registry, limit_for
        self._heartbeat_s, self._grace_s = heartbeat_s, grace_s
        self._catalog_types, self._catalog_digest = catalog_types, catalog_digest
        self._offered_packs = offered_packs or OfferedPacks()
        self._types_here: frozenset[str] = frozenset()  # what its runs can execute there
        self._runs: dict[str, str] = {}  # run id -> the device it executes on
        self._took_a_run = False
        self._hello: wire.Hello | None = None
        self._said: tuple[wire.Hello | None, Said | None] | None = None  # the hello last dumped for views
        self._offered: tuple[wire.Hello, dict[str, tuple[str, int]]] | None = None  # its devices, per hello
        self._heard = LastHeard()  # shared by its views: moved on every frame without a new view
        self._made: ConnectionView | None = None  # the newest view
        self._missing: tuple[str, ...] = ()
        self._outbox: asyncio.Queue[Any] | None = None
        self._last_beat = time.monotonic()
        # Not attached yet: a connection started for adoption waits out the grace.
        self._disconnected_at: float | None = time.monotonic()
        # Draining: asked for here (POST .../drain), for as long as this actor lives, or
        # by the agent stopping, which each hello says again (a new agent process is not).
        self._drain_asked = self._agent_draining = False
        self._cancels: set[str] = set()  # cancels asked for while the link was down
        self._acks: dict[str, int] = {}  # run -> highest persisted counter not yet acknowledged
        self._unacked = self._upto = 0  # acks owed; the newest frame_no of this connection
        self._foreign = 0  # frames of this connection for runs that are not this worker's
        self._timer: asyncio.TimerHandle | None = None
        self._tell_check = functools.partial(self.ref.tell, _Check())  # one callable and message for every timer
        self._ack_timer: asyncio.TimerHandle | None = None
        self._free: dict[str, int] = {}  # each card's free memory, from the last heartbeat
        self._free_told: dict[str, int] = {}  # and as the placer was last told it
        # The server is stopping: frames of runs it no longer holds are not acknowledged,
        # as the next start may adopt those runs (a stop that leaves worker runs going).
        self._stopping = False
        self._warm: wire.WarmPool | None = None  # the agent's warm pool, as its last heartbeat said
        # Its artifact outbox, as the last heartbeat said: a full one takes no new runs.
        self._artifacts: wire.ArtifactOutboxUsage | None = None
        self._reads: dict[int, asyncio.Future[Any]] = {}  # read_outputs asked of the agent
        self._read_no = 0

    async def on_start(self) -> None:
        self._schedule()

    async def on_stop(self, reason: str) -> None:
        for timer in (self._timer, self._ack_timer):
            if timer is not None:
                timer.cancel()

    def _schedule(self) -> None:
        """Arm the one timer for the next deadline: three heartbeats after the last frame,
        or the grace's end while away. A beat moves the deadline, not the timer: the check
        that finds the worker alive arms the next, about once in three heartbeats (twice in
        one was 1,600 timers a second in flight at scale x4)."""
        if self._timer is not None:
            self._timer.cancel()
        now = time.monotonic()
        due = (self._last_beat + 3 * self._heartbeat_s if self._outbox is not None
               else (self._disconnected_at or now) + self._grace_s)  # not linked: away since a time
        late = self._heartbeat_s / 20  # a little past it: a timer that fires on time finds it passed
        self._timer = asyncio.get_running_loop().call_later(max(0.0, due - now) + late, self._tell_check)

    async def receive(self, message: Any) -> Any:
        match message:
            case Attached(hello, outbox):
                self._attach(hello, outbox)
            case FromWorker(frames):
                self._from_worker(frames)
            case Detached(outbox):
                if outbox is self._outbox:
                    self._disconnect("the socket closed")
                    if self._hello is not None and self._hello.one_shot and not self._runs:
                        # A one-shot agent that left with nothing in flight has exited: it
                        # will not come back, so its connection goes now, not after the grace.
                        if self._hello.spent or self._took_a_run:
                            self._on_spent(self.worker)
                        self.stop_self("the one-shot agent exited")
            case Persisted(run_id, counter, frames, ended):
                self._acks[run_id] = max(counter, self._acks.get(run_id, 0))
                self._unacked += frames
                if ended:
                    self._runs.pop(run_id, None)
                if run_id in self._runs:
                    self._want_ack()
                else:  # the run ended here: its agent (a one-shot one may exit) hears it at once
                    self._flush_acks()
            case _FlushAcks():
                self._ack_timer = None
                self._flush_acks()
            case Revoked():
                self._tell_runs(WorkerLost())  # its agent stops: nothing of it will come back
                if self._outbox is not None:
                    self._outbox.put_nowait(wire.Refused(code="revoked", reason="this worker's credential was revoked"))
                    self._outbox.put_nowait(CLOSE)
                self.stop_self("revoked")
            case AssignRun(run_id, frame):
                self._runs[run_id] = frame.devices[0] if frame.devices else "cpu"
                self._took_a_run = True
                if self._outbox is not None:
                    self._outbox.put_nowait(frame)
                else:
                    self._tell_runs(WorkerLost(), only={run_id})
            case CancelOnWorker(run_id):
                if self._outbox is not None:
                    self._outbox.put_nowait(wire.CancelRun(run_id=run_id))
                elif run_id in self._runs:
                    self._cancels.add(run_id)  # sent when the agent is back
            case Adopted(run_id, device):
                self._runs[run_id] = device
            case Drain():
                self._drain_asked = True
                if self._outbox is not None:
                    self._outbox.put_nowait(wire.Drain())
                    self._tell_placer()  # draining: no new runs start here
            case Reannounce():
                self._tell_placer()
            case Shutdown(_):
                self._stopping = True
            case _Check():
                self._check()
            case ReadRecordedOutputs(run_id, node_id):
                return self._read_outputs(run_id, node_id)
            case Snapshot():
                return self.make_view().as_json()
            case _:
                raise TypeError(f"{self.name} got an unknown message {message!r}")
        return None

    # The link ----------------------------------------------------------------------
    def _attach(self, hello: wire.Hello, outbox: asyncio.Queue[Any]) -> None:
        if self._outbox is not None and self._outbox is not outbox:
            self._outbox.put_nowait(CLOSE)  # a newer socket of the same worker wins
        self._hello, self._outbox, self._upto, self._foreign = hello, outbox, 0, 0
        self._took_a_run = hello.spent  # a new one-shot agent of the name has taken nothing yet
        self._agent_draining = hello.draining
        # An agent that accepts packs fetches the folder packs' nodes as its runs need them.
        self._types_here = frozenset(hello.node_types) | (self._offered_packs.types if hello.accept_packs
                                                          else frozenset())
        self._missing = tuple(sorted(self._catalog_types - self._types_here))
        self._acks, self._unacked = {}, 0  # acks of the old socket are answered by the replay
        self._last_beat, self._disconnected_at = time.monotonic(), None
        self._heard.at = self._last_beat
        self._schedule()  # the next deadline is three heartbeats on, not the grace's end
        outbox.put_nowait(wire.Welcome(name=self.worker, degraded=self._degraded,
                                       missing_node_types=list(self._missing), heartbeat_s=self._heartbeat_s))
        reported = set(hello.runs)
        # Runs the agent no longer executes (it restarted) are lost; the rest go on and
        # the agent replays what was not acknowledged.
        self._tell_runs(WorkerLost(), only=set(self._runs) - reported)
        for run_id in sorted(reported):
            if run_id in self._runs:
                self._tell_runs(WorkerBack(self.worker), only={run_id})
            else:
                log.warning("worker %s reports run %s, which this server does not hold for it: killing it",
                            self.worker, run_id)
                outbox.put_nowait(wire.KillRun(run_id=run_id))
        for run_id in sorted(self._cancels & set(self._runs)):
            outbox.put_nowait(wire.CancelRun(run_id=run_id))
        self._cancels.clear()
        self._tell_placer()

    @property
    def _draining(self) -> bool:
        return self._drain_asked or self._agent_draining

    @property
    def _degraded(self) -> bool:
        hello = self._hello
        if hello is None:
            return False
        if hello.accept_packs:
            return bool(self._missing) or hello.installed_digest != self._offered_packs.installed_digest
        return hello.catalog_digest != self._catalog_digest

    def _from_worker(self, frames: tuple[Any, ...]) -> None:
        self._last_beat = self._heard.at = time.monotonic()
        by_run: dict[str, list[Any]] = {}
        for frame in frames:
            self._upto = max(self._upto, frame.frame_no)
            if isinstance(frame, wire.Heartbeat):
                self._flush_acks(always=True)
                self._note_free_memory(frame.free_mib)
                self._warm = frame.warm
                full = frame.artifact_outbox is not None and frame.artifact_outbox.full
                was_full = self._artifacts is not None and self._artifacts.full
                self._artifacts = frame.artifact_outbox
                if full != was_full:
                    self._tell_placer()  # a full outbox takes no new runs; one with room again does
            elif isinstance(frame, wire.Drain) and not self._agent_draining:
                self._agent_draining = True  # its agent is stopping: no new runs, the running ones finish
                self._tell_placer()
            elif isinstance(frame, wire.InventoryUpdate) and self._hello is not None:
                self._hello = self._hello.model_copy(update={"inventory": frame.inventory})
            elif isinstance(frame, wire.Outputs):
                waiter = self._reads.pop(frame.request, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(frame.outputs if frame.found else None)
            elif isinstance(frame, wire.RUN_FRAMES):
                by_run.setdefault(frame.run_id, []).append(frame)
        for run_id, run_frames in by_run.items():
            self._route(run_id, tuple(run_frames))

    def _route(self, run_id: str, frames: tuple[wire.RunFrame, ...]) -> None:
        """A worker run's frames take the in-process runs' path: the RunActor numbers
        them, one message and one write for the frames of one batch. Frames of a run this
        server no longer holds (it ended; the ack was lost) are acknowledged, so the agent
        forgets them, except while the server stops: its runs' actors are gone then, and
        the agent keeps their frames for the next start."""
        run = self._registry.lookup(f"runs/{run_id}")
        if run_id in self._runs and run is not None:
            run.tell(WorkerFrames(self.worker, frames))
        elif run is None and not self._stopping:
            self._acks[run_id] = max(max(f.counter for f in frames), self._acks.get(run_id, 0))
            self._unacked += len(frames)
            self._want_ack()
        elif run is None:
            pass  # kept by the agent for the next start
        else:
            log.warning("worker %s sent frames of run %s, which is not assigned to it: dropped", self.worker, run_id)
            self._foreign += len(frames)
            if self._foreign > FOREIGN_LIMIT and self._outbox is not None:
                log.error("worker %s keeps sending frames of runs that are not its own: disconnected", self.worker)
                self._outbox.put_nowait(Close(wire.CLOSE_PROTOCOL, "frames of runs not assigned to this worker"))
                self._disconnect("it sent frames of runs that are not its own")

    def _read_outputs(self, run_id: str, node_id: str | None) -> asyncio.Future[Any]:
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self._outbox is None:
            waiter.set_exception(WorkerNotConnected(f"worker {self.worker} is not connected; its runs' recorded "
                                                    "outputs stay on it and can be read once it is back"))
            return waiter
        self._read_no += 1
        self._reads[self._read_no] = waiter
        self._outbox.put_nowait(wire.ReadOutputs(request=self._read_no, run_id=run_id, node_id=node_id))
        return waiter

    def _want_ack(self) -> None:
        if self._unacked >= ACK_EVERY_FRAMES:
            self._flush_acks()
        elif self._ack_timer is None:
            self._ack_timer = asyncio.get_running_loop().call_later(ACK_AFTER_S, self.ref.tell, _FlushAcks())

    def _flush_acks(self, always: bool = False) -> None:
        if self._outbox is None or not (always or self._acks):
            return
        self._outbox.put_nowait(wire.Ack(upto=self._upto, runs=self._acks))
        self._acks, self._unacked = {}, 0

    def _tell_placer(self) -> None:
        placer = self._registry.lookup("placer")
        if placer is None:
            return
        if self._outbox is None or self._hello is None:
            placer.tell(WorkerOffline(self.worker))
            return
        inventory = self._hello.inventory
        offer = WorkerOffer(self.worker, tuple(self._devices()), inventory.cpus, self._types_here,
                            one_shot=self._hello.one_shot, spent=self._hello.spent or self._took_a_run,
                            deadline=self._hello.deadline, mounts=frozenset(self._hello.mounts),
                            broken_packs=tuple(sorted(self._hello.broken_packs.items())))
        cards = {card.uuid: (card.memory_total_mib, self._free.get(card.uuid, card.memory_free_mib))
                 for card in inventory.cards}
        paused = self._draining or (self._artifacts is not None and self._artifacts.full)
        placer.tell(WorkerOnline(offer, dict(self._devices()), paused, cards))

    def _note_free_memory(self, free_mib: dict[str, int]) -> None:
        """Tells the placer a card's free memory when it moved by a step or more since it
        was last told: a shared card admits by it, and a heartbeat is too often to tell.
        Only the cards this agent reported count: any other name would make a ledger up
        here, or move the free memory of another worker's card."""
        if self._hello is None:
            return
        own = {card.uuid for card in self._hello.inventory.cards}
        free_mib = {uuid: free for uuid, free in free_mib.items() if uuid in own}
        moved = {uuid: free for uuid, free in free_mib.items()
                 if abs(free - self._free_told.get(uuid, -FREE_MEMORY_STEP_MIB)) >= FREE_MEMORY_STEP_MIB}
        self._free.update(free_mib)
        placer = self._registry.lookup("placer")
        if moved and placer is not None:
            self._free_told.update(moved)
            placer.tell(CardMemory(self.worker, moved))

    def _devices(self) -> dict[str, tuple[str, int]]:
        """Made once per hello (limits are settings): every view is made with it."""
        assert self._hello is not None
        if self._offered is None or self._offered[0] is not self._hello:
            self._offered = (self._hello, offered_devices(self.worker, self._hello, self._limit_for))
        return self._offered[1]

    def _tell_runs(self, message: Any, only: set[str] | None = None) -> None:
        targets = set(self._runs) if only is None else only
        for run_id in targets:
            run = self._registry.lookup(f"runs/{run_id}")
            if run is not None:
                run.tell(message)
        if isinstance(message, WorkerLost):
            for run_id in targets:
                self._runs.pop(run_id, None)

    def _disconnect(self, why: str) -> None:
        for waiter in self._reads.values():
            if not waiter.done():
                waiter.set_exception(WorkerNotConnected(f"worker {self.worker} disconnected before it answered"))
        self._reads.clear()
        if self._outbox is not None:
            self._outbox.put_nowait(CLOSE)  # after a Close with a code, if one was put
        self._outbox = None
        if self._disconnected_at is None:
            log.warning("worker %s disconnected: %s", self.worker, why)
            self._disconnected_at = time.monotonic()
            self._schedule()  # the next deadline is the grace's end
            self._tell_placer()
            self._tell_runs(WorkerGone())

    def _check(self) -> None:
        now = time.monotonic()
        if self._outbox is not None and now - self._last_beat > 3 * self._heartbeat_s:
            self._disconnect("three heartbeats missed")
            self.changed()
        if self._disconnected_at is not None and now - self._disconnected_at >= self._grace_s:
            log.warning("worker %s stayed away past the grace of %ss", self.worker, self._grace_s)
            self._tell_runs(WorkerLost())
            self.stop_self("grace expired")
            return
        self._schedule()

    def make_view(self) -> ConnectionView:
        connected = self._outbox is not None
        devices = self._devices() if self._hello else NO_DEVICES  # one mapping per hello, shared by its views
        on = list(self._runs.values())
        running, runs = tuple(on.count(device) for device in devices), tuple(sorted(self._runs))
        if self._said is None or self._said[0] is not self._hello:
            self._said = (self._hello, said_of(self._hello) if self._hello is not None else None)
        said, last = self._said[1], self._made
        # Nothing shown changed (a heartbeat that only says it is alive): the view, and its text, stay.
        if last is not None and last.said is said and (
                last.connected, last.degraded, last.draining, last.missing, last.free, last.devices, last.running,
                last.runs, last.warm, last.artifacts) == (connected, self._degraded, self._draining, self._missing,
                                                          self._free, devices, running, runs, self._warm,
                                                          self._artifacts):
            return last
        self._made = ConnectionView(self.worker, connected, self._degraded, self._draining, self._missing, said,
                                    dict(self._free), devices, running, runs, self._heard, self._warm, self._artifacts)
        return self._made
