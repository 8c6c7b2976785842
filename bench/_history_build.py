"""The troupe side of bench/history.py's build: a store of finished runs made through the
store's own bulk path (troupe/actors/store/bulk.py: the writes a server commits over a run's
life, through its ``Writer``), resumable, a chunk of runs a transaction.

Each run copies a template: one real run of examples/digits_mlp.json trained 20 epochs
on a real ``troupe start`` (taken once per store folder, kept in ``template.json``): its
record, its events and its row's end. A bulk run is that run with the params and points
of ``bench._history_runs.run(i)``, its times moved to when it was made, its events those
of the template but for the series the bench leaves out (val_accuracy, the evaluation's
two points) and the artifacts (their files are not there): 57 events, 40 of them points.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench._history_runs import BLOCK, DROPOUT, HIDDEN, LRS, SERIES, SWEEP, Run, run, sweep_batch, sweep_id
from bench._measure import BenchError
from bench._troupe import REPO, start_server, stop_server_proc
from troupe.actors.store.bulk import BulkStore, FinishedRun, SweepOf
from troupe.actors.submission import shared_base
from troupe.protocol.run_record import SharedGraph
from troupe.subprocess_runner.sweeps import with_params

CHUNK = BLOCK * 10  # runs a transaction
SWEPT = ("adam.lr", "mlp.hidden", "mlp.dropout")


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _seconds(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


def capture_template(path: Path) -> dict[str, Any]:
    """One real run of the digits example, 20 epochs, on a real server: its row and events."""
    if path.exists():
        return dict(json.loads(path.read_text()))
    from bench._http import Conn

    graph = json.loads((REPO / "examples" / "digits_mlp.json").read_text())
    for node in graph["nodes"]:
        if node["id"] == "trainer":
            node["params"]["epochs"] = 20
    home = path.parent / "template-home"
    home.mkdir(parents=True, exist_ok=True)
    server = start_server(home, 1, 60)
    try:
        conn = Conn(server.port, server.token, 120)
        status, reply = conn.request("POST", "/api/runs", json.dumps({"graph": graph}).encode())
        if status != 201:
            raise BenchError(f"the template run was refused: {status} {reply}")
        run_id = reply["run_id"]
        deadline = time.monotonic() + 600
        while (row := conn.request("GET", f"/api/runs/{run_id}")[1])["status"] not in ("succeeded", "failed"):
            if time.monotonic() > deadline:
                raise BenchError("the template run did not end in 600 s")
            time.sleep(0.5)
        if row["status"] != "succeeded":
            raise BenchError(f"the template run failed: {row.get('error')}")
        events = conn.request("GET", f"/api/runs/{run_id}/events")[1]["events"]
        conn.close()
    finally:
        stop_server_proc(server.proc, 30)
    template = {"row": row, "events": events}
    path.write_text(json.dumps(template))
    return template


class Maker:
    """Run ``i`` of the year as the store's bulk path takes it."""

    def __init__(self, template: dict[str, Any]) -> None:
        row = template["row"]
        base = FinishedRun.from_stored(row, template["events"])
        self.record = base.record
        self.graph = dict(row["graph"])
        t0 = _seconds(row["created_at"])
        kept = [e for e in template["events"] if e["type"] != "artifact" and not (
            e["type"] == "metric" and e["payload"]["name"] not in SERIES)]
        self.events = [(e, _seconds(e["ts"]) - t0) for e in kept]
        self.end = {key: value for key, value in base.end.items()}
        self.end_times = {key: _seconds(value) - t0 for key, value in base.end.items()
                          if key in ("started_at", "finished_at")}
        progress = base.end.get("progress") or {}
        self.progress_times = {key: _seconds(progress[key]) - t0 for key in ("first_at", "at") if key in progress}
        self.bases: dict[int, tuple[str, str, dict[str, Any]]] = {}

    def _base(self, batch: int, data_seed: int) -> tuple[str, str, dict[str, Any]]:
        key = batch * 100 + data_seed
        if key not in self.bases:
            document = with_params(self.graph, {"train_loader.batch_size": batch, "digits.seed": data_seed})
            self.bases[key] = (*shared_base(document), document)
        return self.bases[key]

    def finished(self, r: Run) -> FinishedRun:
        created = r.created
        changes: dict[str, Any] = {"id": r.id, "enqueue_seq": r.index + 1, "created_at": iso(created)}
        if r.sweep is not None:
            digest, text, base = self._base(int(str(r.params["train_loader.batch_size"])),
                                            int(str(r.params["digits.seed"])))
            own = {key: r.params[key] for key in SWEPT}
            changes.update(graph=with_params(base, own), shared_graph=SharedGraph(digest, text, own),
                           sweep_id=sweep_id(r.sweep), sweep_variant=r.variant, name=f"lr-sweep-{r.sweep}")
        else:
            changes.update(graph=with_params(self.graph, r.params))
        return FinishedRun(self.record.with_changes(**changes), tuple(self._events(r)), self._end(r))

    def _events(self, r: Run) -> Iterator[dict[str, Any]]:
        step = {name: 0 for name in SERIES}
        final_val, final_train = r.points["val_loss"][-1], r.points["train_loss"][-1]
        for seq, (event, offset) in enumerate(self.events, start=1):
            payload = event["payload"]
            if event["type"] == "metric":
                name = payload["name"]
                step[name] += 1
                payload = {**payload, "step": step[name], "value": r.points[name][step[name] - 1],
                           "epoch": step[name]}
            elif event["type"] == "node_finished" and event["node_id"] == "adam":
                payload = {**payload, "outputs": {"optimizer": {**payload["outputs"]["optimizer"],
                                                                "lr": r.params["adam.lr"]}}}
            elif event["type"] == "node_finished" and event["node_id"] == "trainer":
                payload = {**payload, "outputs": {**payload["outputs"], "train_loss": final_train}}
            elif event["type"] == "node_finished" and event["node_id"] == "evaluate":
                payload = {**payload, "outputs": {**payload["outputs"], "loss": final_val}}
            yield {**event, "seq": seq, "ts": iso(r.created + offset), "payload": payload}

    def _end(self, r: Run) -> dict[str, Any]:
        end = {**self.end, **{key: iso(r.created + offset) for key, offset in self.end_times.items()}}
        if end.get("progress"):
            end["progress"] = {**end["progress"], **{key: iso(r.created + offset)
                                                     for key, offset in self.progress_times.items()}}
        return end

    def sweep_row(self, block: int, variants_of: list[Run]) -> tuple[dict[str, Any], tuple[dict[str, Any], ...]]:
        first = variants_of[0]
        grid = {"adam.lr": list(LRS), "mlp.hidden": list(HIDDEN), "mlp.dropout": list(DROPOUT)}
        spec = {"method": "grid", "params": [{"node_id": key.split(".")[0], "param": key.split(".")[1],
                                              "values": values} for key, values in grid.items()],
                "samples": None, "seed": None}
        domains = [{"key": key, "node_id": key.split(".")[0], "param": key.split(".")[1], "values": values}
                   for key, values in grid.items()]
        sweep = {"id": sweep_id(block), "name": f"lr-sweep-{block}", "spec": spec,
                 "objective": {"metric": "val_loss", "direction": "minimize"}, "domains": domains,
                 "total": SWEEP, "created_at": iso(first.created), "submitted_by": self.record.submitted_by}
        variants = tuple({"index": r.variant, "params": {key: r.params[key] for key in SWEPT}, "run_id": r.id,
                          "seed": None} for r in variants_of)
        assert sweep_batch(block) == first.params["train_loader.batch_size"]
        return sweep, variants


