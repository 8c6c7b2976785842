"""What ``GET /api/workers`` reads of a worker's connection: the immutable view a
WorkerConnection publishes after every burst of messages, and the part of it only a hello
changes. Apart from ``worker.py``, whose concern is the link and its runs."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from troupe.protocol import jsonsafe
from troupe.protocol import worker as wire


class LastHeard:
    """When a connection last heard its worker (monotonic), moved in place by the
    connection on every frame and shared by its views: a heartbeat that changes nothing
    but this needs no new view."""

    __slots__ = ("at",)

    def __init__(self) -> None:
        self.at: float | None = None


@dataclass(frozen=True)
class ConnectionView:
    """What ``GET /api/workers`` shows of a connection, published after every burst of
    messages so that the list costs no ask per worker. It holds the parsed frames as they
    came (never mutated) and copies of what changes; the JSON is made when it is read, so
    a heartbeat costs a few references, not a dump, and one that changed nothing else
    keeps the view (and its encoded text) as it was. ``heard`` is the one live part: the
    connection moves it on every frame, and it becomes seconds ago when it is read."""

    name: str
    connected: bool
    degraded: bool
    draining: bool
    missing: tuple[str, ...]
    # What the view shows of the hello, dumped once per hello (never changed): a heartbeat's
    # new view copies only its cards' free memory.
    said: Said | None
    free: dict[str, int]  # a card's free memory as of the last heartbeat
    devices: Mapping[str, tuple[str, int]]  # device -> (physical id, limit), the same mapping per hello
    running: tuple[int, ...]  # runs on each of those devices, in their order
    runs: tuple[str, ...]
    heard: LastHeard
    warm: Any
    artifacts: Any

    def as_json(self) -> dict[str, Any]:
        return {**self._json, "heard_s_ago": self._heard()}  # seconds since its last frame: a live link beats

    def head(self, encoded: Mapping[str, str]) -> str:
        """The view's JSON text with ``encoded`` (values that are JSON text already) after
        its own keys, open for ``heard_s_ago``, the one part that moves between reads. A
        reader keeps it for as long as the view is the newest: 800 workers polled several
        times a second are encoded once per view, not once per read."""
        given = "".join(f", {json.dumps(key)}: {text}" for key, text in encoded.items())
        return f"{self._text[:-1]}{given}"

    def with_heard(self, head: str) -> str:
        """``head`` closed with the seconds since the last frame: a live link beats."""
        heard = self._heard()
        return f'{head}, "heard_s_ago": {"null" if heard is None else repr(heard)}}}'

    @property
    def card_ids(self) -> frozenset[str]:
        """Its cards' UUIDs, to find at once whether any has a policy or promised memory."""
        return self.said.card_ids if self.said is not None else frozenset()

    @property
    def cards(self) -> list[dict[str, Any]]:
        """Each card as the hello reported it, with its free memory as of the last
        heartbeat. The list shows them once, in ``cards``, not again in the inventory."""
        said = self.said
        if said is None:
            return []
        return [{**card, "memory_free_mib": self.free.get(card["uuid"], card["memory_free_mib"])}
                for card in said.cards]

    def _heard(self) -> float | None:
        at = self.heard.at
        return None if at is None or not self.connected else round(time.monotonic() - at, 1)

    @functools.cached_property
    def _text(self) -> str:
        """Made once per view, on its first read: a view read by every poll until the
        next change replaces it is dumped once. Only the text is kept: 800 views, each
        a dict of lists of dicts, were thousands of objects that every young collection
        walked while the runs that changed them went on."""
        return jsonsafe.dumps(self._json)

    @property
    def _json(self) -> dict[str, Any]:
        said = self.said.shown if self.said is not None else _UNSAID
        return {
            "name": self.name, "state": "connected" if self.connected else "disconnected",
            "degraded": self.degraded, "draining": self.draining, "missing_node_types": list(self.missing),
            **said,
            "slots": [{"device": d, "physical_id": p, "limit": limit, "running": n}
                      for (d, (p, limit)), n in zip(self.devices.items(), self.running, strict=True)],
            "running_runs": list(self.runs),
            "warm_pool": self.warm.model_dump() if self.warm is not None and self.connected else None,
            "artifact_outbox": self.artifacts.model_dump() if self.artifacts is not None else None,
        }


NO_DEVICES: Mapping[str, tuple[str, int]] = {}  # a connection's before its hello
_UNSAID: dict[str, Any] = {"version": None, "one_shot": False, "deadline": None, "mounts": {}, "machine_id": None,
                           "devices": [], "inventory": None}


class Said(NamedTuple):
    """What the Workers list shows of a hello: the parts only a hello changes, in their
    order there, and its cards apart, since a heartbeat moves their free memory."""

    shown: dict[str, Any]
    cards: list[dict[str, Any]]
    card_ids: frozenset[str]


def said_of(hello: wire.Hello) -> Said:
    return Said({"version": hello.version, "one_shot": hello.one_shot, "deadline": hello.deadline,
                 "mounts": dict(hello.mounts), "machine_id": hello.machine_id,
                 "devices": ["cpu", *(f"cuda:{c.index}" for c in hello.inventory.cards)],
                 "inventory": hello.inventory.model_dump(exclude={"cards"})},
                [card.model_dump() for card in hello.inventory.cards],
                frozenset(card.uuid for card in hello.inventory.cards))


def offered_devices(worker: str, hello: wire.Hello, limit: Callable[[str], int]) -> dict[str, tuple[str, int]]:
    """Each device a hello offers with its physical identity (NVML UUID for a card; the
    machine for its cpu and its mps:0, so a same-machine worker shares the server's) and
    its slot limit (the settings' for ``worker/device``)."""
    machine = hello.machine_id
    devices = {"cpu": (f"cpu@{machine}", limit(f"{worker}/cpu"))}
    for card in hello.inventory.cards:
        devices[f"cuda:{card.index}"] = (card.uuid, limit(f"{worker}/cuda:{card.index}"))
    if hello.inventory.mps:
        devices["mps:0"] = (f"mps:0@{machine}", limit(f"{worker}/mps:0"))
    return devices
