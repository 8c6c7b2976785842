"""What a session may run: the one rule every route that makes runs asks.

A node type marked privileged (``script.Command``, a pack's node its author marked
``privileged=True``) runs code, or reads files its params name, on the machine that runs
it: the server's, or the worker's the run is placed on. Only a session trusted with
those machines may run it: the teacher's (and the server's own token); a class session
only when the teacher allowed it (``TROUPE_CLASS_PRIVILEGED_NODES``); a read session
never.

The rule is asked of the graph that will execute, not of what the body holds: a rerun
or a resume asks it of the stored run's graph, a study's resume of the stored study's
base graph, whoever made them. It is asked where a request becomes runs:

* ``queue_run`` (``routes_runs``): ``POST /api/runs`` in every lane (an editor's runs,
  the interactive lane), and ``POST /api/runs/{id}/rerun`` (with or without ``resume``);
* ``POST /api/sweeps``: the base graph of every variant;
* ``POST /api/studies`` and ``POST /api/plugins/{plugin}/jobs``: the study's base graph;
* ``POST /api/studies/{id}/resume``: the stored study's base graph.

``tests/integration/test_run_rights_functional.py`` walks every operation of the OpenAPI
document that makes runs as a class session with a privileged graph, and fails when a
``POST`` answering a run, sweep, study or job, or taking a graph, is on neither of its
lists; every route of the server is in that document (``test_openapi_client_functional``).
A route added later is walked, or the test says it was forgotten.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from troupe.protocol.errors import Forbidden
from troupe.web.login import CLASS, TEACHER, Who

PRIVILEGED_NODE = "privileged_node"


def refuse_privileged(svc: Any, who: Who | None, graph: Any, prefix: str | None) -> None:
    """403 ``privileged_node`` when ``who`` may not run a node type of ``graph`` (a
    ``Graph`` or a stored graph's document). ``prefix``: where the graph sits in the
    request body (``/graph``); None when it is not in the body (a stored run or study):
    the pointer is then the request itself, and ``node_id`` says which node."""
    if who is None or who.kind == TEACHER or (who.kind == CLASS and svc.settings.class_privileged_nodes):
        return
    for index, node_id, type_name in _nodes(graph):
        node_type = svc.catalog.get(type_name)
        if node_type is not None and node_type.privileged:
            allowed = " unless the teacher allows it (TROUPE_CLASS_PRIVILEGED_NODES=1)" if who.kind == CLASS else ""
            raise Forbidden(f"node {node_id} is a {type_name}, which runs code or reads files on the machine that "
                            f"runs it (the server, or the worker the run is placed on): a {who.kind} session may "
                            f"not run it{allowed}",
                            pointer="" if prefix is None else f"{prefix}/nodes/{index}/type", node_id=node_id,
                            code=PRIVILEGED_NODE)


def _nodes(graph: Any) -> Iterator[tuple[int, str, str]]:
    """Each node's index, id and type, of a validated graph or a stored document."""
    nodes = graph.get("nodes") or () if isinstance(graph, Mapping) else graph.nodes
    for index, node in enumerate(nodes):
        if isinstance(node, Mapping):
            yield index, str(node.get("id")), str(node.get("type"))
        else:
            yield index, node.id, node.type
