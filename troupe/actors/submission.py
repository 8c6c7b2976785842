"""A run's record and executable graph from a submission, validated completely (device,
lane, graph, declared cpus) before anything is queued. The placer makes them, in the one
conversation a submitter has with it (``Submit``): it decides first which worker the
target may reach, by its target rules (``placer/eligibility.py``)."""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from troupe.actors.errors import DeviceUnavailable
from troupe.actors.placer.book import WorkerOffer
from troupe.actors.resources import Machine, resolve
from troupe.protocol import events as ev
from troupe.protocol import jsonsafe
from troupe.protocol.api import RunOptions, held_devices
from troupe.protocol.errors import InvalidRequest
from troupe.protocol.graph import Graph
from troupe.protocol.queue_key import ANY_POOL as ANY
from troupe.protocol.queue_key import ONE_SHOT_POOL as ONE_SHOT
from troupe.protocol.queue_key import QueueKey
from troupe.protocol.run_record import RunRecord, SharedGraph
from troupe.protocol.settings import UPLOAD_LABEL, Settings
from troupe.subprocess_runner import pack_watch
from troupe.subprocess_runner.catalog import Catalog
from troupe.subprocess_runner.devices import parse_device, resolve_device
from troupe.subprocess_runner.engine import ExecutableGraph, prepare_executable_graph
from troupe.subprocess_runner.errors import PackChanged
from troupe.subprocess_runner.mounts import FILE_PARAMS, PathNotAllowed, confine, labels_of
from troupe.subprocess_runner.mounts import resolve as resolve_mounts
from troupe.subprocess_runner.transfer import upload_ids


@dataclass(frozen=True)
class Submission:
    """One run as a submitter asks for it; the placer answers it with a ``RunRecord``.
    ``flavors``: those the graph names, as stored now (a store read the submitter makes);
    ``shared``: a sweep's or a study's variant, stored as its params over the base."""

    graph: Graph
    name: str | None
    options: RunOptions
    flavors: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    prefix: str = "/graph"  # where the graph is in the request, for an error's pointer
    seed: int | None = None  # a variant's or an attempt's own seed, over options.seed
    sweep_id: str | None = None
    sweep_variant: int | None = None
    study_id: str | None = None
    rerun_of: str | None = None
    resumed_from: Mapping[str, Any] | None = None
    shared: tuple[tuple[str, str], dict[str, Any], dict[str, Any]] | None = None  # (base, document, params)
    submitted_by: str | None = None  # a session's id, or "server"; a sweep's or a study's runs are its submitter's

    @property
    def node_types(self) -> frozenset[str]:
        return frozenset(n.type for n in self.graph.nodes)


@dataclass(frozen=True)
class Admission:
    """What validating a submission needs of this server, read once at start."""

    settings: Settings
    catalog: Catalog
    accelerators: tuple[str, ...]

    def record(self, submission: Submission, worker: WorkerOffer | None) -> tuple[RunRecord, ExecutableGraph]:
        """Validates a submission completely (device, lane, graph, resources) before
        anything is queued. ``worker``: what the worker it targets offers (None: this
        server); an ask for devices it can never grant is refused here, with the numbers."""
        record, graph = _build(self.settings, self.catalog, self.accelerators, submission, worker)
        if submission.shared is not None:
            base, document, params = submission.shared
            # As submitted (a flavor or a mount could make them differ), the run keeps the
            # variant's graph, whose unchanged nodes are the base's own objects: a sweep of
            # a large graph holds it about once, not once a variant.
            if dict(record.graph) == document:
                record = record.with_changes(graph=document, shared_graph=SharedGraph(*base, params))
        return record, graph


def _build(settings: Settings, catalog: Catalog, accelerators: tuple[str, ...], submission: Submission,
           worker: WorkerOffer | None) -> tuple[RunRecord, ExecutableGraph]:
    graph_doc, options, prefix = submission.graph, submission.options, submission.prefix
    if options.lane == ev.LANE_INTERACTIVE and options.editor_session is None:
        raise InvalidRequest("lane 'interactive' needs options.editor_session", pointer="/options/editor_session")
    device, warning, anywhere = _device(options, graph_doc, prefix, accelerators, worker)
    machine = Machine(worker.cpus, worker.card_count,
                      f"worker {worker.name} has" if not anywhere else "the largest worker has") \
        if worker is not None else Machine(settings.cpus, sum(1 for d in accelerators if d.startswith("cuda")),
                                           "this server lends (TROUPE_CPUS)")
    return _after_device(settings, catalog, submission, worker, device, warning, machine, anywhere)


