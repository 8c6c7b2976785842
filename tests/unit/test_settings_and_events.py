"""Settings edge rules and the payload cap."""

from __future__ import annotations

import json
from pathlib import Path

from troupe.protocol.events import cap_payload
from troupe.protocol.settings import Settings, normalise_key


def settings(**env):
    return Settings.from_env(env, default_home=Path("/tmp/x"))


def test_defaults():
    s = settings()
    assert (s.run_queue_max_concurrent_gpu, s.run_queue_max_concurrent_cpu, s.run_interactive_max_concurrent,
            s.max_parallel_nodes, s.run_retention_keep_last, s.run_event_payload_cap_bytes,
            s.run_events_response_cap_bytes) == (1, 2, 2, 4, 200, 131072, 4194304)
    assert s.concurrency_for("cpu") == 2 and s.concurrency_for("cuda:3") == 1 and s.concurrency_for("w/cpu") == 2
    assert s.warnings == ()


def test_limits_below_one_count_as_one_and_garbage_is_ignored_with_a_warning():
    s = settings(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="0", TROUPE_MAX_PARALLEL_NODES="-2",
                 TROUPE_RUN_INTERACTIVE_MAX_CONCURRENT="lots")
    assert s.run_queue_max_concurrent_cpu == 1 and s.max_parallel_nodes == 1
    assert s.run_interactive_max_concurrent == 2 and len(s.warnings) == 1


def test_amounts_past_their_range_or_not_finite_are_ignored_with_a_warning():
    s = settings(TROUPE_PORT="99999", TROUPE_CLASS_MAX_MEMORY_GIB="inf", TROUPE_WORKER_HEARTBEAT_S="nan",
                 TROUPE_STOP_GRACE_S="1e308")
    assert s.port == 8765 and "max_memory_mib" not in s.class_quotas  # once a port 99999 - 65536, an OverflowError
    assert (s.worker_heartbeat_s, s.stop_grace_s) == (10.0, 10.0)
    assert len(s.warnings) == 4, s.warnings


def test_per_key_overrides_win_and_alias_keys_merge():
    s = settings(TROUPE_RUN_QUEUE_MAX_CONCURRENT="cuda=2, cpu=8, mps:0=0, bad, =3, x=y")
    assert dict(s.run_queue_max_concurrent) == {"cuda:0": 2, "cpu": 8, "mps:0": 1}
    assert s.concurrency_for("cuda:0") == 2 and s.concurrency_for("cpu") == 8
    assert len(s.warnings) == 3
    assert normalise_key("gpu-a/cuda") == "gpu-a/cuda:0" and normalise_key("mps") == "mps:0"


def test_retention_and_caps_keep_their_edge_values():
    s = settings(TROUPE_RUN_RETENTION_KEEP_LAST="-1", TROUPE_RUN_EVENT_PAYLOAD_CAP_BYTES="0")
    assert s.run_retention_keep_last == -1 and s.run_event_payload_cap_bytes == 0


def test_an_integer_past_what_sqlite_takes_is_ignored_with_a_warning():
    # Once a start-up prune's LIMIT: an OverflowError, and no server.
    s = settings(TROUPE_RUN_RETENTION_KEEP_LAST=str(2**63), TROUPE_RUN_CONSOLE_CAP_BYTES=str(-2**63))
    assert s.run_retention_keep_last == 200 and s.run_console_cap_bytes == 8 * 1024 * 1024
    assert len(s.warnings) == 2, s.warnings


def test_a_packs_import_check_keeps_its_edge_values():
    s = settings()
    assert (s.pack_import_timeout_s, s.pack_import_memory_mib) == (10.0, 2048)
    off = settings(TROUPE_PACK_IMPORT_TIMEOUT_S="0", TROUPE_PACK_IMPORT_MEMORY_MIB="0")  # no check; no limit
    assert (off.pack_import_timeout_s, off.pack_import_memory_mib, off.warnings) == (0.0, 0, ())
    bad = settings(TROUPE_PACK_IMPORT_TIMEOUT_S="soon", TROUPE_PACK_IMPORT_MEMORY_MIB="-1")
    assert (bad.pack_import_timeout_s, bad.pack_import_memory_mib) == (10.0, 2048) and len(bad.warnings) == 2


def test_payload_cap_replaces_the_biggest_outputs_with_markers_naming_the_port():
    payload = {"duration_s": 0.1, "outputs": {"small": 1, "big": "x" * 5000, "bigger": "y" * 9000}}
    capped = cap_payload(payload, 6000)
    assert capped["outputs"]["small"] == 1 and capped["outputs"]["big"] == "x" * 5000
    assert capped["outputs"]["bigger"] == {"omitted": True, "port": "bigger", "bytes": 9002, "reason": "payload_cap"}
    assert len(json.dumps(capped)) <= 6000
    assert cap_payload(payload, 0) is payload and cap_payload(payload, -5) is payload


def test_a_slurm_jobs_end_is_read_once_with_the_settings(tmp_path):
    s = Settings.from_env({"SLURM_JOB_END_TIME": "1893456000"}, default_home=tmp_path)
    assert s.job_end_time == 1893456000.0
    bad = Settings.from_env({"SLURM_JOB_END_TIME": "soon"}, default_home=tmp_path)
    assert bad.job_end_time is None and any("SLURM_JOB_END_TIME" in w for w in bad.warnings)
    assert Settings.from_env({}, default_home=tmp_path).job_end_time is None


def test_s3_is_on_only_with_a_usable_bucket_and_says_why_not(tmp_path):
    on = Settings.from_env({"TROUPE_S3_ENABLED": "1", "TROUPE_S3_BUCKET": "lab-bucket", "TROUPE_S3_PREFIX": "/runs/"},
                           default_home=tmp_path)
    assert on.s3 is not None and (on.s3.bucket, on.s3.prefix) == ("lab-bucket", "runs/") and on.warnings == ()
    for env in ({"TROUPE_S3_ENABLED": "1"}, {"TROUPE_S3_ENABLED": "1", "TROUPE_S3_BUCKET": "x"}):
        off = Settings.from_env(env, default_home=tmp_path)
        assert off.s3 is None and "TROUPE_S3_BUCKET" in off.warnings[0] and "S3 stays off" in off.warnings[0]
    assert Settings.from_env({"TROUPE_S3_BUCKET": "lab-bucket"}, default_home=tmp_path).s3 is None  # off by default
