"""The cards the GPU tests run on: a real one where CUDA is here, else a simulated one.

Each GPU test runs its whole path up to the CUDA boundary (agent, enrollment, sharing,
admission) on a simulated inventory everywhere, so that the part CI can run never rots;
only the assertions that need a real card are behind ``CUDA_REASON``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers import REPO, base_env, edge, graph, node, troupe_cmd
from tests.integration.test_workers_functional import enroll, read_until


def _cuda_reason() -> str | None:
    """Why the real-card assertions cannot run here, or None. torch is asked in a child
    process: importing it into pytest's own would change what the in-process tests see."""
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception as exc:  # no library or no driver: no card to share
        return f"needs a CUDA card with NVML: {type(exc).__name__}: {exc}"
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True, timeout=120)
    if probe.stdout.strip() != "True":
        return "needs a CUDA build of torch (torch.cuda.is_available() is false here)"
    return None


def _card_count() -> int:
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                           capture_output=True, text=True, timeout=120)
    return int(probe.stdout.strip() or 0)


CUDA_REASON = _cuda_reason()
CARDS = 0 if CUDA_REASON else _card_count()


def simulated_card(index: int) -> dict[str, Any]:
    return {"uuid": f"GPU-sim{index}", "name": "Sim 80G", "index": index, "memory_total_mib": 80 * 1024,
            "memory_free_mib": 80 * 1024}


def start_agent(server: Any, tmp_path: Path, name: str, simulated: int = 0,
                **settings: str) -> subprocess.Popen[str]:
    """A real agent process enrolled as ``name``, attached to this test (``--foreground``).
    ``simulated`` > 0 gives it that many simulated cards; 0 lets it read the real ones
    through NVML."""
    env = base_env(server.home, XDG_CONFIG_HOME=str(tmp_path / "config"),
                   XDG_STATE_HOME=str(tmp_path / "state"), XDG_CACHE_HOME=str(tmp_path / "cache"), **settings)
    if simulated:
        env["TROUPE_SIMULATED_INVENTORY"] = json.dumps(
            {"machine_id": f"sim-{name}", "cpus": 2, "cards": [simulated_card(i) for i in range(simulated)]})
    command = [*enroll(server, name=name)["command"].split()[1:], "--foreground"]
    agent = subprocess.Popen(troupe_cmd(*command), cwd=REPO, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    read_until(agent, f"connected as {name}")
    return agent


def trainer(hidden: str, epochs: int, samples: int = 4096) -> dict[str, Any]:
    return graph(
        node("data", "torch.SyntheticClassification", n=samples, features=256, classes=10),
        node("loader", "torch.DataLoader", batch_size=256),
        node("mlp", "torch.MLP", hidden=hidden),
        node("train", "torch.TrainingLoop", epochs=epochs),
        edges=(edge("data", "train", "loader", "dataset"), edge("data", "train", "mlp", "data"),
               edge("mlp", "model", "train", "model"), edge("loader", "loader", "train", "train")),
        device="cuda")
