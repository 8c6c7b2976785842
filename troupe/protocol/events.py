"""The one event vocabulary of a run, in-process or (later) on a worker.

An event is ``{"seq", "type", "ts", "node_id", "payload"}``. ``seq`` is run-scoped and
gap-free; only the run's RunActor assigns it. Producers (the engine, the control plane)
emit ``(type, node_id, payload)`` and never a seq.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from json.encoder import encode_basestring_ascii as _quoted
from typing import Any

from troupe.protocol import jsonsafe

RUN_QUEUED = "run_queued"
RUN_STARTED = "run_started"
NODE_QUEUED = "node_queued"  # a node waits for the cpus it declared: {"cpus", "reason"}
NODE_STARTED = "node_started"
NODE_FINISHED = "node_finished"
NODE_FAILED = "node_failed"
METRIC = "metric"
LOG = "log"
WARNING = "warning"
RUN_FINISHED = "run_finished"
ARTIFACT = "artifact"  # a file the run wrote, once stored: {"kind", "path", "backend", "label", "size", "sha256"}
# A worker run's file kept in its agent's artifact outbox, not stored yet: the same fields.
ARTIFACT_PENDING = "artifact_pending"
# Where an artifact's bytes live: the run's folder here (written here, or sent here by a
# worker), a storage label's folder, or the S3 bucket.
ARTIFACT_BACKENDS = ("local", "transfer", "mount", "s3")
# What executed a worker's run, from its child: {fingerprint, fingerprint_digest,
# fingerprint_source}. A fact stored on the run, not an event of its log, so the event
# sequence of a default submission stays as it was (DESIGN invariant 1).
ENVIRONMENT = "environment"
# A file the run kept earlier and removed since (a checkpoint past the node's
# ``keep_checkpoints``/``keep_best``): {"kind", "path", "backend"}. Its row says ``removed``.
ARTIFACT_REMOVED = "artifact_removed"
# The files a command ran (each argv item that names one, its sha256, its git commit,
# branch and uncommitted diff), from the process that runs it, before it starts:
# {"node_id" is the command's, "files": [...], "repos": [...]}. Like ENVIRONMENT, a fact
# stored on the run (in its fingerprint), not an event of its log.
CODE = "code"
# A file a node read, with provenance on: {kind, ref, size, mode, mtime | sha256}.
PROVENANCE = "provenance"
# What the run's nodes wrote to stdout or stderr: {"stream", "text"}, or {"skipped", "text"}
# where the run's console cap cut the middle out.
CONSOLE = "console"
# Params and tags a script logged (MLflow's ``log_param``, ``set_tag``), name -> text:
# {"params": {...}, "tags": {...}}, a tag of null removed. The run keeps the newest
# value of each (the store's ``logged_params``), shown beside the graph's own params.
PARAMS = "params"
PARAM_KEY_MAX = 250  # MLflow's limits: a key, and the longest value it stores (a tag's)
PARAM_VALUE_MAX = 8000
PARAMS_PER_EVENT_MAX = 1000

RUN_LEVEL = frozenset({RUN_QUEUED, RUN_STARTED, RUN_FINISHED})  # written by the control plane only
VOCABULARY = frozenset(
    {RUN_QUEUED, RUN_STARTED, NODE_STARTED, NODE_FINISHED, NODE_FAILED, METRIC, LOG, WARNING, RUN_FINISHED,
     ARTIFACT, ARTIFACT_PENDING, ARTIFACT_REMOVED, NODE_QUEUED, PROVENANCE, CONSOLE, PARAMS}
)
# What node code (in-process or in a worker's run child) may emit.
NODE_LEVEL = VOCABULARY - RUN_LEVEL
# What a worker's run child may send: its nodes' events, and the fact of its environment.
WORKER_KINDS = NODE_LEVEL | {ENVIRONMENT, CODE}

# Run states.
QUEUED = "queued"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELLED = "cancelled"
INTERRUPTED = "interrupted"
DISCONNECTED = "disconnected"

ACTIVE_STATES = frozenset({QUEUED, RUNNING, DISCONNECTED})
TERMINAL_STATES = frozenset({SUCCEEDED, FAILED, CANCELLED, INTERRUPTED})
ALL_STATES = ACTIVE_STATES | TERMINAL_STATES

# Lanes.
LANE_QUEUED = "queued"
LANE_INTERACTIVE = "interactive"


# The formatted whole second of the last timestamp: most events of a second share it.
_last_second: tuple[int, str] = (-1, "")


def utc_now() -> str:
    """An ISO 8601 UTC timestamp with microseconds (``2026-12-03T10:39:32.123456Z``), the
    one format troupe writes. Every event has one, so the date is formatted once a second."""
    global _last_second
    now = time.time()
    whole = int(now)
    second, prefix = _last_second
    if second != whole:
        prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
        _last_second = (whole, prefix)
    return f"{prefix}.{min(int((now - whole) * 1_000_000), 999_999):06d}Z"


# Metric steps stay exact in a float and in any JSON reader (and in SQLite's INTEGER).
STEP_MAX = 2**53
NAME_MAX = 200


def admit_event(kind: str, payload: dict[str, Any],
                text: str | None = None) -> tuple[dict[str, Any], str | None, str | None]:
    """Where an event enters (node code in-process, a worker's frame): the payload to
    record, with non-finite numbers made JSON (``null`` and a ``non_finite`` marker), its
    JSON when it did not change after (``make_event`` reuses it), and why the event is
    refused, if it is; a refused event never reaches the store. ``text``: the JSON the
    payload was parsed from (a worker's event), reused when it needs no change."""
    checked, encoded = jsonsafe.finite_json(payload, text)
    admitted, refused = _admit(kind, checked)
    # _admit makes a new payload when it changes one (a huge int value becomes a float).
    return admitted, encoded if admitted is checked else None, refused


def _admit(kind: str, payload: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    if kind == METRIC:
        name, step, value = payload.get("name"), payload.get("step"), payload.get("value")
        if not isinstance(name, str) or not 0 < len(name) <= NAME_MAX:
            return payload, f"a metric needs a name of 1 to {NAME_MAX} characters"
        if not jsonsafe.encodable(name):  # the series' name is a column of its own, stored as UTF-8
            return payload, f"metric {ascii(name)[:60]}: its name holds a lone surrogate, which is not text"
        if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= STEP_MAX:
            return payload, f"metric {name}: step must be an integer from 0 to 2**53, got {str(step)[:40]}"
        if (value is None and "non_finite" not in payload) or (value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float))):
            return payload, f"metric {name}: value must be a number, got {str(value)[:40]!r}"
        if isinstance(value, int) and not -STEP_MAX <= value <= STEP_MAX:
            try:
                payload = {**payload, "value": float(value)}
            except OverflowError:
                return payload, f"metric {name}: value is too large for a float"
    elif kind in (ARTIFACT, ARTIFACT_PENDING):
        return payload, _artifact_problem(payload)
    elif kind == ARTIFACT_REMOVED:  # a file of the run's own folder, never another path of the server's
        path = payload.get("path")
        return payload, outside_run_dir(path) if isinstance(path, str) else "a removed artifact needs its path"
    elif kind == PARAMS:
        return payload, _params_problem(payload)
    elif kind == CONSOLE:
        text, stream = payload.get("text", ""), payload.get("stream", "stdout")
        if not isinstance(text, str) or not jsonsafe.encodable(text):  # the console is read back as UTF-8 text
            return payload, "a console event's text must be text (a string without lone surrogates)"
        if stream not in ("stdout", "stderr"):
            return payload, f"a console event's stream is stdout or stderr, got {str(stream)[:40]!r}"
    return payload, None


def _params_problem(payload: dict[str, Any]) -> str | None:
    """Text names and text values within MLflow's limits (a tag's value may be null:
    removed), at least one and at most ``PARAMS_PER_EVENT_MAX`` in all."""
    count = 0
    for part in ("params", "tags"):
        found = payload.get(part, {})
        if not isinstance(found, dict):
            return f"a params event's {part} must be an object of names to text"
        for key, value in found.items():
            if not isinstance(key, str) or not 0 < len(key) <= PARAM_KEY_MAX or not jsonsafe.encodable(key):
                return f"a logged {part[:-1]}'s name must be text of 1 to {PARAM_KEY_MAX} characters, got {key!a:.60}"
            if (value is None and part == "params") or (value is not None and (
                    not isinstance(value, str) or len(value) > PARAM_VALUE_MAX or not jsonsafe.encodable(value))):
                return (f"logged {part[:-1]} {key[:60]!a}: its value must be text of at most {PARAM_VALUE_MAX} "
                        "characters")
        count += len(found)
    if not 0 < count <= PARAMS_PER_EVENT_MAX:
        return f"a params event holds 1 to {PARAMS_PER_EVENT_MAX} params and tags, got {count}"
    return None


def _artifact_problem(payload: dict[str, Any]) -> str | None:
    if not isinstance(payload.get("path"), str) or not payload["path"]:
        return "an artifact needs a path"
    backend, size, sha256 = payload.get("backend"), payload.get("size"), payload.get("sha256")
    if backend is None and size is None and sha256 is None:
        return None  # announced, not stored (an exported script's own log)
    if backend not in ARTIFACT_BACKENDS:
        return f"an artifact's backend must be one of {', '.join(ARTIFACT_BACKENDS)}, got {str(backend)[:40]!r}"
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return "an artifact's size must be a non-negative integer"
    if not isinstance(sha256, str) or not re.fullmatch(r"[0-9a-f]{64}", sha256):
        return "an artifact's sha256 must be 64 lowercase hex digits"
    return None


_MAX_NAME_BYTES = 255  # a file name's limit on Linux and macOS file systems


def outside_run_dir(path: str) -> str | None:
    """Why a worker's artifact path is refused: it must name a file inside the run's own
    directory, relative to it (a worker never points the control plane elsewhere). Each
    segment is a plain name: no empty one, no ``.`` or ``..`` (``.`` alone would name the
    run's folder itself), no control character, none longer than a file system allows."""
    shown = repr(path[:200])
    if not path or len(path) > 1024:
        return f"an artifact path must name a file in the run's folder in 1 to 1024 characters, got {shown}"
    if not jsonsafe.encodable(path):
        return f"an artifact path must be text (it holds a lone surrogate), got {path[:200]!a}"
    if path.startswith("/") or "\\" in path:
        return f"an artifact path is relative to the run's folder, with / between folders, got {shown}"
    for segment in path.split("/"):
        if segment in ("", ".", ".."):
            return f"an artifact path must stay in the run's folder and name a file, got {shown}"
        if any(ord(c) < 32 or ord(c) == 127 for c in segment):
            return f"an artifact path may not hold control characters, got {shown}"
        if len(segment.encode("utf-8", "surrogateescape")) > _MAX_NAME_BYTES:
            return f"each name in an artifact path is at most {_MAX_NAME_BYTES} bytes, got {shown}"
    return None


def worker_artifact_problem(payload: dict[str, Any], pending: bool = False) -> str | None:
    """A worker announces only what it stored itself (a storage label, the bucket); what
    it transfers is recorded by the control plane when the file arrives whole, and is
    announced pending (in its outbox) before."""
    if pending:
        if payload.get("backend") != "transfer":
            return f"a pending artifact is one the worker transfers, not {payload.get('backend')!r}"
    elif payload.get("backend") not in ("mount", "s3"):
        return f"a worker announces an artifact stored on a mount or in S3, not {payload.get('backend')!r}"
    return outside_run_dir(payload["path"])


class Event(dict[str, Any]):
    """An event (a plain dict to every reader) that also carries its payload as JSON,
    encoded once where the event is made (its size is what the cap measures) and reused
    by the store and the streams instead of being encoded again by each."""

    __slots__ = ("payload_json",)

    payload_json: str


def make_event(seq: int, kind: str, node_id: str | None, payload: dict[str, Any], cap_bytes: int = 0,
               payload_json: str | None = None, ts: str | None = None) -> Event:
    """A numbered event; a payload over ``cap_bytes`` is capped (``cap_payload``).
    ``payload_json``: the payload's JSON, when the caller has it already; ``ts``: its
    timestamp, when the caller took one for several events (else now)."""
    if payload_json is None:
        payload_json = jsonsafe.dumps(payload, default=str)
    if 0 < cap_bytes < len(payload_json):
        payload = cap_payload(payload, cap_bytes)
        payload_json = jsonsafe.dumps(payload, default=str)
    event = Event(seq=seq, type=kind, ts=ts or utc_now(), node_id=node_id, payload=payload)
    event.payload_json = payload_json
    return event


def stored_event(seq: int, kind: str, ts: str, node_id: str | None, payload_json: str) -> Event:
    """An event read back from the store, which keeps its payload as JSON text."""
    event = Event(seq=seq, type=kind, ts=ts, node_id=node_id, payload=jsonsafe.loads(payload_json))
    event.payload_json = payload_json
    return event


def payload_json(event: Mapping[str, Any]) -> str:
    """The event's payload as JSON: the encoding it carries, else a fresh one."""
    encoded: str | None = getattr(event, "payload_json", None)
    return encoded if encoded is not None else jsonsafe.dumps(event["payload"], default=str)


def event_json(seq: int, kind: str, ts: str, node_id: str | None, payload: str) -> str:
    """The whole event as JSON, around the payload's encoding (the texts quoted as
    ``json.dumps`` quotes them, without its way through an encoder for each)."""
    return (f'{{"seq": {int(seq)}, "type": {_text(kind)}, "ts": {_text(ts)}, "node_id": {_text(node_id)}, '
            f'"payload": {payload}}}')


def _text(value: Any) -> str:
    return _quoted(value) if type(value) is str else json.dumps(value)


def cap_payload(payload: dict[str, Any], cap_bytes: int) -> dict[str, Any]:
    """Keeps a stored and streamed payload under ``cap_bytes`` (<= 0: no cap).

    The largest output items go first, each replaced by a marker that names its port,
    so a watcher still learns which output was too big; a payload still over the cap
    keeps only its small scalar fields and says so."""
    if cap_bytes <= 0:
        return payload
    size = len(json.dumps(payload, default=str))
    if size <= cap_bytes:
        return payload
    capped = dict(payload)
    outputs = capped.get("outputs")
    if isinstance(outputs, dict):
        outputs = dict(outputs)
        capped["outputs"] = outputs
        by_size = sorted(outputs, key=lambda port: len(json.dumps(outputs[port], default=str)), reverse=True)
        for port in by_size:
            item_bytes = len(json.dumps(outputs[port], default=str))
            outputs[port] = {"omitted": True, "port": port, "bytes": item_bytes, "reason": "payload_cap"}
            size = len(json.dumps(capped, default=str))
            if size <= cap_bytes:
                return capped
    kept = {
        k: v for k, v in capped.items() if isinstance(v, bool | int | float) or (isinstance(v, str) and len(v) < 256)
    }
    kept["truncated"] = True
    kept["original_bytes"] = size
    return kept
