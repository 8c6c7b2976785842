"""Link (agent side): the agent's one outbound socket to ``/ws/worker``. It never
listens. It says hello, sends heartbeats, and reconnects with backoff while the control
plane is unreachable; a final refusal (wrong version, revoked credential) ends the agent
with exit 1, since no retry can fix it.

Every run frame stays in the link's outbox until the control plane acknowledges it as
persisted, and is sent again after a reconnect (to the same control plane within its
grace, or to a restarted one that adopts the run). The outbox is bounded
(``TROUPE_AGENT_OUTBOX_MB``). While the link is up, the runs are slowed before it fills:
past half of it, ``room`` is cleared and the agent stops reading its children's pipes
(a child then waits on its pipe), until acknowledgements bring it under a quarter. Only
across an outage, when nothing is acknowledged, does it fill: past it, events are
dropped and a ``gap`` frame says how many, never a silent loss; a run's end is always
kept."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from troupe.actors.base import Actor
from troupe.protocol import worker as wire
from troupe.protocol.tls import client_context

log = logging.getLogger("troupe.agent")

# Capped low: a laptop back from sleep, or a restarted control plane, sees its workers
# within a second; a retry is one TCP connect and one small HTTP upgrade.
BACKOFF_S = (0.25, 0.5, 1.0)
# A restarting control plane refuses connections for about a second (nothing listens on
# its port yet), and a refused connect costs it nothing: for the first RESTART_WINDOW_S of
# refusals in a row the agent dials every RESTART_RETRY_S, so it is back within a quarter
# second of the server serving again rather than on the backoff's next second (with
# hundreds of workers, each hello then waits less in line). Past the window, the backoff.
RESTART_RETRY_S = 0.25
RESTART_WINDOW_S = 10.0
# Each wait is shortened by up to this share, at random: the workers of one restart do
# not all dial at the same instant.
JITTER = 0.2
_ANNOUNCE = ""  # in the send queue: the agent's own frames wait in ``_announcements``


@dataclass(frozen=True)
class LinkConfig:
    url: str
    credential: str
    hello: Callable[[], Any]  # an awaitable factory of the Hello frame (inventory is read each time)
    on_final: Callable[[int, str], None]  # exit code, reason
    on_frame: Callable[[Any], None] = lambda frame: None  # assign, cancel and read frames go here
    outbox_bytes: int = 64 * 1024 * 1024
    # An awaitable factory of each heartbeat (each card's free memory, the warm pool).
    heartbeat: Callable[[], Any] | None = None
    # Dial through this Unix socket (an ``ssh -R`` session's forward) instead of TCP.
    unix_socket: str | None = None
    ca: str | None = None  # an https control plane's own certificate (``--ca``)
    # Set while the runs may hand on frames; a run process reads no more of its child's
    # pipe while it is clear (and looks again every few milliseconds).
    room: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Outbox:
    """Run frames, serialised once, until acknowledged; per run in counter order."""

    limit: int
    runs: dict[str, deque[tuple[int, str]]] = field(default_factory=dict)
    size: int = 0
    dropped: dict[str, tuple[int, int]] = field(default_factory=dict)  # run -> (how many, last counter)

    def add(self, frame: wire.RunFrame) -> list[str]:
        """Keeps the frame (or counts it dropped); returns what to send now, in order."""
        text = frame.model_dump_json()
        if isinstance(frame, wire.RunEvents) and len(text) > wire.BATCH_BYTES and len(frame.events) > 1:
            return self._split(frame)
        run = frame.run_id
        if not isinstance(frame, wire.RunEnded) and self.size + len(text) > self.limit:
            count, _ = self.dropped.get(run, (0, 0))
            self.dropped[run] = (count + (len(frame.events) if isinstance(frame, wire.RunEvents) else 1),
                                 frame.counter)
            return []
        kept = []
        if run in self.dropped:
            count, last = self.dropped.pop(run)
            log.warning("outbox full: %d events of run %s were dropped", count, run)
            kept.append((last, wire.Gap(run_id=run, counter=last, dropped=count).model_dump_json()))
        kept.append((frame.counter, text))
        entries = self.runs.setdefault(run, deque())
        for entry in kept:
            entries.append(entry)
            self.size += len(entry[1])
        return [entry[1] for entry in kept]

    def _split(self, frame: wire.RunEvents) -> list[str]:
        """A frame of large events, as two frames (each split again while too big): one
        websocket message stays under the control plane's limit."""
        half = len(frame.events) // 2
        head = wire.RunEvents.model_construct(run_id=frame.run_id, counter=frame.first + half - 1,
                                              events=frame.events[:half])
        tail = wire.RunEvents.model_construct(run_id=frame.run_id, counter=frame.counter, events=frame.events[half:])
        return self.add(head) + self.add(tail)

    def ack(self, run: str, counter: int) -> None:
        entries = self.runs.get(run)
        while entries and entries[0][0] <= counter:
            self.size -= len(entries.popleft()[1])
        if entries is not None and not entries:
            del self.runs[run]

    def forget(self, run: str) -> None:
        self.ack(run, 2**63)
        self.dropped.pop(run, None)

    def pending(self) -> list[str]:
        return [text for entries in self.runs.values() for _, text in entries]


