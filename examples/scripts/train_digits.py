"""A plain training script, as a lab already has one: scikit-learn's digits, a small
torch MLP, argparse for its settings. Run as a troupe node (script.Command) it needs
nothing from troupe: it prints one JSON line per metric point and per step of
progress, writes a checkpoint every --checkpoint-every epochs into
$TROUPE_CHECKPOINT_DIR (a temporary name, renamed into place), and goes on from
$TROUPE_RESUME_FROM when it is set. By hand: python train_digits.py --epochs 3."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--seed", type=int, default=int(os.environ.get("TROUPE_SEED") or 0))
    parser.add_argument("--checkpoint-every", type=int, default=1)
    parser.add_argument("--pause", type=float, default=0.0, help="seconds to wait after each epoch (a demo)")
    args = parser.parse_args()

    import torch
    from sklearn.datasets import load_digits

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(args.seed))
    train, val = order[:1400], order[1400:]
    model = torch.nn.Sequential(torch.nn.Linear(64, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    start, val_loss = 0, None
    resume = os.environ.get("TROUPE_RESUME_FROM")
    if resume:
        state = torch.load(resume, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        start = int(state["epoch"])
    folder = Path(os.environ.get("TROUPE_CHECKPOINT_DIR") or "checkpoints")
    folder.mkdir(parents=True, exist_ok=True)
    for epoch in range(start + 1, args.epochs + 1):
        model.train()
        for batch in train[torch.randperm(len(train))].split(64):
            optimizer.zero_grad()
            loss = loss_fn(model(x[batch]), y[batch])
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            train_loss = loss_fn(model(x[train]), y[train]).item()
            val_loss = loss_fn(model(x[val]), y[val]).item()
        print(json.dumps({"metric": "train_loss", "value": train_loss, "step": epoch}), flush=True)
        print(json.dumps({"metric": "val_loss", "value": val_loss, "step": epoch}), flush=True)
        print(json.dumps({"progress": epoch, "total": args.epochs}), flush=True)
        if args.checkpoint_every and epoch % args.checkpoint_every == 0:
            temporary = folder / f".epoch-{epoch}.pt.tmp"
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "rng": torch.get_rng_state(), "epoch": epoch}, temporary)
            temporary.rename(folder / f"epoch-{epoch}.pt")
        time.sleep(args.pause)
    print(json.dumps({"result": val_loss}), flush=True)


if __name__ == "__main__":
    main()
