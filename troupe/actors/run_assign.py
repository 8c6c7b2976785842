"""What a run's executor is told, made from the run's record: the ``Execute`` an
in-process run is walked from (with the checkpoint files it resumes from), and the
``assign`` frame a worker runs it from. Kept apart from the RunActor, whose concern is
the run's lifecycle, not the wire's shape."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import Executor
from typing import Any

from troupe.actors.executor import Execute
from troupe.protocol import worker as wire
from troupe.protocol.events import LANE_INTERACTIVE
from troupe.protocol.run_record import RunRecord
from troupe.protocol.settings import Settings
from troupe.subprocess_runner.context import NodeLimits
from troupe.subprocess_runner.devices import torch_device
from troupe.subprocess_runner.engine import CpuGate, ExecutableGraph
from troupe.subprocess_runner.node_cache import NodeCache, SessionCache


def local_execute(record: RunRecord, graph: ExecutableGraph, settings: Settings, cancel: threading.Event,
                  node_pool: Executor | None, cpu_gate: CpuGate | None, node_cache: NodeCache | None) -> Execute:
    """An in-process run's graph walk, on the device it was admitted to."""
    return Execute(
        graph=graph,
        run_id=record.id,
        device=torch_device(record.device, settings.cuda_visible_devices),
        seed=record.seed,
        deterministic=record.deterministic,
        max_parallel=settings.max_parallel_nodes,
        cancel=cancel,
        pool=node_pool,
        run_dir=settings.home.joinpath("runs", record.id),
        cpu_gate=cpu_gate,
        cache=_editor_cache(record, node_cache),
        provenance=record.provenance,
        resume=_local_resume(record.resumed_from),
        console_cap_bytes=settings.run_console_cap_bytes,
        limits=NodeLimits(kill_grace_s=settings.command_kill_grace_s, readable=settings.readable_roots),
    )


def _editor_cache(record: RunRecord, cache: NodeCache | None) -> SessionCache | None:
    """The editor session's cache, for an interactive run only: a queued run is a
    record of its own, computed from scratch whoever submitted it."""
    session = record.editor_session
    if record.lane != LANE_INTERACTIVE or not session or cache is None or not cache.enabled:
        return None
    return cache.session(session)


def _local_resume(resumed: Mapping[str, Any] | None) -> dict[str, dict[str, str]] | None:
    """The checkpoint files of a resumed in-process run, on this machine."""
    if not resumed:
        return None
    return {node: {"weights": plan["weights_path"], "state": plan["state_path"],
                   "weights_sha256": plan["weights_sha256"], "state_sha256": plan["state_sha256"]}
            for node, plan in resumed["nodes"].items()}


def _remote_resume(resumed: Mapping[str, Any] | None) -> dict[str, wire.ResumeFiles]:
    """Where a worker's child fetches the checkpoint of a resumed run from."""
    if not resumed:
        return {}
    old = resumed["run_id"]
    return {node: wire.ResumeFiles(epoch=plan["epoch"], weights=f"/api/runs/{old}/artifacts/{plan['weights_id']}",
                                   weights_sha256=plan["weights_sha256"],
                                   state=f"/api/runs/{old}/artifacts/{plan['state_id']}",
                                   state_sha256=plan["state_sha256"])
            for node, plan in resumed["nodes"].items()}


def assign_frame(record: RunRecord, settings: Settings, caps: dict[str, int], graph: ExecutableGraph) -> wire.Assign:
    """``caps``: the shared cards the run holds (device -> card total MiB); its budget
    caps it on each, and only then is it sent. ``packs``: the folder packs its nodes
    are from, by digest, which an agent that accepts packs fetches before it starts."""
    storage = wire.Storage(mount_label=settings.mount_label if settings.mount_path is not None else None,
                           s3=settings.s3, transfer_max_mb=settings.upload_max_mb)
    return wire.Assign(run_id=record.id, graph=dict(record.graph), seed=record.seed,
                       deterministic=record.deterministic, devices=list(record.devices),
                       max_parallel=settings.max_parallel_nodes,
                       memory_budget_mib=record.memory_budget_mib if caps else None,
                       memory_total_mib=caps,
                       provenance=record.provenance, record_outputs=record.record_outputs,
                       storage=storage, resume=_remote_resume(record.resumed_from),
                       console_cap_bytes=max(0, settings.run_console_cap_bytes),
                       packs=dict(graph.folder_packs()))