@dataclass(frozen=True)
class Send:
    """Run frames for the control plane; each is kept until acknowledged, and frames sent
    while disconnected go with the next connection."""

    frames: tuple[wire.RunFrame, ...]


@dataclass(frozen=True)
class Announce:
    """A frame about the agent itself (not a run's), sent on the connection up now; with
    none up, it is not kept (the next hello says what is true then)."""

    frame: Any


@dataclass(frozen=True)
class Settled:
    """Ask: a future that resolves once every run frame sent so far is acknowledged (a
    one-shot agent exits only after its run is reported completely)."""


class Link(Actor):
    def __init__(self, config: LinkConfig) -> None:
        super().__init__("link")
        self._config = config
        self._task: asyncio.Task[None] | None = None
        self._outbox = _Outbox(config.outbox_bytes)
        self._live: asyncio.Queue[str] | None = None  # what the connection up now sends
        self._settled: list[asyncio.Future[None]] = []
        self._announcements: list[Any] = []  # agent frames for the sender to number and send
        config.room.set()

    def _pace(self) -> None:
        """Holds the runs back while the link is up and the outbox half full; lets them
        on under a quarter, or while no link is up (an outage drops what will not fit)."""
        size, limit, room = self._outbox.size, self._outbox.limit, self._config.room
        if self._live is not None and size > limit // 2:
            room.clear()
        elif self._live is None or size <= limit // 4:
            room.set()

    async def on_start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="link")

    async def on_stop(self, reason: str) -> None:
        if self._task is not None:
            self._task.cancel()
        self._config.room.set()

    async def receive(self, message: Any) -> Any:
        if isinstance(message, Send):
            for frame in message.frames:
                for text in self._outbox.add(frame):
                    if self._live is not None:
                        self._live.put_nowait(text)
            self._pace()
            return None
        if isinstance(message, Announce):
            self._announcements.append(message.frame)
            if self._live is not None:
                self._live.put_nowait(_ANNOUNCE)
            return None
        if isinstance(message, Settled):
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._settled.append(waiter)
            self._check_settled()
            return waiter
        raise TypeError(f"link got an unknown message {message!r}")

    def _check_settled(self) -> None:
        if not self._outbox.runs:
            for waiter in self._settled:
                if not waiter.done():
                    waiter.set_result(None)
            self._settled.clear()

    async def _run(self) -> None:
        redial = Redial()
        ws_url = self._config.url.rstrip("/").replace("http://", "ws://").replace("https://", "wss://") + "/ws/worker"
        headers = {"Authorization": f"Bearer {self._config.credential}"}
        connector = aiohttp.UnixConnector(path=self._config.unix_socket) if self._config.unix_socket else None
        tls = (client_context(urllib.parse.urlsplit(ws_url).hostname or "", self._config.ca)
               if ws_url.startswith("wss://") else True)
        async with aiohttp.ClientSession(connector=connector) as session:
            while True:
                try:
                    async with session.ws_connect(ws_url, headers=headers, heartbeat=None, ssl=tls) as ws:
                        redial.connected()
                        if await self._session(ws):
                            return
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    if self._config.unix_socket and _forward_gone(exc):
                        # An SSH session's agent: the session owns its life, and a new
                        # session starts a new agent, so it does not outlive the forward.
                        self._config.on_final(0, f"the SSH session's forward {self._config.unix_socket} is gone")
                        return
                    redial.failed(exc)
                    if redial.failures & (redial.failures - 1) == 0:  # failures 1, 2, 4, 8...: a log with backoff
                        log.warning("control plane unreachable at %s: %s (attempt %d; retrying every %.2g s)",
                                    ws_url, exc, redial.failures, redial.every())
                await asyncio.sleep(redial.wait())

    async def _session(self, ws: aiohttp.ClientWebSocketResponse) -> bool:
        """One connection; True when the agent must stop."""
        numbers = wire.Numbering()
        hello = await self._config.hello()
        # Runs whose frames are not all acknowledged are still this agent's to report.
        hello = hello.model_copy(update={"runs": sorted(set(hello.runs) | set(self._outbox.runs))})
        await ws.send_str(wire.dump_frame(hello, numbers.next()))
        first = await ws.receive(timeout=30)
        if first.type != aiohttp.WSMsgType.TEXT:
            return False
        answer = wire.parse_frame(first.data)
        numbers.is_new(answer)
        if isinstance(answer, wire.Refused):
            if not answer.final:  # not now (a busy name): tried again with the backoff of any failure
                raise ConnectionRefusedError(f"refused for now: {answer.reason}")
            self._config.on_final(1, f"refused by the control plane: {answer.reason}")
            return True
        if not isinstance(answer, wire.Welcome):
            return False
        log.info("connected as %s%s", answer.name, " (degraded)" if answer.degraded else "")
        live: asyncio.Queue[str] = asyncio.Queue()
        replay = self._outbox.pending()
        if replay:
            log.info("replaying %d unacknowledged run frames", len(replay))
        for text in replay:
            live.put_nowait(text)
        self._live = live
        self._pace()
        beats = asyncio.ensure_future(self._beat(ws, answer.heartbeat_s, numbers))
        if self._announcements:
            live.put_nowait(_ANNOUNCE)
        sending = asyncio.ensure_future(self._drain(ws, live, numbers))
        try:
            async for message in ws:
                if message.type != aiohttp.WSMsgType.TEXT:
                    continue
                frame = wire.parse_frame(message.data)
                if not numbers.is_new(frame):
                    log.warning("the control plane sent frame %s twice: dropped", frame.frame_no)
                    continue
                if isinstance(frame, wire.Ack):
                    for run, counter in frame.runs.items():
                        self._outbox.ack(run, counter)
                if isinstance(frame, wire.Refused):
                    self._config.on_final(1, f"refused by the control plane: {frame.reason}")
                    return True
                if isinstance(frame, wire.Drain):
                    log.info("asked to drain: no new runs will come")
                if isinstance(frame, wire.KillRun):
                    self._outbox.forget(frame.run_id)  # the control plane no longer holds it
                if isinstance(frame, wire.Ack | wire.KillRun):
                    self._check_settled()
                    self._pace()
                if isinstance(frame, wire.Assign | wire.CancelRun | wire.KillRun | wire.ReadOutputs):
                    self._config.on_frame(frame)
        finally:
            self._live = None
            self._pace()
            beats.cancel()
            sending.cancel()
            if self._outbox.runs:
                log.warning("connection lost; %d run frames (%d bytes) wait for the next one",
                            sum(len(e) for e in self._outbox.runs.values()), self._outbox.size)
        return False

    async def _drain(self, ws: aiohttp.ClientWebSocketResponse, live: asyncio.Queue[str],
                     numbers: wire.Numbering) -> None:
        """Sends run frames as they come; they stay in the outbox until acknowledged, so
        one lost with the socket is sent again on the next connection. Run frames go
        unnumbered: their run counter is what the control plane deduplicates on."""
        while not ws.closed:
            texts = [await live.get()]
            size = len(texts[0])
            while not live.empty() and size < wire.BATCH_BYTES:  # what waits goes together
                texts.append(live.get_nowait())
                size += len(texts[-1])
            if _ANNOUNCE in texts:  # the agent's own frames, numbered on this connection
                announced, self._announcements = self._announcements, []
                texts = [t for t in texts if t != _ANNOUNCE] + [wire.dump_frame(f, numbers.next()) for f in announced]
            if not texts:
                continue
            try:
                await ws.send_str(wire.join_frames(texts))
            except (ConnectionResetError, aiohttp.ClientError):
                return

    async def _beat(self, ws: aiohttp.ClientWebSocketResponse, every: float, numbers: wire.Numbering) -> None:
        while not ws.closed:
            await asyncio.sleep(every)
            beat = await self._config.heartbeat() if self._config.heartbeat is not None else wire.Heartbeat()
            await ws.send_str(wire.dump_frame(beat, numbers.next()))


