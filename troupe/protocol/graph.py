"""The graph document: the JSON a user submits, as DESIGN section 4 draws it.

Only the *shape* lives here (ids, types, params, edges); whether the node types exist
and the ports fit is the catalog's business (``troupe.subprocess_runner.validation``).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from troupe.protocol.flavors import DURATION_MAX_S, FLAVOR_NAME, Ram
from troupe.protocol.numbers import INTEGRAL

GRAPH_VERSION: Literal[1] = 1
# What an editor keeps beside a node (its place on the canvas), and a graph's settings:
# small by nature, so their encoded size is capped.
LAYOUT_BYTES = 4096
SETTINGS_BYTES = 65_536


def _encoded_at_most(limit: int) -> AfterValidator:
    def check(value: Any) -> Any:
        plain = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
        if plain is not None and len(json.dumps(plain, default=str)) > limit:
            raise ValueError(f"is over {limit} bytes as JSON")
        return value

    return AfterValidator(check)


class NodeResources(BaseModel):
    """What a node holds while it executes. ``cpus`` come out of the server's
    ``TROUPE_CPUS``; a node that does not fit waits its turn. ``flavor`` names a stored
    size whose quantities apply where the node gives none; ``env`` is set in a worker's
    run process (never in the server's, which every run shares)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    cpus: Annotated[int, Field(ge=1, le=4096), INTEGRAL] | None = None
    gpus: Annotated[int, Field(ge=0, le=64), INTEGRAL] | None = None
    ram: Ram = None
    flavor: str | None = Field(default=None, pattern=FLAVOR_NAME)
    duration_s: float | None = Field(default=None, ge=0, le=DURATION_MAX_S, allow_inf_nan=False,
                                     description="how long the node is expected to take")
    env: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")],
              Annotated[str, Field(max_length=4096)]] | None = Field(default=None, max_length=64)


_NOT_IN_FILE_NAMES = re.compile(r"[^A-Za-z0-9_.-]")


def node_file_stem(node_id: str) -> str:
    """A node's id as the start of the name of a file it writes in its run's folder: the
    id itself when it is a plain name (``trainer``), else its plain characters and a
    digest of it, so that an id such as ``../../x`` never names a place outside the
    folder and two ids never share a name."""
    stem = _NOT_IN_FILE_NAMES.sub("_", node_id).lstrip(".")[:64]
    if stem == node_id:
        return stem
    digest = hashlib.sha256(node_id.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{stem or 'node'}-{digest}"


class Node(BaseModel):
    """One node: an id unique in its graph, a catalog type and its params."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    id: str = Field(min_length=1, max_length=200)
    type: str = Field(min_length=1, max_length=200)
    params: dict[str, Any] = Field(default_factory=dict)
    resources: NodeResources | None = None
    # Editors keep layout beside the node; the engine ignores it.
    position: Annotated[dict[str, Any] | None, _encoded_at_most(LAYOUT_BYTES)] = None


class Edge(BaseModel):
    """Carries one output port of ``source`` into one input port of ``target``."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    source: str
    source_port: str
    target: str
    target_port: str


class GraphSettings(BaseModel):
    """Graph-wide settings; ``device`` is the graph's preferred device."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True)

    device: str | None = None


class Graph(BaseModel):
    """A whole graph document."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    version: Literal[1] = GRAPH_VERSION
    name: str | None = None
    settings: Annotated[GraphSettings, _encoded_at_most(SETTINGS_BYTES)] = Field(default_factory=GraphSettings)
    nodes: list[Node] = Field(default_factory=list, max_length=5000)
    edges: list[Edge] = Field(default_factory=list, max_length=20000)
