"""The torch pack: datasets, models and a training loop small enough for a 2-core CPU.

This module only declares the nodes; their code lives in ``_torch_*`` modules that are
imported on a node's first execution, so the catalog (and the control plane) never
imports torch or scikit-learn. Nothing is loaded from the internet.
"""

from __future__ import annotations

from troupe.subprocess_runner.node_types import NodeType, Pack, Param, Port, lazy

_DATA = "troupe.subprocess_runner.packs._torch_data"
_MODELS = "troupe.subprocess_runner.packs._torch_models"
_TRAIN = "troupe.subprocess_runner.packs._torch_train"

_SPLIT = (
    Param("val_fraction", "float", default=0.2, min=0.0, max=0.9, description="share of rows held out"),
    Param("seed", "int", default=0, min=0, max=2**32 - 1, description="the split's own shuffle seed"),
)
_SPLIT_OUT = (Port("train", "dataset"), Port("val", "dataset"))

PACK = Pack(
    name="torch",
    node_types=(
        NodeType(
            "torch.DigitsDataset", lazy(f"{_DATA}:digits"), outputs=_SPLIT_OUT, params=_SPLIT,
            description="The 8x8 handwritten digits shipped with scikit-learn (1797 images, 10 classes).",
        ),
        NodeType(
            "torch.SyntheticClassification", lazy(f"{_DATA}:synthetic_classification"), outputs=_SPLIT_OUT,
            params=(
                Param("n", "int", default=1000, min=10, max=1_000_000),
                Param("features", "int", default=20, min=1, max=10_000),
                Param("classes", "int", default=2, min=2, max=1000),
                Param("noise", "float", default=0.1, min=0.0, max=10.0),
                *_SPLIT,
            ),
            description="Gaussian class clusters.",
        ),
        NodeType(
            "torch.SyntheticRegression", lazy(f"{_DATA}:synthetic_regression"), outputs=_SPLIT_OUT,
            params=(
                Param("n", "int", default=1000, min=10, max=1_000_000),
                Param("features", "int", default=10, min=1, max=10_000),
                Param("noise", "float", default=0.1, min=0.0, max=10.0),
                *_SPLIT,
            ),
            description="A noisy linear target.",
        ),
        NodeType(
            "torch.CSVDataset", lazy(f"{_DATA}:csv_dataset"), outputs=_SPLIT_OUT,
            params=(
                Param("path", "string", description="a CSV file on the machine that executes the run"),
                Param("target", "string", description="the column to predict"),
                Param("task", "select", default="classification", options=("classification", "regression")),
                *_SPLIT,
            ),
            description="A local CSV file of numeric columns.",
        ),
        NodeType(
            "torch.DataLoader", lazy(f"{_DATA}:data_loader"),
            inputs=(Port("dataset", "dataset"),), outputs=(Port("loader", "loader"),),
            params=(Param("batch_size", "int", default=32, min=1, max=65536), Param("shuffle", "bool", default=True)),
            description="Batches a dataset; a seeded run shuffles the same way every time.",
        ),
        NodeType(
            "torch.MLP", lazy(f"{_MODELS}:mlp"),
            inputs=(Port("data", "dataset", required=False),), outputs=(Port("model", "model"),),
            params=(
                Param("hidden", "string", default="64,32", description="hidden layer widths"),
                Param("activation", "select", default="relu", options=("relu", "tanh", "gelu", "sigmoid")),
                Param("dropout", "float", default=0.0, min=0.0, max=0.9),
                Param("in_features", "int", default=0, min=0, description="0: taken from data"),
                Param("out_features", "int", default=0, min=0, description="0: taken from data"),
            ),
            description="A multi-layer perceptron.",
        ),
        NodeType(
            "torch.SmallCNN", lazy(f"{_MODELS}:small_cnn"),
            inputs=(Port("data", "dataset", required=False),), outputs=(Port("model", "model"),),
            params=(
                Param("channels", "int", default=16, min=1, max=512),
                Param("image_size", "int", default=0, min=0, description="0: the square root of data's features"),
                Param("classes", "int", default=0, min=0, description="0: taken from data"),
            ),
            description="Two convolutions and a linear head, for small square grey images.",
        ),
        NodeType(
            "torch.Optimizer", lazy(f"{_MODELS}:optimizer"), outputs=(Port("optimizer", "optimizer"),),
            params=(
                Param("kind", "select", default="adam", options=("sgd", "adam", "adamw")),
                Param("lr", "float", default=1e-3, min=0.0, max=10.0),
                Param("weight_decay", "float", default=0.0, min=0.0, max=1.0),
            ),
        ),
        NodeType(
            "torch.Loss", lazy(f"{_MODELS}:loss"), outputs=(Port("loss", "loss"),),
            params=(Param("kind", "select", default="cross_entropy", options=("cross_entropy", "mse", "l1")),),
        ),
        NodeType(
            "torch.TrainingLoop", lazy(f"{_TRAIN}:training_loop"),
            inputs=(
                Port("model", "model"), Port("train", "loader"), Port("val", "loader", required=False),
                Port("optimizer", "optimizer", required=False), Port("loss", "loss", required=False),
            ),
            outputs=(Port("model", "model"), Port("train_loss", "float")),
            params=(
                Param("epochs", "int", default=10, min=1, max=100_000),
                Param("strategy", "select", default="single", options=("single", "ddp")),
                Param("checkpoint_every", "int", default=0, min=0, description="epochs; 0: no checkpoints"),
                Param("keep_checkpoints", "int", default=0, min=0,
                      description="keep the newest N checkpoints (the rest are let go); 0: all"),
                Param("keep_best", "string", default="",
                      description="also keep the best checkpoint by this series (val_loss; max:val_accuracy)"),
            ),
            description="Trains, logging train_loss and val_loss per epoch; stops between batches on cancel.",
        ),
        NodeType(
            "torch.Evaluate", lazy(f"{_TRAIN}:evaluate"),
            inputs=(Port("model", "model"), Port("data", "loader"), Port("loss", "loss", required=False)),
            outputs=(Port("accuracy", "float"), Port("loss", "float")),
            description="Logs eval_accuracy (classification) and eval_loss.",
        ),
        NodeType(
            "torch.Predict", lazy(f"{_TRAIN}:predict"),
            inputs=(Port("model", "model"), Port("data", "loader")), outputs=(Port("predictions", "tensor"),),
        ),
        NodeType(
            "torch.SaveCheckpoint", lazy(f"{_TRAIN}:save_checkpoint"),
            inputs=(Port("model", "model"),), outputs=(Port("model", "model"), Port("path", "string")),
            params=(Param("name", "string", default="model"),),
            description="Writes the model's weights into the run's checkpoints folder.",
        ),
        NodeType(
            "torch.LoadCheckpoint", lazy(f"{_TRAIN}:load_checkpoint"),
            inputs=(Port("model", "model"),), outputs=(Port("model", "model"),),
            params=(Param("path", "string"),),
            description="Loads weights saved by SaveCheckpoint or TrainingLoop into the model.",
        ),
    ),
)