def refused_connect(exc: BaseException) -> bool:
    """Whether a dial failed because nothing listens at the address (a control plane
    restarting), not for a cause that a retry every quarter second would only repeat."""
    return isinstance(_cause(exc), ConnectionRefusedError)


class Redial:
    """When the link dials again: after ``BACKOFF_S`` for failures in a row, or every
    ``RESTART_RETRY_S`` while its dials have been refused for less than
    ``RESTART_WINDOW_S``; each wait jittered."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.failures = 0  # in a row; 0: the last dial connected (or none failed yet)
        self._refused_since: float | None = None  # when the dials refused in a row began
        self._clock = clock

    def connected(self) -> None:
        self.failures, self._refused_since = 0, None

    def failed(self, exc: BaseException) -> None:
        self.failures += 1
        if not refused_connect(exc):
            self._refused_since = None
        elif self._refused_since is None:
            self._refused_since = self._clock()

    def every(self) -> float:
        """Seconds between dials now, as the log says it."""
        refused = self._refused_since is not None and self._clock() - self._refused_since < RESTART_WINDOW_S
        return RESTART_RETRY_S if refused else BACKOFF_S[min(self.failures, len(BACKOFF_S) - 1)]

    def wait(self) -> float:
        """The wait before the next dial: ``every``'s, shortened by up to ``JITTER``."""
        return self.every() * (1 - JITTER * random.random())


def _forward_gone(exc: BaseException) -> bool:
    return isinstance(_cause(exc), FileNotFoundError | ConnectionRefusedError)


def _cause(exc: BaseException) -> BaseException:
    """The OS's error under aiohttp's connector error (a dial's), else the error itself."""
    return getattr(exc, "os_error", None) or exc
