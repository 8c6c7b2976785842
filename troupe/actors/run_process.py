"""RunProcess (agent side): one child process executing one run.

The child is an interpreter of its own (multiprocessing *spawn*) started for the run, or
one the agent's zygote forked, taken from the warm pool; either way it executes this run
only. Its pipe is read on the agent's event loop (``_ChildPipe``), and its frames
(``troupe.protocol.pipe``) become frames for the link. Cancel is cooperative
first (``CancelRun`` down the pipe), then a kill after ``kill_grace_s``. A child that dies
without reporting (a segfault, an OOM kill) fails only its run, with the exit signal in
the error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any, cast

from troupe.actors.artifact_outbox import Flush, Wake
from troupe.actors.base import Actor, ActorRef
from troupe.actors.recorded_outputs import OutputsShelf
from troupe.actors.threaded import ThreadActorRef
from troupe.actors.warm_pool import Take, WhyCold
from troupe.protocol import events as ev
from troupe.protocol import jsonsafe, pipe
from troupe.protocol import worker as wire
from troupe.subprocess_runner.errors import PackArchiveRefused
from troupe.subprocess_runner.pack_sync import AgentPacks, PackUnavailable
from troupe.subprocess_runner.run_dirs import remove_left, run_dir_prefix

ARTIFACTS_BEFORE_END_S = 30.0  # how long a run's end waits for its files to go up
# Batches of a child's frames read from its pipe and not yet handed to the link: one
# more may be read while the last is handed on.
_BATCHES_IN_HAND = 2
_ROOM_POLL_S = 0.01  # how often a pipe held back for a full outbox looks for room again
_FRAMES_HELD = 2 * wire.EVENTS_PER_FRAME  # frames read from a pipe and waiting, past which it is not read
log = logging.getLogger("troupe.agent")


@dataclass(frozen=True)
class StopChild:
    """Stop the run: cooperatively first, then killed after the grace; ``kill`` at once."""

    kill: bool = False


@dataclass(frozen=True)
class _FromChild:
    """The child's frames that were waiting in the pipe together (one hop for all)."""

    frames: tuple[pipe.FromChild, ...]


@dataclass(frozen=True)
class _Exited:
    exitcode: int | None


