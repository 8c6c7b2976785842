"""Which run holds which devices, and through which provider: the placer's record of the
slots it took, kept both ways.

By run, to free a run's slots and to tell a run what it holds; by device, so that a
ledger started fresh (a worker coming online, a ledger restarted) learns its holders
from the few runs that hold that device. Walking every holding run for each fresh
ledger was quadratic where it hurts most: a restarted server at a lab's scale adopts
800 runs before 800 agents come back with 3,551 cards, and each card's new ledger
walked all 800 (seconds of the loop before the last run was adopted).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator


class Holds:
    def __init__(self) -> None:
        self._by_run: dict[str, list[tuple[str, str]]] = {}  # run -> [(provider, physical)]
        # physical -> the runs holding it, in the order they took it (a dict for its order)
        self._by_physical: dict[str, dict[str, None]] = {}

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._by_run

    def __getitem__(self, run_id: str) -> list[tuple[str, str]]:
        return self._by_run[run_id]

    def get(self, run_id: str) -> list[tuple[str, str]]:
        return self._by_run.get(run_id, [])

    def values(self) -> Iterator[list[tuple[str, str]]]:
        return iter(self._by_run.values())

    def add(self, run_id: str, provider: str, physical: str) -> None:
        """The run holds ``physical`` through ``provider`` too (once, however often said)."""
        held = self._by_run.setdefault(run_id, [])
        if (provider, physical) not in held:
            held.append((provider, physical))
            self._by_physical.setdefault(physical, {})[run_id] = None

    def set(self, run_id: str, holds: Iterable[tuple[str, str]]) -> None:
        """What the run holds from now on, whatever it held before (an adopted run)."""
        self.pop(run_id)
        for provider, physical in holds:
            self.add(run_id, provider, physical)
        self._by_run.setdefault(run_id, [])  # a run adopted with no slot is still one the placer holds for

    def pop(self, run_id: str) -> list[tuple[str, str]]:
        """Forgets the run; what it held."""
        held = self._by_run.pop(run_id, [])
        for _, physical in held:
            runs = self._by_physical.get(physical)
            if runs is not None:
                runs.pop(run_id, None)
                if not runs:
                    del self._by_physical[physical]
        return held

    def on(self, physical: str) -> tuple[str, ...]:
        """The runs that hold ``physical``."""
        return tuple(self._by_physical.get(physical, ()))
