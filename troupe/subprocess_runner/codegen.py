"""Export: a graph as a standalone Python script that runs without a server.

The script imports only the frozen runtime surface (DESIGN invariant 2): it must keep
running unchanged as troupe grows, so this module and those symbols only ever grow.
It executes nodes one at a time in topological order, with the same per-node seeds
and thread caps as ``troupe exec``, and prints every event as a JSON line.
"""

from __future__ import annotations

import json
import pprint
import re
from typing import Any

from troupe.protocol.version import __version__

# (module, name): what an exported script may import. A test pins this list.
FROZEN_SURFACE: tuple[tuple[str, str], ...] = (
    ("troupe.subprocess_runner.engine", "invoke_node"),
    ("troupe.subprocess_runner.engine", "prepare_executable_graph"),
    ("troupe.subprocess_runner.engine", "topological_sort"),
    ("troupe.subprocess_runner.context", "ExecutionContext"),
    ("troupe.subprocess_runner.context", "derive_seed"),
    ("troupe.subprocess_runner.context", "current_node_id"),
    ("troupe.subprocess_runner.devices", "resolve_device"),
    ("troupe.subprocess_runner.seeding", "seed_everything"),  # invoke_node seeds each node with it
    ("troupe.subprocess_runner.seeding", "cap_threads"),
    # This machine's storage labels and pack folders, read as `troupe exec` reads them.
    ("troupe.cli.config", "load_settings"),
    ("troupe.subprocess_runner.mounts", "resolve"),
    ("troupe.subprocess_runner.catalog", "load_catalog"),
)

_TEMPLATE = '''#!/usr/bin/env python3
"""{title}, exported by troupe {version}.

Runs without a server: python {filename}
It needs troupe {version} installed (its runtime executes the nodes) and prints every
event as one JSON line.
"""

import json
import sys
import uuid

try:
    from troupe.subprocess_runner.seeding import cap_threads
except ModuleNotFoundError:  # run by a Python without troupe
    sys.exit("{needs}")

cap_threads()  # before torch or numpy are imported, as troupe exec does

from troupe.cli.config import load_settings  # noqa: E402
from troupe.subprocess_runner.catalog import load_catalog  # noqa: E402
from troupe.subprocess_runner.context import ExecutionContext  # noqa: E402
from troupe.subprocess_runner.devices import resolve_device  # noqa: E402
from troupe.subprocess_runner.engine import invoke_node, prepare_executable_graph, topological_sort  # noqa: E402
from troupe.subprocess_runner.mounts import resolve  # noqa: E402

GRAPH = {graph}
SEED = {seed!r}
DETERMINISTIC = {deterministic!r}


def main() -> int:
    # This machine's storage labels (data:..., upload:...) and its pack folders
    # (TROUPE_HOME/packs, TROUPE_PACKS), as troupe exec reads them.
    settings = load_settings()
    try:
        graph = prepare_executable_graph(resolve(GRAPH, settings.mounts), load_catalog(settings.pack_dirs))
    except Exception as exc:  # a label this machine lacks, a node type none of its packs has
        sys.exit(f"{{sys.argv[0]}}: the graph cannot run here: {{exc}}")
    device, warning = resolve_device(GRAPH.get("settings", {{}}).get("device"))
    if warning:
        print(json.dumps({{"type": "warning", "node_id": None, "payload": {{"message": warning}}}}), flush=True)
    ctx = ExecutionContext(uuid.uuid4().hex, None, device, SEED, deterministic=DETERMINISTIC)
    values = {{}}
    for node_id in topological_sort(GRAPH):
        node = graph.nodes[node_id]
        inputs = {{port: values[source][out] for port, (source, out) in node.sources.items()}}
        values[node_id] = invoke_node(node, ctx.for_node(node_id), inputs, DETERMINISTIC)
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


def script_name(graph: dict[str, Any]) -> str:
    stem = re.sub(r"[^A-Za-z0-9_]+", "_", str(graph.get("name") or "graph")).strip("_") or "graph"
    return f"{stem}.py"


def generate_script(graph: dict[str, Any], seed: int | None = None, deterministic: bool = False) -> str:
    """The script's text; ``graph`` should have been validated by the caller. Every user
    string lands in it as data: the name in the docstring JSON-quoted (each quote,
    backslash and control character escaped, so it can never close the docstring), the
    graph as a Python literal (``repr`` of each string)."""
    return _TEMPLATE.format(
        title=f"The troupe graph {json.dumps(str(graph.get('name') or 'graph'))}",
        needs=f"this script runs graph nodes with troupe {__version__}'s runtime: install troupe (pip install "
              "troupe) into the Python that runs it, or run it with the Python of troupe's own environment",
        version=__version__,
        filename=script_name(graph),
        # A Python literal, readable and editable; JSON's true/null become True/None.
        graph=pprint.pformat(json.loads(json.dumps(graph)), sort_dicts=False, width=100),
        seed=seed,
        deterministic=bool(deterministic),
    )