class RunProcess(Actor):
    def __init__(self, assign: wire.Assign, send: Callable[..., None], kill_grace_s: float = 10.0,
                 mounts: dict[str, str] | None = None, control_plane: dict[str, Any] | None = None,
                 shelf: OutputsShelf | None = None, pool: ActorRef | ThreadActorRef | None = None,
                 ddp_cpu_ranks: int = 0, artifact_outbox: dict[str, Any] | None = None,
                 uploader: ActorRef | None = None, data_roots: tuple[str, ...] = (),
                 room: threading.Event | None = None, command_kill_grace_s: float = 5.0,
                 packs: AgentPacks | None = None) -> None:
        super().__init__(f"run/{assign.run_id}")
        self._assign = assign
        self._mounts = mounts or {}  # this machine's storage labels, for the child's file references
        self._data_roots = data_roots  # and the folders its owner lets runs read by absolute path
        self._room = room  # cleared while the link's outbox is too full: the pipe is not read
        # Batches read from the pipe and not yet handed to the link: past a few the pipe
        # is not read, so the link's ``room`` is current when it is read again.
        self._in_hand = 0
        self._pipe: _ChildPipe | None = None
        self._room_polled = False
        # Where the child fetches uploads and sends artifacts: url, unix_socket, credential.
        self._control_plane = control_plane or {}
        self._shelf = shelf if assign.record_outputs else None  # where its node outputs stay
        self._pool = pool  # warm children (``--warm N``), when the agent keeps any
        self._ddp_cpu_ranks = ddp_cpu_ranks  # test-only: DDP ranks on the CPU
        # The agent's artifact outbox ({"folder", "bytes"}) and the actor that uploads from it.
        self._artifact_outbox = artifact_outbox
        self._uploader = uploader
        self._send = send
        self._kill_grace_s = kill_grace_s
        self._command_kill_grace_s = command_kill_grace_s
        self._packs = packs  # where the folder packs its run names are (fetched when the owner allows)
        self._ended = False
        self._cancelled = False
        self._counter = 0  # the child's newest frame counter; an end written here takes the next
        self._artifacts_pending = False  # the run put a file in the agent's outbox
        self._process: Any = None
        self._conn: Any = None

    async def on_start(self) -> None:
        from troupe.subprocess_runner import child

        try:
            # A thread's work when it may fetch; naming none, it only lists the agent's own.
            pack_paths = [] if self._packs is None else self._packs.paths_for({}) if not self._assign.packs \
                else await asyncio.to_thread(self._packs.paths_for, self._assign.packs)
        except (PackUnavailable, PackArchiveRefused, OSError) as exc:  # said in the run's error; nothing loaded
            if isinstance(exc, OSError):  # its cache could not be written (a full disk, a file in its place)
                exc = PackUnavailable(f"the run's packs could not be unpacked on this worker: {exc}")
            log.error("run %s: %s", self._assign.run_id, exc)
            self._ended = True
            self._send(wire.RunEnded(run_id=self._assign.run_id, counter=1, status="failed", error=str(exc)))
            self.stop_self("its packs are not here")
            return
        assign = {**self._assign.model_dump(), "mounts": self._mounts, "control_plane": self._control_plane,
                  "ddp_cpu_ranks": self._ddp_cpu_ranks, "artifact_outbox": self._artifact_outbox,
                  "data_roots": list(self._data_roots), "command_kill_grace_s": self._command_kill_grace_s,
                  "pack_paths": pack_paths}
        warm = await (await self._pool.ask(Take())) if self._pool is not None and not _sets_env(assign) else None
        if warm is not None:
            try:
                warm.conn.send(pipe.StartRun(assign))
                self._process, self._conn = warm.process, warm.conn
            except OSError:  # it died after the pool handed it over: start one cold
                warm.conn.close()
                warm = None
        if warm is None:
            assign["cold_because"] = await self._cold_because(assign)  # said by a warm script of its run
            context = multiprocessing.get_context("spawn")
            parent, child_end = context.Pipe()
            self._conn = parent
            self._process = context.Process(target=child.main, args=(child_end, assign),
                                            name=f"troupe-run-{self._assign.run_id[:8]}", daemon=False)
            self._process.start()
            child_end.close()
        # The loop reads the pipe: a frame reaches this actor in one wake-up, not a
        # reader thread's and then the loop's. The pipe is a socket pair; the transport
        # reads a copy of its descriptor (``conn`` still sends the cancel).
        sock = socket.socket(fileno=os.dup(self._conn.fileno()))
        reader = self._pipe = _ChildPipe(self._may_hand_on, self._from_pipe, self._pipe_ended)
        await asyncio.get_running_loop().connect_accepted_socket(lambda: reader, sock)

    async def _cold_because(self, assign: dict[str, Any]) -> str:
        """Why this run's process is not forked from the zygote, in words for its warm scripts."""
        if self._pool is None:
            return "the agent keeps no zygote (it was started without --warm N)"
        if _sets_env(assign):
            return "the run sets resources.env, which its interpreter must have before it imports anything"
        return str(await self._pool.ask(WhyCold()))

    async def on_failure(self, error: BaseException) -> None:
        """A fault of this actor (not of the run's code) still ends the run, and its
        process: the control plane would otherwise wait on it for ever."""
        if not self._ended:
            self._ended = True
            self._send(wire.RunEnded(run_id=self._assign.run_id, counter=self._counter + 1, status="failed",
                                     error=f"the agent failed to run it: {type(error).__name__}: {error}"))
        self._kill()

    async def on_stop(self, reason: str) -> None:
        # The agent is stopping: the child is asked to stop, then killed after the grace,
        # so no run outlives its agent.
        if self._process is None or not self._process.is_alive():
            return
        with contextlib.suppress(OSError):
            self._conn.send(pipe.CancelRun())
        await asyncio.to_thread(self._process.join, self._kill_grace_s)
        self._kill()
        if self._pipe is not None:
            self._pipe.close()

    def _may_hand_on(self) -> bool:
        """Whether the pipe may hand this actor another batch: few are in hand (one
        handled asks again), and the link's outbox has room (else the child waits on its
        full pipe: slowed, nothing dropped; the pipe asks again every few milliseconds)."""
        if self._in_hand >= _BATCHES_IN_HAND:
            return False
        if self._room is not None and not self._room.is_set():
            if not self._room_polled:
                self._room_polled = True
                asyncio.get_running_loop().call_later(_ROOM_POLL_S, self._pump_pipe)
            return False
        return True

    def _from_pipe(self, frames: tuple[pipe.FromChild, ...]) -> None:
        self._in_hand += 1
        self.ref.tell(_FromChild(frames))

    def _pump_pipe(self) -> None:
        self._room_polled = False
        if self._pipe is not None:
            self._pipe.pump()

    def _pipe_ended(self) -> None:
        # Its last frames came before the end (the protocol delivered them first).
        asyncio.get_running_loop().create_task(self._await_exit(), name=f"exit-{self._assign.run_id[:8]}")

    async def _await_exit(self) -> None:
        await asyncio.to_thread(self._process.join)
        self.ref.tell(_Exited(self._process.exitcode))

    async def receive(self, message: Any) -> Any:
        run_id = self._assign.run_id
        match message:
            case _FromChild(from_child):
                try:
                    await self._hand_on(from_child)
                finally:
                    self._in_hand -= 1
                    if self._pipe is not None:
                        self._pipe.pump()
            case _Exited(code):
                if code != 0:  # a child that died left its folder (checkpoints and all) behind
                    await asyncio.to_thread(remove_left, run_dir_prefix(run_id))
                if not self._ended and self._cancelled:
                    self._send(wire.RunEnded(run_id=run_id, counter=self._counter + 1, status="cancelled", error=(
                        f"the run did not stop within {self._kill_grace_s:g} s of the cancel "
                        "(TROUPE_WORKER_KILL_GRACE_S); its process was killed")))
                elif not self._ended:
                    how = (f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"code {code}"
                           if code is not None else "its exit status was lost with the zygote that forked it")
                    self._send(wire.RunEnded(run_id=run_id, counter=self._counter + 1, status="failed",
                                             error=f"the run's process died ({how}) before it finished"))
                self.stop_self("exited")
            case StopChild(kill):
                if kill:
                    self._ended = True  # nobody waits for its end any more
                    self._kill()
                    return None
                self._cancelled = True
                with contextlib.suppress(OSError):  # the child is already gone
                    self._conn.send(pipe.CancelRun())
                asyncio.get_running_loop().call_later(self._kill_grace_s, self._kill)
            case _:
                raise TypeError(f"{self.name} got an unknown message {message!r}")
        return None

    async def _hand_on(self, from_child: tuple[pipe.FromChild, ...]) -> None:
        run_id = self._assign.run_id
        frames = self._frames(from_child)
        ended = [f for f in frames if isinstance(f, wire.RunEnded)]
        if ended and self._uploader is not None and self._artifacts_pending:
            # The run's files go up first, so a run that ended has its artifacts
            # stored, or says which are still pending. With none to send, its last
            # events and its end go up as one message (one commit up there); a run
            # that put none in the outbox asks the uploader nothing.
            uploaded = await self._uploader.ask(Flush(ARTIFACTS_BEFORE_END_S, run_id))
            if not uploaded.done():
                self._send(*(f for f in frames if not isinstance(f, wire.RunEnded)))
                await uploaded  # meanwhile the control plane takes its events
                frames = list(ended)
        self._send(*frames)

    def _frames(self, from_child: tuple[pipe.FromChild, ...]) -> list[wire.RunFrame]:
        """The child's frames as wire frames: its consecutive events as ``events`` frames
        (up to ``EVENTS_PER_FRAME`` each), its end as ``ended``. Built without validation:
        the child is this agent's own code, and the control plane validates every frame on
        arrival anyway."""
        run_id = self._assign.run_id
        frames: list[wire.RunFrame] = []
        events: list[tuple[str, str | None, str]] = []

        def flush() -> None:
            if events:
                frames.append(wire.RunEvents.model_construct(run_id=run_id, counter=self._counter,
                                                             events=list(events)))
                events.clear()

        for frame in from_child:
            match frame:
                case pipe.ChildEvent(counter, kind, node_id, payload):
                    self._counter = counter
                    if kind == ev.ARTIFACT_PENDING and self._uploader is not None:
                        self._artifacts_pending = True
                        self._uploader.tell(Wake())  # it is in the outbox: send it on
                    if kind == ev.NODE_FINISHED and self._shelf is not None and node_id is not None:
                        self._shelf.record(run_id, node_id, payload.get("outputs") or {})
                    events.append((kind, node_id, jsonsafe.dumps_flat(payload)))
                    if len(events) == wire.EVENTS_PER_FRAME:
                        flush()
                case pipe.ChildEnded(counter, status, error, node_id, peak_mib, out_of_memory):
                    flush()
                    self._ended, self._counter = True, counter
                    frames.append(wire.RunEnded(run_id=run_id, counter=counter, status=status, error=error,
                                                node_id=node_id, peak_memory_mib=peak_mib,
                                                out_of_memory=out_of_memory))
                case _:
                    raise TypeError(f"run child {run_id} sent an unknown frame {frame!r}")
        flush()
        return frames

    def _kill(self) -> None:
        if self._process is not None and self._process.is_alive():
            log.warning("killing the process of run %s", self._assign.run_id)
            # A command node's program runs in a process group of its own, which a kill of
            # the child alone would leave behind: its groups go first, while the tree
            # still shows whose they are.
            groups = _descendant_groups(self._process.pid)
            self._process.kill()
            for pgid in groups:
                with contextlib.suppress(OSError):
                    os.killpg(pgid, signal.SIGKILL)


