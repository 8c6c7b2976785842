"""The run histograms say what Prometheus' own would: a wait that lands on a bucket's
bound counts in that bucket (``le``), the buckets only grow, the +Inf bucket is the
count, and a run's wait and duration are measured from its row's own stamps."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from troupe.actors.run_tally import RunTally


def _samples(tally: RunTally, name: str, queue_key: str) -> dict[str, float]:
    text = generate_latest(tally.registry).decode()
    family = next(f for f in text_string_to_metric_families(text) if f.name == name)
    return {s.labels.get("le", s.name.rsplit("_", 1)[-1]): s.value for s in family.samples
            if s.labels["queue_key"] == queue_key}


def test_a_value_on_a_bound_counts_in_that_bucket_and_the_buckets_add_up():
    tally = RunTally()
    stamps = [("r1", "2026-12-07T10:00:00Z", "2026-12-07T10:00:00.500Z", "2026-12-07T10:00:05Z"),
              ("r2", "2026-12-07T10:00:00Z", "2026-12-07T10:00:20Z", "2026-12-07T10:00:21Z"),
              ("r3", "2026-12-07T10:00:00Z", "2026-12-07T10:00:00.050Z", "2026-12-08T10:00:00Z")]
    for run_id, created, started, finished in stamps:
        tally.inserted(run_id, "lab/cpu", created, None)
        tally.changed(run_id, {"status": "running", "started_at": started})
        tally.changed(run_id, {"status": "succeeded", "finished_at": finished})
    tally.inserted("other", "lab/cuda:0", "2026-12-07T10:00:00Z", None)
    tally.changed("other", {"status": "succeeded", "started_at": "2026-12-07T10:00:01Z",
                            "finished_at": "2026-12-07T10:00:01Z"})

    wait = _samples(tally, "troupe_queue_wait_seconds", "lab/cpu")
    assert (wait["0.1"], wait["0.5"], wait["15.0"], wait["60.0"], wait["+Inf"], wait["count"]) == (1, 2, 2, 3, 3, 3)
    assert abs(wait["sum"] - 20.55) < 1e-9
    duration = _samples(tally, "troupe_run_duration_seconds", "lab/cpu")
    assert (duration["1.0"], duration["5.0"], duration["43200.0"], duration["172800.0"]) == (1, 2, 2, 3)
    assert duration["+Inf"] == duration["count"] == 3
    quick = _samples(tally, "troupe_run_duration_seconds", "lab/cuda:0")
    assert (quick["1.0"], quick["count"], quick["sum"]) == (1, 1, 0.0)
