"""``troupe exec``: execute a graph in this process, with no server (the offline runner)."""

from __future__ import annotations

import json
import sys
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from troupe.cli.config import load_settings
from troupe.cli.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, CliError
from troupe.cli.files import read_json_object
from troupe.cli.render import Renderer
from troupe.cli.set_params import apply_sets, catalog_params
from troupe.protocol import events as ev
from troupe.protocol.graph import Graph
from troupe.subprocess_runner.catalog import load_catalog
from troupe.subprocess_runner.context import ExecutionContext, Sinks
from troupe.subprocess_runner.devices import probe_accelerators, resolve_device, torch_device
from troupe.subprocess_runner.engine import ExecutableGraph, execute_graph, prepare_executable_graph
from troupe.subprocess_runner.errors import GraphInvalid
from troupe.subprocess_runner.mounts import resolve as resolve_mounts
from troupe.subprocess_runner.pack_probe import ImportLimits
from troupe.subprocess_runner.seeding import cap_threads, number_cards_by_bus


def load_valid_graph(path: str, sets: Sequence[str] = (), packs: Sequence[Path] = (),
                     here: bool = False) -> tuple[dict[str, Any], Graph, ExecutableGraph]:
    """The file's document (with the params ``--set`` changed), its model and its
    executable form, its nodes from the installed packs and those of TROUPE_HOME/packs,
    TROUPE_PACKS and ``packs``; CliError when invalid. ``here``: the executable form has
    its storage labels turned into this machine's paths (the document keeps them)."""
    from pydantic import ValidationError

    raw = read_json_object(path, "a graph object")
    settings = load_settings(packs=list(packs))
    catalog = load_catalog(settings.pack_dirs, ImportLimits(settings.pack_import_timeout_s,
                                                            settings.pack_import_memory_mib))
    for name, error in catalog.broken_packs.items():
        print(f"  ⚠ pack {name} was not loaded: {error}", file=sys.stderr)
    apply_sets(raw, sets, catalog_params(catalog.to_json()["nodes"]))
    try:
        graph = Graph.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise CliError(f"{path}: {'/'.join(map(str, first['loc']))}: {first['msg']}") from None
    try:
        executable = prepare_executable_graph(resolve_mounts(raw, settings.mounts) if here else graph, catalog,
                                              prefix="")
    except GraphInvalid as exc:
        raise CliError(f"{path}: {exc.message} (at {exc.pointer})") from None
    except ValueError as exc:  # a storage label this machine lacks, a path that climbs out of its folder
        raise CliError(f"{path}: {exc}") from None
    return raw, graph, executable


def exec_graph(path: str, seed: int | None, device: str | None, max_parallel: int, events_json: bool = False,
               sets: Sequence[str] = (), packs: Sequence[Path] = ()) -> int:
    cap_threads()  # before the first node imports torch
    number_cards_by_bus()
    _, graph, executable = load_valid_graph(path, sets, packs, here=True)
    try:
        # This process runs the graph itself: cards by torch's names, the visible ones only.
        visible = load_settings().cuda_visible_devices
        available = tuple(torch_device(d, visible) for d in probe_accelerators(visible))
        resolved, warning = resolve_device(device or graph.settings.device, available)
    except ValueError as exc:
        raise CliError(f"{path}: {exc}") from None
    if warning:  # on stderr with --events-json: its stdout is JSON lines only
        print(f"  ⚠ {warning}", file=sys.stderr if events_json else sys.stdout)
    run_id = uuid.uuid4().hex
    lock = threading.Lock()

    renderer = Renderer()

    def emit(kind: str, node_id: str | None, payload: dict[str, Any]) -> None:
        event = {"type": kind, "node_id": node_id, "payload": payload}
        lines = [json.dumps(event, default=str)] if events_json else None
        with lock:
            for line in lines if lines is not None else renderer.feed(event):
                print(line, flush=True)

    cancel = threading.Event()
    ctx = ExecutionContext(run_id, None, resolved, seed, Sinks(emit), cancel)
    if not events_json:
        print(f"  ▸ executing {path} on {resolved}" + (f" with seed {seed}" if seed is not None else ""), flush=True)
    try:
        outcome = execute_graph(executable, ctx, max_parallel=max_parallel)
    except KeyboardInterrupt:
        cancel.set()
        print("  ✗ interrupted", flush=True)
        return EXIT_INTERRUPTED
    emit(ev.RUN_FINISHED, None, {"status": outcome.status, "error": outcome.error})
    if not events_json:
        print(f"\n  Result          {outcome.status}", flush=True)
    return EXIT_OK if outcome.status == ev.SUCCEEDED else EXIT_FAILED
