"""Real torch training on the CPU through the real server and CLI."""

from __future__ import annotations

import copy
import hashlib
import json
import subprocess

from tests.helpers import EXAMPLES, REPO, base_env, troupe_cmd

DIGITS = json.loads((EXAMPLES / "digits_mlp.json").read_text())


def quick_digits(epochs: int = 3, **trainer: object) -> dict:
    graph = copy.deepcopy(DIGITS)
    for node in graph["nodes"]:
        if node["id"] == "trainer":
            node["params"].update(epochs=epochs, **trainer)
    return graph


def series(server, run_id, name):
    return [p["value"] for p in server.get(f"/api/runs/{run_id}/metrics")["series"][name]]


def test_digits_trains_to_ninety_percent_through_troupe_run(make_server):
    server = make_server()
    result = subprocess.run(troupe_cmd("run", str(EXAMPLES / "digits_mlp.json"), "--name", "digits"), cwd=REPO,
                            env=base_env(server.home), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    # One line per epoch with every metric of that epoch (002's sample output).
    epoch_three = [line for line in result.stdout.splitlines() if line.startswith("    trainer  epoch 3/10  ")]
    assert len(epoch_three) == 1 and "  loss=" in epoch_three[0] and "  val_loss=" in epoch_three[0]
    run_id = result.stdout.splitlines()[1].split()[-1]
    assert series(server, run_id, "eval_accuracy")[-1] >= 0.9
    assert len(series(server, run_id, "train_loss")) == 10
    row = server.get(f"/api/runs/{run_id}")
    assert row["final_loss"] == series(server, run_id, "val_loss")[-1]
    checkpoints = [a for a in row["artifacts"] if a["kind"] == "checkpoint"]
    assert [a["path"] for a in checkpoints] == ["checkpoints/trainer-epoch-5.pt", "checkpoints/trainer-epoch-10.pt"]
    for artifact in checkpoints:  # hashed off the training's thread, listed once stored
        on_disk = (server.home / "runs" / run_id / artifact["path"]).read_bytes()
        assert (artifact["backend"], artifact["size"]) == ("local", len(on_disk))
        assert artifact["sha256"] == hashlib.sha256(on_disk).hexdigest()
        assert server.download(f"/api/runs/{run_id}/artifacts/{artifact['id']}") == on_disk


def test_a_seeded_run_is_reproducible_and_another_seed_is_not(make_server):
    server = make_server()
    runs = [server.submit(quick_digits(), seed=seed, deterministic=True)["run_id"] for seed in (7, 7, 8)]
    for run_id in runs:
        assert server.events_until_finished(run_id, timeout=120)[-1]["payload"]["status"] == "succeeded"
    first, again, other = (series(server, r, "train_loss") for r in runs)
    assert first == again
    assert first != other
    row = server.get(f"/api/runs/{runs[0]}")
    assert row["seed"] == 7 and row["deterministic"] is True


def test_recorded_outputs_describe_tensors_models_and_datasets(make_server):
    server = make_server(TROUPE_RECORDED_OUTPUTS_KEEP="1")
    # Seeded: one epoch of an unseeded run can land either side of the accuracy check.
    run_id = server.submit(quick_digits(epochs=1), record_outputs=True, seed=7, deterministic=True)["run_id"]
    server.events_until_finished(run_id, timeout=120)
    outputs = server.get(f"/api/runs/{run_id}/outputs")["outputs"]
    assert outputs["digits"]["train"] == {"type": "dataset", "rows": 1438, "features": 64,
                                          "task": "classification", "classes": 10}
    model = outputs["mlp"]["model"]
    assert model["type"] == "model" and model["parameters"] == 64 * 64 + 64 + 64 * 32 + 32 + 32 * 10 + 10
    assert outputs["evaluate"]["accuracy"] > 0.5, outputs["evaluate"]
    one = server.get(f"/api/runs/{run_id}/outputs/trainer")
    assert one["outputs"]["model"]["type"] == "model"
    status, reply = server.client.request("GET", f"/api/runs/{run_id}/outputs/nope")
    assert status == 404 and reply["error"]["code"] == "outputs_not_found"
    # Only the newest run keeps its outputs (TROUPE_RECORDED_OUTPUTS_KEEP=1).
    newer = server.submit(quick_digits(epochs=1), record_outputs=True)["run_id"]
    server.events_until_finished(newer, timeout=120)
    assert server.get(f"/api/runs/{run_id}/outputs")["outputs"] == {}
    assert "mlp" in server.get(f"/api/runs/{newer}/outputs")["outputs"]
    server.client.request("DELETE", f"/api/runs/{newer}")
    status, _ = server.client.request("GET", f"/api/runs/{newer}/outputs")
    assert status == 404


def test_ddp_outside_a_worker_trains_in_one_process_with_a_warning(make_server):
    server = make_server()
    run_id = server.submit(quick_digits(epochs=1, strategy="ddp"))["run_id"]
    events = server.events_until_finished(run_id, timeout=120)
    warning = next(e for e in events if e["type"] == "warning")
    assert warning["node_id"] == "trainer" and warning["payload"]["code"] == "ddp_not_available"
    assert events[-1]["payload"]["status"] == "succeeded"


def test_cancel_stops_training_between_batches(make_server):
    server = make_server()
    run_id = server.submit(quick_digits(epochs=100_000))["run_id"]
    for kind, data in server.client.stream(f"/api/runs/{run_id}/stream", read_timeout=120):
        if kind == "run_event" and data["type"] == "metric":
            break  # training is under way
    server.client.request("POST", f"/api/runs/{run_id}/cancel")
    events = server.events_until_finished(run_id, timeout=60)
    assert events[-1]["payload"]["status"] == "cancelled"
    assert len(series(server, run_id, "train_loss")) < 100_000