def _device(options: RunOptions, graph_doc: Graph, prefix: str, accelerators: tuple[str, ...],
            worker: WorkerOffer | None) -> tuple[str, str | None, bool]:
    """The device a run gets, the warning of a fallback, and whether a pool's placer
    picks its worker (then ``auto`` may stay ``auto``)."""
    requested, where = options.device, "/options/device"
    devices = options.target.devices if options.target is not None else None
    if devices and worker is None:
        raise InvalidRequest("options.target.devices places a run on a worker's devices; name the worker (or any) "
                             "in options.target.worker, or use options.device for this server",
                             pointer="/options/target/devices", code="target_needs_worker")
    if devices and worker is not None:
        if len(devices) > 1:
            _check_devices(worker, devices)
        requested, where = devices[0], "/options/target/devices/0"  # target.devices wins over device
    elif requested is None:
        requested, where = graph_doc.settings.device, f"{prefix}/settings/device"
    anywhere = worker is not None and worker.name in (ANY, ONE_SHOT)  # a pool: the placer picks the worker
    available = tuple(d for d in worker.devices if d != "cpu") if worker is not None else accelerators
    if anywhere and worker is not None and not worker.devices:
        # No worker seen yet: nothing to resolve against; the run keeps the device it asked
        # for and waits for a worker that has it.
        parsed = parse_device(requested or "")
        available = (str(requested),) if parsed is not None and parsed[1] is not None else ("cuda:0",)
    try:
        device, warning = resolve_device(requested, available)
    except ValueError as exc:
        raise InvalidRequest(str(exc), pointer=where, code="invalid_device") from None
    if warning and options.require_device:
        raise DeviceUnavailable(f"{warning.split(';')[0]}, and options.require_device refuses the fallback to cpu",
                                pointer=where)
    if anywhere and device != "cpu" and parse_device(requested or "") in (("auto", None), ("cuda", None)):
        device = "auto"  # the first free card of whichever worker takes it
    if warning and worker is not None:
        warning = warning.replace("this server", f"any worker of pool {worker.name}" if anywhere
                                  else f"worker {worker.name}")
    return device, warning, anywhere


def _after_device(settings: Settings, catalog: Catalog, submission: Submission, worker: WorkerOffer | None,
                  device: str, warning: str | None, machine: Machine,
                  anywhere: bool) -> tuple[RunRecord, ExecutableGraph]:
    """The rest of a run's record once its device is known: resources, mounts, the
    graph checked against the catalog, the budget."""
    graph_doc, options, prefix = submission.graph, submission.options, submission.prefix
    resolved = resolve(graph_doc, options, submission.flavors, prefix, machine, worker is not None)
    engine_doc = _with_own_mounts(resolved.graph, settings, prefix) if worker is None else resolved.graph
    if worker is not None:
        _check_mounts(worker, graph_doc, prefix, settings)
    graph, graph_json, digest = _prepared(engine_doc, catalog, prefix)
    changed = pack_watch.changed(graph.folder_packs())
    if changed is not None:  # refused wherever it would run, until a restart loads the edit (pack_watch)
        raise PackChanged(changed)
    if engine_doc is not graph_doc:  # stored as submitted: the next run reads its flavors and mounts again
        graph_json = graph_doc.model_dump(mode="json", exclude_none=True)
        digest = graph_digest(graph_json)
    memory_gib = resolved.memory_gib
    if memory_gib is not None and worker is None:
        raise InvalidRequest("options.target.memory_gib budgets a run on a worker's shared card; runs in this "
                             "server share one process and cannot be capped, so name a worker (or any)",
                             pointer="/options/target/memory_gib", code="memory_budget_needs_worker")
    dumped = options.model_dump(mode="json", exclude_none=True)
    record = RunRecord(
        id=uuid.uuid4().hex,
        name=submission.name or graph_doc.name,
        queue_key=QueueKey(worker.name if worker is not None else None, device),
        device=device,
        devices=tuple(held_devices(dumped, device)),
        worker=worker.name if worker is not None and not anywhere else None,  # a pool's: set when placed
        one_shot=worker is not None and worker.one_shot,
        lane=options.lane,
        graph=graph_json,
        options=dumped,
        created_at=ev.utc_now(),
        editor_session=editor_key(submission.submitted_by, options.editor_session),
        seed=submission.seed if submission.seed is not None else options.seed,
        deterministic=options.deterministic,
        record_outputs=options.record_outputs,
        warnings=tuple(([warning] if warning else []) + resolved.warnings),
        graph_digest=digest,
        duration_s=resolved.duration_s,
        # A declared budget; the placer derives one from a measured peak for a worker run.
        memory_budget_mib=math.ceil(memory_gib * 1024) if memory_gib is not None else None,
        memory_budget_source="declared" if memory_gib is not None else None,
        sweep_id=submission.sweep_id,
        sweep_variant=submission.sweep_variant,
        study_id=submission.study_id,
        rerun_of=submission.rerun_of,
        resumed_from=submission.resumed_from,
        submitted_by=submission.submitted_by,
        secret_params=_secret_params(graph_json, catalog),
    )
    return record, graph


