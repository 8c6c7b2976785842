"""DESIGN invariant 2: the export surface only grows. A change here must be deliberate."""

from __future__ import annotations

import ast
import importlib
import inspect

from tests.helpers import hello
from troupe.subprocess_runner.codegen import FROZEN_SURFACE, generate_script

PINNED = {
    ("troupe.subprocess_runner.engine", "invoke_node"): ["node", "ctx", "inputs", "deterministic"],
    ("troupe.subprocess_runner.engine", "prepare_executable_graph"): ["graph", "catalog", "prefix"],
    ("troupe.subprocess_runner.engine", "topological_sort"): ["graph"],
    ("troupe.subprocess_runner.context", "ExecutionContext"): [
        "run_id", "node_id", "device", "seed", "sinks", "cancel", "deterministic", "run_dir"],
    ("troupe.subprocess_runner.context", "derive_seed"): ["seed", "node_id"],
    ("troupe.subprocess_runner.context", "current_node_id"): [],
    ("troupe.subprocess_runner.devices", "resolve_device"): ["requested", "available"],
    ("troupe.subprocess_runner.seeding", "seed_everything"): ["seed", "deterministic"],
    ("troupe.subprocess_runner.seeding", "cap_threads"): ["threads"],
    ("troupe.cli.config", "load_settings"): ["host", "port", "examples", "tls_cert", "tls_key", "packs"],
    ("troupe.subprocess_runner.mounts", "resolve"): ["graph", "mounts"],
    ("troupe.subprocess_runner.catalog", "load_catalog"): ["folders"],
}


def test_the_frozen_surface_is_exactly_the_pinned_list():
    assert set(FROZEN_SURFACE) == set(PINNED)


def test_each_frozen_symbol_keeps_its_parameters_in_order():
    for (module, name), params in PINNED.items():
        symbol = getattr(importlib.import_module(module), name)
        got = [p for p in inspect.signature(symbol).parameters if p != "self"]
        # Growing means new parameters after the old ones, with defaults.
        assert got[: len(params)] == params, (module, name, got)


def test_an_exported_script_imports_only_the_frozen_surface_and_the_standard_library():
    tree = ast.parse(generate_script(hello(), seed=1))
    imported = set()
    for statement in ast.walk(tree):
        if isinstance(statement, ast.ImportFrom):
            imported |= {(statement.module, alias.name) for alias in statement.names}
        elif isinstance(statement, ast.Import):
            imported |= {(alias.name, None) for alias in statement.names}
    ours = {item for item in imported if item[0].startswith(("troupe.subprocess_runner", "troupe.cli"))}
    assert ours <= set(FROZEN_SURFACE)
    assert {m for m, _ in imported - ours} <= {"json", "sys", "uuid"}
