"""DDP on real cards (issue 17): a worker run that holds two CUDA cards trains one model
with one rank per card over NCCL, in one run with one event log. Needs a CUDA build of
torch and two cards; elsewhere it skips, saying so."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.gpu.test_shared_card_cuda import REASON, trainer
from tests.helpers import REPO, base_env, troupe_cmd
from tests.integration.test_workers_functional import enroll, read_until


def _two_cards() -> str | None:
    if REASON is not None:
        return REASON
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                           capture_output=True, text=True, timeout=120)
    count = int(probe.stdout.strip() or 0)
    return None if count >= 2 else f"needs two CUDA cards for DDP; this machine has {count}"


TWO = _two_cards()
pytestmark = pytest.mark.skipif(TWO is not None, reason=TWO or "")


@pytest.mark.timeout(600)
def test_one_model_on_two_cards_in_one_run(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    env = base_env(server.home, XDG_CONFIG_HOME=str(tmp_path / "config"), XDG_STATE_HOME=str(tmp_path / "state"))
    command = enroll(server, name="gpu-two")["command"].split()[1:]
    agent = subprocess.Popen(troupe_cmd(*command), cwd=REPO, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        read_until(agent, "connected as gpu-two")
        doc = trainer("256,128", epochs=3)
        doc["nodes"][3]["params"]["strategy"] = "ddp"
        run_id = server.submit(doc, target={"worker": "gpu-two", "devices": ["cuda:0", "cuda:1"]})["run_id"]
        events = server.events_until_finished(run_id, timeout=300)
        assert events[-1]["payload"]["status"] == "succeeded", events[-3:]
        ddp = [e["payload"] for e in events if e["type"] == "log" and "ddp" in e["payload"]]
        assert "nccl" in ddp[0]["message"] and ddp[0]["ddp"]["world"] == 2
        assert len(set(ddp[-1]["ddp"]["weights"])) == 1
    finally:
        agent.terminate()
        agent.wait(30)