def _secret_params(graph: Mapping[str, Any], catalog: Catalog) -> tuple[str, ...]:
    """The graph's params of type secret ("node.param"), which the store leaves out of
    its index (``where`` and the list's search never read an API key)."""
    found = []
    for node in graph.get("nodes") or ():
        spec = catalog.get(node.get("type"))
        if spec is not None:
            found += [f"{node['id']}.{p.name}" for p in spec.params if p.type == "secret"]
    return tuple(found)


def shared_base(base: dict[str, Any]) -> tuple[str, str]:
    """The digest and text a sweep's or a study's runs store their base graph under."""
    text = json.dumps(base, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest(), text


def _with_own_mounts(graph_doc: Graph, settings: Settings, prefix: str) -> Graph:
    """A run in this server: its label references become this server's paths, and each
    file it names must lie where runs may read (``mounts.confine``)."""
    if not any(isinstance(n.params.get(p), str) for n in graph_doc.nodes for p in FILE_PARAMS):
        return graph_doc
    document = graph_doc.model_dump(mode="json", exclude_none=True)
    if not labels_of(document):
        _confined(document, settings, prefix)
        return graph_doc
    _uploads_named(document, prefix)
    try:
        resolved = resolve_mounts(document, settings.mounts)
        for before, after in zip(document["nodes"], resolved["nodes"], strict=True):
            ref = str((before.get("params") or {}).get("path"))
            if ref.startswith(f"{UPLOAD_LABEL}:") and not Path(after["params"]["path"]).is_file():
                raise InvalidRequest(f"node {before['id']}: no uploaded file {ref.split(':', 1)[1]!r} (GET /api/files "
                                     "lists them)", pointer=f"{prefix}/nodes", node_id=before["id"],
                                     code="file_not_found")
        _confined(resolved, settings, prefix)
        return Graph.model_validate(resolved)
    except ValueError as exc:
        raise InvalidRequest(f"{exc}; this server mounts "
                             + (f"{settings.mount_label} (TROUPE_MOUNT_LABEL) at {settings.mount_path}"
                                if settings.mount_path else "nothing (set TROUPE_MOUNT_PATH)"),
                             pointer=f"{prefix}/nodes", code="mount_unavailable") from None


def _uploads_named(document: dict[str, Any], prefix: str) -> set[str]:
    """The uploads the graph reads, each an upload's id, or a 400 in the words a missing
    one gets (``upload:../../etc/passwd`` asks nothing of this machine's files)."""
    try:
        return upload_ids(document)
    except ValueError as exc:
        raise InvalidRequest(str(exc), pointer=f"{prefix}/nodes", code="file_not_found") from None


def _confined(document: dict[str, Any], settings: Settings, prefix: str) -> None:
    try:
        confine(document, settings.readable_roots)
    except PathNotAllowed as exc:
        raise InvalidRequest(str(exc), pointer=f"{prefix}/nodes/{exc.index}/params/{exc.param}",
                             node_id=document["nodes"][exc.index].get("id"), code="path_not_allowed") from None


def _check_mounts(worker: WorkerOffer, graph_doc: Graph, prefix: str, settings: Settings) -> None:
    """A named worker must hold every label the graph reads from; ``any`` skips those that
    do not. Uploads reach any worker by transfer, within TROUPE_TRANSFER_MAX_MB, or from
    the S3 bucket when one is configured."""
    document = graph_doc.model_dump(mode="json", exclude_none=True)
    uploads = [settings.home / "files" / file_id for file_id in _uploads_named(document, prefix)]
    missing = [path.name for path in uploads if not path.is_file()]
    if missing:
        raise InvalidRequest(f"no uploaded file {missing[0]!r} (GET /api/files lists them)", pointer=f"{prefix}/nodes",
                             code="file_not_found")
    total = sum(path.stat().st_size for path in uploads)
    if total > settings.transfer_max_mb * 1024 * 1024 and settings.s3 is None:  # with S3, from the bucket
        raise InvalidRequest(f"the uploads this graph reads are {total / 2**20:.1f} MB, over the "
                             f"{settings.transfer_max_mb} MB a worker run fetches (TROUPE_TRANSFER_MAX_MB); put the "
                             "files on a label the worker mounts", pointer=f"{prefix}/nodes", code="upload_too_large")
    lacking = labels_of(document) - worker.mounts - {UPLOAD_LABEL}
    if lacking and worker.name not in (ANY, ONE_SHOT):
        raise InvalidRequest(f"worker {worker.name} lacks the storage label(s) {', '.join(sorted(lacking))} this "
                             f"graph reads from (it has {', '.join(sorted(worker.mounts)) or 'none'}; agents declare "
                             "them with --mount LABEL=PATH)", pointer=f"{prefix}/nodes", code="worker_lacks_mount")


def graph_digest(graph_json: dict[str, Any]) -> str:
    """What a graph computes, named: its nodes, edges and settings, not its name. Runs of
    one digest are budgeted by each other's measured peaks."""
    body = {k: v for k, v in graph_json.items() if k != "name"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# Graphs prepared lately, by their document's digest: a queue of the same job (a CLI
# loop, a script, a retried study attempt) validates and binds its graph once. A prepared
# graph is never changed by a run (the engine hands each node a copy of its params). Only
# small documents are kept: the cache is for the hot path, and must not hold large ones.
_PREPARED: OrderedDict[tuple[str, str, int], tuple[ExecutableGraph, str, str]] = OrderedDict()
_PREPARED_MAX = 64
_PREPARED_DOC_BYTES = 64 * 1024


def _prepared(graph_doc: Graph, catalog: Catalog, prefix: str) -> tuple[ExecutableGraph, dict[str, Any], str]:
    """The executable graph, the document as stored and its ``graph_digest``, from the
    cache when the same document was prepared against the same catalog before."""
    text = graph_doc.model_dump_json(exclude_none=True)
    if len(text) > _PREPARED_DOC_BYTES:
        document = json.loads(text)
        return prepare_executable_graph(graph_doc, catalog, prefix), document, graph_digest(document)
    graph, _, digest = _cached(graph_doc, text, catalog, prefix)
    return graph, jsonsafe.loads(text), digest  # a document of its own for each record


def prepared_graph(graph_doc: Graph, catalog: Catalog) -> ExecutableGraph:
    """A kept run's executable graph at a restart, through the submissions' cache: the
    runs a restarted server adopts are often many of one graph (a class's exercise, a
    queue of one job), each validated and bound again before the server serves."""
    text = graph_doc.model_dump_json(exclude_none=True)
    if len(text) > _PREPARED_DOC_BYTES:
        return prepare_executable_graph(graph_doc, catalog)
    return _cached(graph_doc, text, catalog, "/graph")[0]


def _cached(graph_doc: Graph, text: str, catalog: Catalog, prefix: str) -> tuple[ExecutableGraph, str, str]:
    key = (hashlib.sha256(text.encode()).hexdigest(), prefix, id(catalog))
    found = _PREPARED.get(key)
    if found is None:
        found = (prepare_executable_graph(graph_doc, catalog, prefix), text, graph_digest(json.loads(text)))
        _PREPARED[key] = found
        if len(_PREPARED) > _PREPARED_MAX:
            _PREPARED.popitem(last=False)
    else:
        _PREPARED.move_to_end(key)
    return found


def _check_devices(worker: WorkerOffer, devices: list[str]) -> None:
    """A run on several devices needs every one of them on one worker: a worker that
    can never grant the ask is told so now, with what it has."""
    if worker.name in (ANY, ONE_SHOT):
        raise InvalidRequest("target any places a run on one device; name a worker for several",
                             pointer="/options/target/devices", code="worker_cannot_grant")
    if len(set(devices)) != len(devices):
        raise InvalidRequest(f"options.target.devices names a device twice: {devices}",
                             pointer="/options/target/devices")
    lacking = [d for d in devices if d not in worker.devices]
    if lacking:
        cards = [d for d in worker.devices if d != "cpu"]
        raise InvalidRequest(
            f"the run asks for {len(devices)} devices ({', '.join(devices)}); worker {worker.name} offers "
            f"{len(cards)} card{'s' if len(cards) != 1 else ''} ({', '.join(cards) or 'none'}) and lacks "
            f"{', '.join(lacking)}", pointer="/options/target/devices", code="worker_cannot_grant")


def editor_key(submitted_by: str | None, editor_session: str | None) -> str | None:
    """The editor session as the interactive lane and the node cache know it: the one a
    page names, within its submitter's. An editor's session name is public (every run
    lists its options), and another session using it would hold that editor's lane
    (``editor_session_busy``), read its cached outputs or drop them."""
    if editor_session is None or submitted_by is None:
        return editor_session
    return f"{submitted_by}/{editor_session}"
