"""The core pack: small arithmetic and control nodes that every install has and that
tests and examples are built on. Their names and ports are a contract (DESIGN section 4).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from troupe.subprocess_runner.node_types import NodeType, Pack, Param, Port


def _constant(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    return {"value": float(params["value"])}


def _add(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    return {"sum": inputs["a"] + inputs["b"]}


def _multiply(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    return {"product": inputs["a"] * inputs["b"]}


def _sleep(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    ctx.sleep(params["seconds"])
    return {"x": inputs.get("x")}


def _busy(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    # Pure-Python work that holds the GIL: the case thread caps cannot help with.
    deadline = time.monotonic() + params["seconds"]
    spins = 0
    while time.monotonic() < deadline:
        for i in range(2000):
            spins += i * i % 7
        ctx.check_cancelled()
    return {"x": inputs.get("x")}


def _fail(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    raise RuntimeError(params["message"])


def _log_metric(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    value = float(inputs["value"])
    ctx.metric(params["name"], value)
    return {"value": value}


def _ticker(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    # A steady stream of events (a training loop's shape without the training), for
    # link faults and relay throughput: point i of series `name` has the value i.
    for i in range(1, params["count"] + 1):
        ctx.metric(params["name"], float(i))
        if params["interval"]:
            ctx.sleep(params["interval"])
        else:
            ctx.check_cancelled()
    return {"value": float(params["count"])}


def _print(ctx: Any, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    line = f"{params['prefix']}{inputs.get('value')!r}"
    stream = params.get("stream", "log")
    if stream == "log":
        ctx.log(line)
    else:  # a real write: the run's console output (and a terminal's, in an exported script)
        print(line, file=sys.stdout if stream == "stdout" else sys.stderr, flush=True)
    return {}


PACK = Pack(
    name="core",
    node_types=(
        NodeType(
            "core.Constant",
            _constant,
            outputs=(Port("value", "float"),),
            params=(Param("value", "float"),),
            description="Emits a fixed number.",
            quick=True,
        ),
        NodeType(
            "core.Add",
            _add,
            inputs=(Port("a", "float"), Port("b", "float")),
            outputs=(Port("sum", "float"),),
            description="a + b",
            quick=True,
        ),
        NodeType(
            "core.Multiply",
            _multiply,
            inputs=(Port("a", "float"), Port("b", "float")),
            outputs=(Port("product", "float"),),
            description="a * b",
            quick=True,
        ),
        NodeType(
            "core.Sleep",
            _sleep,
            inputs=(Port("x", "any", required=False),),
            outputs=(Port("x", "any"),),
            params=(Param("seconds", "float", default=1.0, min=0, max=86400),),
            description="Waits, then passes x through; stops within 100 ms when the run is cancelled.",
        ),
        NodeType(
            "core.Busy",
            _busy,
            inputs=(Port("x", "any", required=False),),
            outputs=(Port("x", "any"),),
            params=(Param("seconds", "float", default=1.0, min=0, max=86400),),
            description="Keeps one CPU busy in pure Python for a while, then passes x through (a load for demos).",
        ),
        NodeType(
            "core.Fail",
            _fail,
            inputs=(Port("x", "any", required=False),),
            params=(Param("message", "string", default="core.Fail was asked to fail"),),
            description="Raises an error with the given message.",
            quick=True,
        ),
        NodeType(
            "core.LogMetric",
            _log_metric,
            inputs=(Port("value", "float"),),
            outputs=(Port("value", "float"),),
            params=(Param("name", "string", default="value"),),
            description="Records its input as the next point of series `name`.",
            quick=True,
        ),
        NodeType(
            "core.Ticker",
            _ticker,
            outputs=(Port("value", "float"),),
            params=(Param("count", "int", default=10, min=1, max=1_000_000),
                    Param("interval", "float", default=0.1, min=0, max=3600),
                    Param("name", "string", default="tick")),
            description="Records the points 1..count of series `name`, one every `interval` seconds.",
        ),
        NodeType(
            "core.Print",
            _print,
            inputs=(Port("value", "any", required=False),),
            params=(Param("prefix", "string", default=""),
                    Param("stream", "select", default="log", options=("log", "stdout", "stderr"),
                          description="log: a log event; stdout or stderr: printed, kept as console output")),
            description="Logs its input, or prints it.",
        ),
    ),
)