class _ChildPipe(asyncio.Protocol):
    """The agent's end of a run child's pipe, read on the event loop: the frames of
    ``multiprocessing.connection`` (a 4-byte big-endian length, or -1 and an 8-byte
    one, then the pickle), each a list of the run's frames or a lone frame. They are
    handed on in batches of at most ``EVENTS_PER_FRAME``, each when ``may_hand_on``
    says so, so that the link's ``room`` is current before the next: a read of the
    socket may bring thousands. Past ``_FRAMES_HELD`` frames waiting here the socket is
    not read, and the child waits on its pipe. Its end is told once all it sent was
    handed on."""

    def __init__(self, may_hand_on: Callable[[], bool], hand_on: Callable[[tuple[pipe.FromChild, ...]], None],
                 ended: Callable[[], None]) -> None:
        self._may_hand_on = may_hand_on
        self._hand_on = hand_on
        self._ended = ended
        self._buffer = bytearray()
        self._frames: deque[pipe.FromChild] = deque()
        self._transport: asyncio.Transport | None = None
        self._lost = False
        self._told_end = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast("asyncio.Transport", transport)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        while len(buffer) >= 4:
            size, head = struct.unpack_from("!i", buffer)[0], 4
            if size == -1:
                if len(buffer) < 12:
                    break
                size, head = struct.unpack_from("!Q", buffer, 4)[0], 12
            if len(buffer) < head + size:
                break
            said = ForkingPickler.loads(bytes(buffer[head:head + size]))
            del buffer[:head + size]
            if isinstance(said, list):
                self._frames.extend(said)
            else:
                self._frames.append(said)
        self.pump()

    def eof_received(self) -> bool:
        return False  # the child closed its end: the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self.pump()

    def pump(self) -> None:
        frames = self._frames
        while frames and self._may_hand_on():
            self._hand_on(tuple(frames.popleft() for _ in range(min(len(frames), wire.EVENTS_PER_FRAME))))
        transport = self._transport
        if self._lost:
            if not frames and not self._told_end:
                self._told_end = True
                self._ended()
        elif transport is not None and not transport.is_closing():
            if len(frames) >= _FRAMES_HELD and transport.is_reading():
                transport.pause_reading()
            elif len(frames) < _FRAMES_HELD and not transport.is_reading():
                transport.resume_reading()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


def _descendant_groups(pid: int) -> set[int]:
    """The process groups descendants of ``pid`` belong to (Linux's /proc; elsewhere none)."""
    parents: dict[int, tuple[int, int]] = {}  # pid -> (parent, group)
    for entry in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = entry.read_text().rsplit(")", 1)[1].split()
            parents[int(entry.parent.name)] = (int(fields[1]), int(fields[2]))
    below, frontier = set(), [pid]
    while frontier:
        parent = frontier.pop()
        for child, (ppid, _) in parents.items():
            if ppid == parent and child not in below:
                below.add(child)
                frontier.append(child)
    own = os.getpgid(0)  # the agent's (and the child's) own group is not the child's to kill
    return {parents[p][1] for p in below} - {own}


def _sets_env(assign: dict[str, Any]) -> bool:
    """A node that sets environment variables (``resources.env``, such as XLA_FLAGS) needs
    them before anything is imported: its run starts in a fresh child."""
    return any((node.get("resources") or {}).get("env") for node in assign["graph"].get("nodes", []))
