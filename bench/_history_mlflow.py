"""MLflow's side of bench/history.py, run by the python of a virtual environment that has
mlflow (never troupe's own): fills MLflow's SQLite store with the same runs troupe holds
(bench/_history_runs.py: the same params, the same 20 points of each of the two series),
through its store API (``create_run``, one ``log_batch`` a run, ``update_run_info``), then
times ``search_runs`` in this process with the filters troupe's ``where`` is timed with,
one search every ``--every`` seconds. Prints one JSON object.

    /tmp/mlflow-venv/bin/python bench/_history_mlflow.py --db DIR/mlflow-3000.db --runs 3000

The fill resumes where a previous one stopped (run ``r{i}`` for index ``i``).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sqlite3
import sys
import time
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # the repository, not bench/, first

from bench._history_runs import EPOCHS, run  # noqa: E402

FILTERS = {
    "param": "params.lr = '0.01'",
    "metric": "metrics.val_loss < 0.1",
    "both": "params.lr = '0.01' and metrics.val_loss < 0.1",
}


def _filled(db: Path) -> int:
    if not db.exists():
        return 0
    with sqlite3.connect(db) as conn:
        try:
            names = conn.execute("SELECT name FROM runs").fetchall()
        except sqlite3.OperationalError:
            return 0
    return max((int(name[1:]) + 1 for (name,) in names if name and name.startswith("r")), default=0)


def fill(db: Path, runs: int) -> dict[str, float]:
    from mlflow.entities import Metric, Param, RunStatus, RunTag
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from sqlalchemy import event

    store = SqlAlchemyStore(f"sqlite:///{db}", str(db.parent / "mlflow-artifacts"))
    # Every store call commits: on this VM's disk a sync each was most of the fill's time.
    # Not synced, the same rows land in the same tables; the searches open their own client.
    store.engine.dispose()
    event.listen(store.engine, "connect", lambda conn, _: conn.execute("PRAGMA synchronous=OFF"))
    found = store.get_experiment_by_name("history")
    experiment = found.experiment_id if found is not None else store.create_experiment("history")
    start = _filled(db)
    t0 = time.perf_counter()
    for index in range(start, runs):
        r = run(index)
        begin = int(r.created * 1000)
        made = store.create_run(experiment, "bench", begin, [RunTag("mlflow.runName", f"r{index}")], f"r{index}")
        params = [Param(key.split(".")[1], str(value)) for key, value in r.params.items()]
        metrics = [Metric(series, values[epoch], begin + 500 * (epoch + 1), epoch + 1)
                   for epoch in range(EPOCHS) for series, values in r.points.items()]
        store.log_batch(made.info.run_id, metrics=metrics, params=params, tags=[])
        store.update_run_info(made.info.run_id, RunStatus.FINISHED, begin + 10_500, None)
        if (index + 1) % 1000 == 0:
            print(f"mlflow: {index + 1} runs, {(index + 1 - start) / (time.perf_counter() - t0):.0f} runs/s",
                  file=sys.stderr, flush=True)
    took = time.perf_counter() - t0
    return {"filled_from": start, "runs": runs, "fill_s": took,
            "runs_per_s": (runs - start) / took if runs > start else math.nan, "experiment": float(experiment)}


def search(db: Path, samples: int, every: float, limit: int) -> dict[str, dict[str, float]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    experiment = client.get_experiment_by_name("history")
    assert experiment is not None
    out: dict[str, dict[str, float]] = {}
    for label, text in FILTERS.items():
        took: list[float] = []
        found = 0
        client.search_runs([experiment.experiment_id], text, max_results=limit)  # warm
        start = time.monotonic()
        for i in range(samples):
            time.sleep(max(0.0, start + i * every - time.monotonic()))
            t0 = time.perf_counter()
            found = len(client.search_runs([experiment.experiment_id], text, max_results=limit))
            took.append(time.perf_counter() - t0)
        ordered = sorted(took)
        out[label] = {"filter": text, "found": found, "n": samples,  # type: ignore[dict-item]
                      "p50_ms": ordered[max(1, math.ceil(0.5 * samples)) - 1] * 1e3,
                      "p99_ms": ordered[max(1, math.ceil(0.99 * samples)) - 1] * 1e3}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--runs", type=int, required=True)
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--every", type=float, default=0.1)
    parser.add_argument("--limit", type=int, default=50, help="max_results, the page troupe's where answers")
    parser.add_argument("--fill-only", action="store_true")
    args = parser.parse_args()
    logging.getLogger("alembic").setLevel(logging.WARNING)
    import mlflow

    args.db.parent.mkdir(parents=True, exist_ok=True)
    result: dict[str, object] = {"mlflow": mlflow.__version__, "fill": fill(args.db, args.runs),
                                 "db_mb": args.db.stat().st_size / 1e6}
    if not args.fill_only:
        result["search"] = search(args.db, args.samples, args.every, args.limit)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
