"""A run's row and executable graph from a submission, validated completely (device,
lane, graph, declared cpus) before anything is queued. Used by the HTTP routes and by
the actors that queue runs of their own (studies)."""

from __future__ import annotations

import uuid
from typing import Any

from protocol import events as ev
from protocol.api import RunOptions
from protocol.errors import InvalidRequest
from protocol.graph import Graph
from protocol.settings import ANY_PREFIX, Settings
from subprocess_runner.catalog import Catalog
from subprocess_runner.devices import parse_device, resolve_device
from subprocess_runner.engine import ExecutableGraph, prepare_executable_graph

ANY = ANY_PREFIX.rstrip("/")


def target_worker(options: RunOptions) -> str | None:
    """The worker ``options.target`` names; None for a local run. Raises for a bad shape."""
    target = options.target
    if target is None or target.get("worker") in (None, "local"):
        return None
    worker = target.get("worker")
    if not isinstance(worker, str) or not worker:
        raise InvalidRequest("options.target.worker must be a worker's name", pointer="/options/target/worker",
                             code="unknown_target")
    if options.lane == ev.LANE_INTERACTIVE:
        raise InvalidRequest("interactive runs execute in the control plane; drop the target or the lane",
                             pointer="/options/lane")
    return worker


def build_row(settings: Settings, catalog: Catalog, accelerators: tuple[str, ...], graph_doc: Graph,
              name: str | None, options: RunOptions, prefix: str = "/graph",
              worker: tuple[str, tuple[str, ...]] | None = None, **extra: Any
              ) -> tuple[dict[str, Any], ExecutableGraph]:
    """Validates a submission completely (device, lane, graph) before anything is queued,
    and returns the run's row and executable graph. ``worker`` is (name, its devices)
    for a run placed on a worker."""
    if options.lane == ev.LANE_INTERACTIVE and options.editor_session is None:
        raise InvalidRequest("lane 'interactive' needs options.editor_session", pointer="/options/editor_session")
    requested, where = options.device, "/options/device"
    devices = (options.target or {}).get("devices") if worker is not None else None
    if devices:
        if not isinstance(devices, list) or not all(isinstance(d, str) for d in devices):
            raise InvalidRequest("options.target.devices must be a list of devices", pointer="/options/target/devices")
        requested, where = devices[0], "/options/target/devices/0"  # target.devices wins over device
    elif requested is None:
        requested, where = graph_doc.settings.device, f"{prefix}/settings/device"
    available = tuple(d for d in worker[1] if d != "cpu") if worker is not None else accelerators
    try:
        device, warning = resolve_device(requested, available)
    except ValueError as exc:
        raise InvalidRequest(str(exc), pointer=where, code="invalid_device") from None
    anywhere = worker is not None and worker[0] == ANY
    if anywhere and device != "cpu" and parse_device(requested or "") in (("auto", None), ("cuda", None)):
        device = "auto"  # the first free card of whichever worker takes it
    if warning and worker is not None:
        warning = warning.replace("this server", "any worker" if anywhere else f"worker {worker[0]}")
    graph = prepare_executable_graph(graph_doc, catalog, prefix)
    for i, node in enumerate(graph_doc.nodes):
        if node.resources is not None and (node.resources.cpus or 0) > settings.cpus:
            raise InvalidRequest(
                f"node {node.id} declares {node.resources.cpus} cpus; this server lends {settings.cpus} "
                "(TROUPE_CPUS)", pointer=f"{prefix}/nodes/{i}/resources/cpus", node_id=node.id,
                code="cpus_unavailable")
    row = {
        "id": uuid.uuid4().hex,
        "name": name or graph_doc.name,
        "status": ev.QUEUED,
        "device": device,
        "queue_key": f"{worker[0]}/{device}" if worker is not None else device,
        "worker": worker[0] if worker is not None and not anywhere else None,  # ``any``: set when placed
        "lane": options.lane,
        "editor_session": options.editor_session,
        "seed": options.seed,
        "deterministic": options.deterministic,
        "record_outputs": options.record_outputs,
        "graph": graph_doc.model_dump(mode="json", exclude_none=True),
        "options": options.model_dump(mode="json", exclude_none=True),
        "warnings": [warning] if warning else [],
        "created_at": ev.utc_now(),
        **extra,
    }
    return row, graph
