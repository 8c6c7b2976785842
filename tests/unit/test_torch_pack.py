"""torch pack nodes through the engine: CSV data, the CNN, checkpoints, predictions."""

from __future__ import annotations

import csv

from tests.helpers import edge, graph, node
from troupe.protocol.graph import Graph
from troupe.subprocess_runner.catalog import load_catalog
from troupe.subprocess_runner.context import ExecutionContext, Sinks
from troupe.subprocess_runner.engine import execute_graph, prepare_executable_graph, summarize

CATALOG = load_catalog()


def run(doc, tmp_path, seed=1):
    events = []
    ctx = ExecutionContext("t" * 32, None, "cpu", seed, Sinks(lambda k, n, p: events.append((k, n, p))),
                           run_dir=tmp_path / "run")
    outcome = execute_graph(prepare_executable_graph(Graph.model_validate(doc), CATALOG), ctx)
    assert outcome.status == "succeeded", outcome.error
    return outcome.outputs, events


def test_csv_regression_trains_and_predicts(tmp_path):
    path = tmp_path / "data.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["a", "b", "y"])
        for i in range(60):
            writer.writerow([i / 60, (i % 7) / 7, 2 * i / 60 + 1])
    doc = graph(
        node("csv", "torch.CSVDataset", path=str(path), target="y", task="regression"),
        node("tl", "torch.DataLoader", batch_size=16), node("vl", "torch.DataLoader", shuffle=False),
        node("mlp", "torch.MLP", hidden="8"),
        {"id": "opt", "type": "torch.Optimizer", "params": {"kind": "sgd", "lr": 0.05}},
        {"id": "loss", "type": "torch.Loss", "params": {"kind": "mse"}}, node("fit", "torch.TrainingLoop", epochs=5),
        node("pred", "torch.Predict"),
        edges=(edge("csv", "train", "tl", "dataset"), edge("csv", "val", "vl", "dataset"),
               edge("csv", "train", "mlp", "data"), edge("mlp", "model", "fit", "model"),
               edge("tl", "loader", "fit", "train"), edge("vl", "loader", "fit", "val"),
               edge("opt", "optimizer", "fit", "optimizer"), edge("loss", "loss", "fit", "loss"),
               edge("fit", "model", "pred", "model"), edge("vl", "loader", "pred", "data")),
    )
    outputs, events = run(doc, tmp_path)
    assert summarize(outputs["csv"]["train"]) == {"type": "dataset", "rows": 48, "features": 2,
                                                   "task": "regression", "classes": None}
    predictions = summarize(outputs["pred"]["predictions"])
    assert predictions["type"] == "tensor" and predictions["shape"] == [12, 1] and predictions["dtype"] == "float32"
    assert {"min", "max", "mean", "preview"} <= set(predictions)
    assert [p["epoch"] for k, _, p in events if k == "metric" and p["name"] == "train_loss"] == [1, 2, 3, 4, 5]


def test_small_cnn_on_digits_and_a_checkpoint_round_trip(tmp_path):
    doc = graph(
        node("digits", "torch.DigitsDataset"), node("tl", "torch.DataLoader", batch_size=128),
        node("vl", "torch.DataLoader", shuffle=False), node("cnn", "torch.SmallCNN", channels=4),
        node("fit", "torch.TrainingLoop", epochs=1), node("save", "torch.SaveCheckpoint", name="cnn"),
        node("ev", "torch.Evaluate"),
        edges=(edge("digits", "train", "tl", "dataset"), edge("digits", "val", "vl", "dataset"),
               edge("digits", "train", "cnn", "data"), edge("cnn", "model", "fit", "model"),
               edge("tl", "loader", "fit", "train"), edge("fit", "model", "save", "model"),
               edge("save", "model", "ev", "model"), edge("vl", "loader", "ev", "data")),
    )
    outputs, events = run(doc, tmp_path)
    saved = outputs["save"]["path"]
    assert saved == str(tmp_path / "run" / "checkpoints" / "cnn.pt")
    assert ("artifact", "save", {"kind": "checkpoint", "path": saved}) in events
    model = summarize(outputs["cnn"]["model"])
    assert model["class"] == "SmallCNN" and model["parameters"] > 0
    accuracy = outputs["ev"]["accuracy"]

    reload = graph(
        node("digits", "torch.DigitsDataset"), node("vl", "torch.DataLoader", shuffle=False),
        node("cnn", "torch.SmallCNN", channels=4), node("load", "torch.LoadCheckpoint", path=saved),
        node("ev", "torch.Evaluate"),
        edges=(edge("digits", "train", "cnn", "data"), edge("digits", "val", "vl", "dataset"),
               edge("cnn", "model", "load", "model"), edge("load", "model", "ev", "model"),
               edge("vl", "loader", "ev", "data")),
    )
    again, _ = run(reload, tmp_path, seed=99)
    assert again["ev"]["accuracy"] == accuracy  # the same weights, whatever the seed
