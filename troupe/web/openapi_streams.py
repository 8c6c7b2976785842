"""The server-sent event streams as the OpenAPI document states them: under the
document's ``x-streams``, not among its ``paths``.

Why apart: a 3.1 operation is a request whose answer a generated client reads to its end
(openapi-python-client 0.29.1 makes ``get_stream()`` do exactly that), and a stream has
no end while its run lives (``/api/stream`` none at all): the call would never return.
OpenAPI 3.2 says what a stream is (a sequential media type whose ``itemSchema`` is one
event), but the generators in use take 3.1 documents only. So the streams are written
here in 3.2's form, each a path item as it would stand under ``paths``, where a 3.2
document will put them back; a generator of today leaves them out, and a client follows
them with an SSE reader (docs/api.md, "Streams")."""

from __future__ import annotations

from typing import Any

_EVENT = "#/components/schemas/Event"
_ERROR = {"description": "client error", "content": {"application/json": {"schema": {
    "$ref": "#/components/schemas/ErrorReply"}}}}
_SEQ = {"type": "integer", "minimum": 0, "maximum": 2**62}


def _sse(event: str, data: dict[str, Any], description: str, with_id: str | None = None) -> dict[str, Any]:
    """One kind of event of a stream, as 3.2 writes an SSE item: its ``event`` name, its
    ``data`` (JSON text) and, where it has one, the ``id`` a reconnecting reader sends
    back as ``Last-Event-ID``."""
    properties: dict[str, Any] = {
        "event": {"const": event},
        "data": {"type": "string", "contentMediaType": "application/json", "contentSchema": data},
    }
    if with_id:
        properties["id"] = {"type": "string", "pattern": "^[0-9]+$", "description": with_id}
    return {"type": "object", "description": description, "required": ["event", "data"], "properties": properties}


def _object(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "required": list(properties), "properties": properties}


_LAGGED = _sse("stream_lagged", _object(resume_after={"type": ["integer", "null"]}, message={"type": "string"}),
               "this reader fell too far behind: the stream ends; open it again (with ?after=resume_after)")


def stream_operations() -> dict[str, Any]:
    """``x-streams``: path -> a path item with its one GET, as ``paths`` would hold it."""
    run_items = {"oneOf": [
        _sse("run_event", {"$ref": _EVENT}, "one event of the run, in seq order; the last is run_finished",
             with_id="the event's seq"),
        _sse("queue_position", _object(run_id={"type": "string"}, queue_position={"type": ["integer", "null"]}),
             "a queued run's place in its queue changed"),
        _LAGGED,
    ]}
    change = {"type": "object", "required": ["kind", "run_id"], "properties": {
        "kind": {"type": "string", "description": "created, status, position, deleted..."},
        "run_id": {"type": "string"}, "change_id": {"type": "integer"}}}
    all_items = {"oneOf": [
        _sse("hello", _object(server_started_at={"type": "string"}), "first, on every connection"),
        _sse("run", change, "a run was created, changed status or place, or was deleted",
             with_id="the change's number"),
        _sse("reset", {"type": "object", "properties": {"reason": {"type": "string"},
                                                         "message": {"type": "string"}}},
             "the changes since the reader's Last-Event-ID are not held: read the list again"),
        _LAGGED,
    ]}
    return {
        "/api/runs/{run_id}/stream": {"get": {
            "operationId": "get_runs_run_id_stream", "tags": ["runs"],
            "summary": "A run's events as server-sent events, from ?after= (or Last-Event-ID) to the run's end",
            "parameters": [{"name": "run_id", "in": "path", "required": True, "schema": {"type": "string"}},
                           {"name": "after", "in": "query", "required": False, "schema": _SEQ}],
            "responses": {"200": {"description": "the stream; it ends once run_finished is sent",
                                  "content": {"text/event-stream": {"itemSchema": run_items}}},
                          "4XX": _ERROR}}},
        "/api/stream": {"get": {
            "operationId": "get_stream", "tags": ["runs"],
            "summary": "Every run's changes as server-sent events (it never ends while the server runs)",
            "responses": {"200": {"description": "the stream",
                                  "content": {"text/event-stream": {"itemSchema": all_items}}},
                          "4XX": _ERROR}}},
    }
