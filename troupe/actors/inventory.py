"""Inventory (agent side): what devices this machine has, read through NVML, never
through torch. A thread actor, since NVML calls block. ``TROUPE_SIMULATED_INVENTORY``
(JSON, read once by the CLI) replaces the reading for tests and development."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from typing import Any

from troupe.actors.threaded import ThreadActor
from troupe.protocol import worker as wire
from troupe.subprocess_runner.devices import visible_cards


@dataclass(frozen=True)
class Probe:
    pass


class InventoryActor(ThreadActor):
    def __init__(self, name: str, loop: Any, on_exit: Any, simulated: dict[str, Any] | None,
                 cuda_visible: str | None = None) -> None:
        super().__init__(name, loop, on_exit)
        self._simulated = simulated
        self._cuda_visible = cuda_visible

    def handle(self, message: Any) -> Any:
        if not isinstance(message, Probe):
            raise TypeError(f"inventory cannot handle {type(message).__name__}")
        if self._simulated is not None:
            found = wire.Inventory.model_validate(
                {k: v for k, v in self._simulated.items() if k in ("cpus", "cards", "mps")}
                | {"cpus": self._simulated.get("cpus") or os.cpu_count() or 1})
        else:
            found = wire.Inventory(cpus=os.cpu_count() or 1, cards=_nvml_cards(),
                                   mps=platform.system() == "Darwin" and platform.machine() == "arm64")
        # The agent offers the cards its CUDA_VISIBLE_DEVICES shows, first its current one.
        by_index = {card.index: card for card in found.cards}
        shown = visible_cards(self._cuda_visible, [(card.index, card.uuid) for card in found.cards])
        return found.model_copy(update={"cards": [by_index[i] for i in shown]})


def _nvml_cards() -> list[wire.Card]:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver or no library: a CPU-only machine
        return []
    try:
        cards = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            cards.append(wire.Card(
                uuid=str(pynvml.nvmlDeviceGetUUID(handle)), name=name if isinstance(name, str) else name.decode(),
                index=index, memory_total_mib=int(memory.total) // 2**20, memory_free_mib=int(memory.free) // 2**20,
                pci_bus_id=str(pynvml.nvmlDeviceGetPciInfo(handle).busId)))
        return cards
    finally:
        pynvml.nvmlShutdown()