def stored_seqs(bulk: BulkStore, lo: int, hi: int) -> set[int]:
    return {int(str(s)) for (s,) in bulk.conn.execute(
        "SELECT enqueue_seq FROM runs WHERE enqueue_seq > ? AND enqueue_seq <= ?", (lo, hi))}


def items_for(maker: Maker, bulk: BulkStore, lo: int, hi: int) -> list[FinishedRun | SweepOf]:
    """The runs with index in [lo, hi) that the store lacks, a whole sweep as one write
    where its row is new."""
    have = stored_seqs(bulk, lo, hi)
    items: list[FinishedRun | SweepOf] = []
    for block in range(lo // BLOCK, (hi + BLOCK - 1) // BLOCK):
        first, last = max(lo, block * BLOCK), min(hi, (block + 1) * BLOCK)
        made = [run(i) for i in range(first, last) if i + 1 not in have]
        sweep_runs = [r for r in made if r.sweep is not None]
        exists = bool(bulk.conn.execute("SELECT 1 FROM sweeps WHERE id = ?", (sweep_id(block),)).fetchall())
        if sweep_runs and not exists:
            # A sweep's row names all its variants; a store that ends within it holds its
            # first runs (the others are added as the store grows, as if not yet made).
            sweep, variants = maker.sweep_row(block, [run(block * BLOCK + pos) for pos in range(SWEEP)])
            items.append(SweepOf(sweep, variants, tuple(maker.finished(r) for r in sweep_runs)))
        else:
            items += [maker.finished(r) for r in sweep_runs]
        items += [maker.finished(r) for r in made if r.sweep is None]
    return items


def build(store_dir: Path, runs: int, say: Any = print) -> dict[str, float]:
    """Fills ``store_dir/home`` up to ``runs`` runs (resuming), and says how fast."""
    template = capture_template(store_dir / "template.json")
    maker = Maker(template)
    home = store_dir / "home"
    bulk = BulkStore(home / "troupe.db", home / "runs")
    try:
        start = int(str(bulk.conn.execute("SELECT COALESCE(MAX(enqueue_seq), 0) FROM runs").fetchall()[0][0]))
        start -= start % CHUNK
        made, t0 = 0, time.perf_counter()
        last_said = t0
        for lo in range(start, runs, CHUNK):
            hi = min(runs, lo + CHUNK)
            items = items_for(maker, bulk, lo, hi)
            bulk.store(items)
            made += sum(len(i.runs) if isinstance(i, SweepOf) else 1 for i in items)
            now = time.perf_counter()
            if made and (now - last_said > 30 or hi == runs):
                say(f"build: {hi:,} of {runs:,} runs stored, {made / (now - t0):.0f} runs/s "
                    f"({made * 40 / (now - t0):.0f} points/s) over the last {made:,}")
                last_said = now
        took = time.perf_counter() - t0
        if not made:
            say(f"build: the store already holds its {runs:,} runs")
    finally:
        bulk.close()
    return {"made": made, "build_s": took, "runs_per_s": made / took if made else 0.0}
