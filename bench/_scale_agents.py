"""Simulated worker agents for ``bench/scale.py``: many lightweight agents in one asyncio
process, each speaking the real worker protocol over its own real websocket to
``/ws/worker`` on 127.0.0.1.

Why not real agents: a real agent is a process that spawns a fresh interpreter per run
(about 200 ms and 30+ MB each, see bench/README.md); 200 of them with their runs would
measure this 2-core machine, not the control plane. These agents do what the control
plane sees of a real one and nothing else:

- enroll as the real agent does (``troupe/cli/agent_cmd.py``): trade a one-time join token for a
  credential (``POST /api/workers/credentials``), then dial ``/ws/worker`` with it;
- say hello (a simulated inventory of 1-8 cards, the server's catalog digest and node
  types), heartbeat at the interval the welcome names, reconnect with the real link's
  backoff (``troupe/actors/link.py``), and report the runs they still hold after a reconnect;
- play each assigned run as a real child would: ``node_started`` / ``node_finished`` per
  node, the points of a ``core.Ticker`` node one per ``interval`` (its real params), then
  ``ended``, every frame with the run's own gap-free counter; keep each frame until an
  ack covers it and replay the rest on the next connection; honour cancel and kill.

Driven by ``bench/scale.py`` through stdin (one command a line: ``stats``, ``quit``); each
answer is one JSON line on stdout. Run as ``python -m bench._scale_agents PLAN.json`` from
the repository root. Timestamps are ``time.monotonic()`` (one clock for all processes on
Linux), so the driver can compare them with its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

# The agent's own policy, so the simulation reconnects as the real link does.
from troupe.actors.link import Redial
from troupe.protocol import worker as wire
from troupe.protocol.version import __version__

log = logging.getLogger("bench.scale.agents")
FIRST_CONNECTS = 32  # handshakes at once when the agents first start (after a restart they all dial at once)


@dataclass
class Stats:
    """Counters of all agents together, and heartbeat round trips since the last report."""

    counts: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    hb_rtt_ms: list[float] = field(default_factory=list)

    def add(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def error(self, what: str) -> None:
        self.errors[what[:160]] = self.errors.get(what[:160], 0) + 1


class SimAgent:
    """One simulated agent: its link (outbox, replay, heartbeats) and the runs it plays."""

    def __init__(self, spec: dict[str, Any], plan: dict[str, Any], session: aiohttp.ClientSession,
                 stats: Stats) -> None:
        self.spec, self.plan, self.session, self.stats = spec, plan, session, stats
        self.name: str = spec["name"]
        self.credential = ""
        self.outbox: dict[str, deque[tuple[int, str]]] = {}  # run -> (counter, frame) until acked
        self.live: asyncio.Queue[str] | None = None
        self.playing: dict[str, asyncio.Task[None]] = {}
        self.cancelled: set[str] = set()
        self.connected = False
        self.welcomed_at: float | None = None
        self.replay: dict[str, int] = {}  # run -> newest counter replayed at the last welcome, until acked
        self.replay_acked_at: float | None = None

    async def enroll(self) -> None:
        body = {"token": self.spec["token"], "name": self.name, "machine_id": self.spec["machine_id"]}
        async with self.session.post(self.plan["url"] + "/api/workers/credentials", json=body) as response:
            reply = await response.json()
            if response.status != 201:
                raise RuntimeError(f"{self.name}: enrollment answered {response.status}: {reply}")
        self.credential = reply["credential"]

    # The link ----------------------------------------------------------------------
    async def run_forever(self, first: asyncio.Semaphore) -> None:
        url = self.plan["url"].replace("http://", "ws://") + "/ws/worker"
        headers = {"Authorization": f"Bearer {self.credential}"}
        gate, redial = first, Redial()
        while True:
            try:
                async with gate:
                    ws = await self.session.ws_connect(url, headers=headers, heartbeat=None)
                gate = _NO_GATE
                async with ws:
                    redial.connected()
                    if await self._session(ws):
                        return
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                self.stats.add("connect_failures")
                self.stats.error(f"connect: {type(exc).__name__}: {exc}")
                redial.failed(exc)
            self.stats.add("reconnects")
            await asyncio.sleep(redial.wait())

    def _hello(self) -> wire.Hello:
        runs = sorted(set(self.playing) | set(self.outbox))  # still executing, or not all acknowledged
        return wire.Hello(version=__version__, name=self.name, machine_id=self.spec["machine_id"],
                          catalog_digest=self.plan["digest"], node_types=self.plan["node_types"],
                          inventory=wire.Inventory.model_validate(self.spec["inventory"]), runs=runs)

    async def _session(self, ws: aiohttp.ClientWebSocketResponse) -> bool:
        """One connection, as ``Link._session``; True when the control plane refused for good."""
        numbers = wire.Numbering()
        await ws.send_str(wire.dump_frame(self._hello(), numbers.next()))
        first = await ws.receive(timeout=30)
        if first.type != aiohttp.WSMsgType.TEXT:
            self.stats.error(f"no welcome: {first.type.name}")
            return False
        answer = wire.parse_frame(first.data)
        numbers.is_new(answer)
        if isinstance(answer, wire.Refused):
            self.stats.error(f"refused: {answer.reason}")
            return answer.final
        if not isinstance(answer, wire.Welcome):
            return False
        self.stats.add("welcomes")
        self.connected, self.welcomed_at = True, time.monotonic()
        live: asyncio.Queue[str] = asyncio.Queue()
        self.replay = {run: entries[-1][0] for run, entries in self.outbox.items() if entries}
        self.replay_acked_at = None if self.replay else self.welcomed_at
        for entries in self.outbox.values():
            for _, text in entries:
                live.put_nowait(text)
                self.stats.add("frames_replayed")
        self.live = live
        sent: dict[int, float] = {}  # heartbeat frame_no -> when sent
        beats = asyncio.ensure_future(self._beat(ws, answer.heartbeat_s, numbers, sent))
        sending = asyncio.ensure_future(self._drain(ws, live))
        try:
            async for message in ws:
                if message.type == aiohttp.WSMsgType.TEXT:
                    self._on_frame(wire.parse_frame(message.data), numbers, sent)
        finally:
            self.live, self.connected = None, False
            beats.cancel()
            sending.cancel()
            self.stats.add("disconnects")
            if ws.close_code is not None:
                self.stats.error(f"connection closed: {ws.close_code}")  # 1006 also when the agents quit
        return False

    def _on_frame(self, frame: Any, numbers: wire.Numbering, sent: dict[int, float]) -> None:
        if not numbers.is_new(frame):
            self.stats.add("duplicate_frames")
            return
        if isinstance(frame, wire.Ack):
            now = time.monotonic()
            for number in [n for n in sent if n <= frame.upto]:
                self.stats.hb_rtt_ms.append(round((now - sent.pop(number)) * 1000, 2))
                self.stats.add("heartbeats_acked")
            self.stats.add("acks")
            for run, counter in frame.runs.items():
                self._ack(run, counter)
            if self.replay_acked_at is None and not self.replay:
                self.replay_acked_at = now
        elif isinstance(frame, wire.Assign):
            self.stats.add("assigned")
            if frame.run_id not in self.playing:
                self.playing[frame.run_id] = asyncio.ensure_future(self._play(frame))
        elif isinstance(frame, wire.CancelRun):
            self.stats.add("cancels")
            self.cancelled.add(frame.run_id)
        elif isinstance(frame, wire.KillRun):
            self.stats.add("kills")  # the control plane no longer holds the run
            task = self.playing.pop(frame.run_id, None)
            if task is not None:
                task.cancel()
            self._ack(frame.run_id, 2**63)
        elif isinstance(frame, wire.Refused):
            self.stats.error(f"refused: {frame.reason}")

    def _ack(self, run: str, counter: int) -> None:
        entries = self.outbox.get(run)
        while entries and entries[0][0] <= counter:
            entries.popleft()
            self.stats.add("frames_acked")
        if entries is not None and not entries:
            del self.outbox[run]
        if run in self.replay and self.replay[run] <= counter:
            del self.replay[run]

    async def _drain(self, ws: aiohttp.ClientWebSocketResponse, live: asyncio.Queue[str]) -> None:
        """What waits together goes as one message, as ``Link._drain`` sends it."""
        while not ws.closed:
            texts, size = [await live.get()], 0
            while not live.empty() and (size := size + len(texts[-1])) < wire.BATCH_BYTES:
                texts.append(live.get_nowait())
            try:
                await ws.send_str(wire.join_frames(texts))
            except (ConnectionResetError, aiohttp.ClientError):
                return
            self.stats.add("messages_sent")

    async def _beat(self, ws: aiohttp.ClientWebSocketResponse, every: float, numbers: wire.Numbering,
                    sent: dict[int, float]) -> None:
        while not ws.closed:
            await asyncio.sleep(every)
            number = numbers.next()
            sent[number] = time.monotonic()
            try:
                await ws.send_str(wire.dump_frame(wire.Heartbeat(), number))
            except (ConnectionResetError, aiohttp.ClientError):
                return
            self.stats.add("heartbeats_sent")

    # The runs ----------------------------------------------------------------------
    def _send(self, frame: wire.RunEvents | wire.RunEnded) -> None:
        text = frame.model_dump_json()
        self.outbox.setdefault(frame.run_id, deque()).append((frame.counter, text))
        self.stats.add("frames_sent")
        if self.live is not None:
            self.live.put_nowait(text)

    async def _play(self, assign: wire.Assign) -> None:
        """Plays the graph as the run child would report it; the clock is a Ticker's own.
        Events of the same moment go in one ``events`` frame, as a real agent's child
        sends a burst (``troupe.subprocess_runner.upstream``)."""
        run_id, counter = assign.run_id, 0
        burst: list[tuple[str, str | None, str]] = []

        def event(kind: str, node_id: str | None, payload: dict[str, Any]) -> None:
            nonlocal counter
            counter += 1
            burst.append((kind, node_id, json.dumps(payload)))

        def flush() -> None:
            if burst:
                self._send(wire.RunEvents.model_construct(run_id=run_id, counter=counter, events=list(burst)))
                burst.clear()

        status: Literal["succeeded", "cancelled"] = "succeeded"
        try:
            for node in assign.graph.get("nodes", []):
                started = time.monotonic()
                event("node_started", node["id"], {"type": node["type"]})
                params = node.get("params") or {}
                if node["type"] == "core.Ticker":
                    for step in range(1, int(params.get("count", 10)) + 1):
                        flush()
                        await asyncio.sleep(float(params.get("interval", 0.1)))
                        if run_id in self.cancelled:
                            break
                        event("metric", node["id"], {"name": params.get("name", "tick"), "step": step,
                                                     "value": float(step)})
                if run_id in self.cancelled:
                    event("node_failed", node["id"], {"error": "cancelled", "cancelled": True,
                                                      "duration_s": time.monotonic() - started})
                    status = "cancelled"
                    break
                event("node_finished", node["id"], {"duration_s": time.monotonic() - started, "outputs": {}})
            flush()
            self._send(wire.RunEnded(run_id=run_id, counter=counter + 1, status=status))
            self.stats.add(f"runs_{status}")
        finally:
            self.playing.pop(run_id, None)
            self.cancelled.discard(run_id)


class _NoGate:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


_NO_GATE: Any = _NoGate()


def report(agents: list[SimAgent], stats: Stats) -> dict[str, Any]:
    """One answer to ``stats``: counters, and the heartbeat round trips since the last one."""
    rtts, stats.hb_rtt_ms = stats.hb_rtt_ms, []
    return {
        "now": time.monotonic(),
        "agents": len(agents),
        "connected": sum(a.connected for a in agents),
        "playing": sum(len(a.playing) for a in agents),
        "outbox_frames": sum(len(e) for a in agents for e in a.outbox.values()),
        "welcomed_at": {a.name: a.welcomed_at for a in agents},
        "replay_acked_at": {a.name: a.replay_acked_at for a in agents},
        "counts": dict(stats.counts),
        "errors": dict(stats.errors),
        "hb_rtt_ms": rtts,
    }


def say(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def amain(plan: dict[str, Any]) -> int:
    stats = Stats()
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        agents = [SimAgent(spec, plan, session, stats) for spec in plan["agents"]]
        first = asyncio.Semaphore(FIRST_CONNECTS)

        async def enroll(agent: SimAgent) -> None:
            async with first:
                await agent.enroll()

        try:
            await asyncio.gather(*(enroll(a) for a in agents))
        except Exception as exc:
            say({"fatal": f"enrollment failed: {type(exc).__name__}: {exc}"})
            return 2
        links = [asyncio.ensure_future(a.run_forever(first)) for a in agents]
        say({"enrolled": len(agents)})
        while line := (await reader.readline()).decode().strip():
            if line == "stats":
                say(report(agents, stats))
            elif line == "quit":
                break
        for task in links + [t for a in agents for t in a.playing.values()]:
            task.cancel()
        await asyncio.gather(*links, return_exceptions=True)
        say(report(agents, stats))
    return 0


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with open(sys.argv[1]) as handle:
        plan = json.load(handle)
    return asyncio.run(amain(plan))


if __name__ == "__main__":
    sys.exit(main())
