"""Messages the placer receives from its peers (queues and runs). They live apart from
``placer.py`` so that a queue can send ``Admit`` without importing the placer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Admit:
    """A queue's head has a slot; the placer starts it once the seed gate allows."""

    run_id: str
    queue_key: str
    seeded: bool


@dataclass(frozen=True)
class Released:
    """A run's graph ended (or it was withdrawn): its lane counters and gate hold go."""

    run_id: str
