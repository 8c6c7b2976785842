"""MLflow's tracking calls, answered for one command's run, so that a lab's script that
logs with ``mlflow.log_metric`` runs unchanged and its points land in the troupe run.

Every ``script.Command`` gets ``MLFLOW_TRACKING_URI`` (this endpoint, on loopback, on a
free port), ``MLFLOW_RUN_ID`` (the troupe run's id) and ``MLFLOW_TRACKING_TOKEN`` (a
secret of this run: a call without it is refused, so no other local process writes into
the run). The MLflow client then logs into that existing run: it reads it
(``runs/get``), marks it running (``runs/update``) and logs (``log-metric``,
``log-parameter``, ``set-tag``, ``log-batch``). Those are the calls answered here, as
MLflow's REST API defines them (``/api/2.0/mlflow/...``, errors as ``{"error_code",
"message"}``), with the run's one experiment (``"0"``, named as the script asks:
``set_experiment`` works). Anything else (a new run, a model registry) is refused with
``ENDPOINT_NOT_FOUND`` and said once on the run.

The endpoint runs in the process that runs the command (the control plane's executor
for an in-process run, the run's child on a worker) and turns each call into the run's
own events before it answers: a metric is a ``metric`` event with its step and its wall
time, params and tags a ``params`` event, and a file (``log_artifact``: the run's
``artifact_uri`` is ``mlflow-artifacts:``, so the client PUTs it here) is written under
the run's folder (``mlflow/``) and stored as a checkpoint is (``ctx.artifact``). So on
a worker it needs no route to the control plane, and a cut link loses nothing: the
events wait in the run's pipe and the agent's outbox like any other.

A point no series can hold (a step below 0, a name past 200 characters) is a warning,
not a failure of the script, as a metric line's is. This module never imports mlflow.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qs, unquote, urlsplit

from troupe.protocol.events import NAME_MAX, PARAM_KEY_MAX, PARAMS, STEP_MAX, outside_run_dir

URI_VAR, RUN_VAR, TOKEN_VAR = "MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_TRACKING_TOKEN"
# The client prints "View run ... at: URL" at a run's end: a URL of an endpoint gone then.
QUIET_VAR = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"
FOLDER = "mlflow"  # under the run's folder: the files the script logged
KIND = "mlflow"  # their artifacts' kind
EXPERIMENT = "0"  # the run's one experiment
PARAM_VALUE_MAX = 6000  # MLflow's limit on a param's value (a tag's is protocol.events.PARAM_VALUE_MAX)
TAG_VALUE_MAX = 8000
_API, _ARTIFACTS = "/api/2.0/mlflow/", "/api/2.0/mlflow-artifacts/artifacts/"
_BODY_MAX = 16 * 2**20  # a log-batch of 1,000 metrics, 100 params and 100 tags is well below
_CHUNK = 1 << 20


class MlflowError(Exception):
    """An answer of MLflow's kind: its HTTP status, its error code, its words."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


def _invalid(message: str) -> MlflowError:
    return MlflowError(400, "INVALID_PARAMETER_VALUE", message)


class MlflowEndpoint:
    """One command's endpoint: ``env`` (started) is what the command is given;
    ``close`` once the command has ended. What was logged so far is kept to answer
    ``runs/get`` and to refuse a param logged again with another value, as MLflow does."""

    def __init__(self, ctx: Any, run_dir: Path) -> None:
        self._ctx, self._folder = ctx, run_dir / FOLDER
        self._token = secrets.token_urlsafe(24)
        self._lock = threading.Lock()
        self._params: dict[str, str] = {}
        self._tags: dict[str, str] = {}
        self._metrics: dict[str, dict[str, Any]] = {}  # each series' newest point, as runs/get gives it
        self._said: set[str] = set()  # warnings given once
        self._experiment_name = "troupe"
        self._started_ms = int(time.time() * 1000)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler, bind_and_activate=True)
        self._port = int(self._server.server_address[1])
        self._server.daemon_threads = True
        cast(Any, self._server).endpoint = self
        self._closing = False
        self._thread = threading.Thread(target=self._serve, name=f"mlflow-{ctx.run_id[:8]}", daemon=True)
        self._thread.start()

    @property
    def env(self) -> dict[str, str]:
        return {URI_VAR: f"http://127.0.0.1:{self._port}", RUN_VAR: self._ctx.run_id, TOKEN_VAR: self._token,
                QUIET_VAR: "true"}

    def close(self) -> None:
        """No call is taken after this (a process the command left behind gets a refused
        connection). The accept is woken by a connection of its own, not a poll."""
        self._closing = True
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self._port), timeout=5):
            pass
        self._thread.join(5)
        self._server.server_close()

    def __enter__(self) -> MlflowEndpoint:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _serve(self) -> None:
        listener = self._server.socket
        while not self._closing:
            try:
                conn, address = listener.accept()
            except OSError:
                return
            if self._closing:
                conn.close()
                return
            # An answer is two writes (its head, its body): without this the body waits
            # for the client's delayed ACK of the head, 40 ms a call.
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._server.process_request(conn, address)  # a thread of its own (daemon)

    # What a call does -------------------------------------------------------------
    def authorized(self, header: str | None) -> bool:
        return secrets.compare_digest(header or "", f"Bearer {self._token}")

    def call(self, method: str, name: str, query: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        """One call of MLflow's tracking API (``name``: after ``/api/2.0/mlflow/``)."""
        handler = _CALLS.get((method, name))
        if handler is None:
            self.say_once(f"call:{name}", f"the script's MLflow client called {method} {name[:80]}, which troupe does "
                                          "not serve (it records the run's metrics, params, tags and files)")
            raise MlflowError(404, "ENDPOINT_NOT_FOUND", f"troupe's MLflow endpoint does not serve {method} {name}: "
                                                         "it logs into the run it was started for (MLFLOW_RUN_ID), "
                                                         "its metrics, params, tags and artifacts")
        args = {**query, **body}
        if name.startswith("runs/"):
            self._check_run(args)
        return handler(self, args)

    def _check_run(self, args: dict[str, Any]) -> None:
        asked = args.get("run_id") or args.get("run_uuid")
        if asked != self._ctx.run_id:
            raise MlflowError(404, "RESOURCE_DOES_NOT_EXIST", f"run {str(asked)[:40]!r} is not this one: troupe's "
                                                              f"MLflow endpoint logs into run {self._ctx.run_id}")

    def _run(self, _: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            data = {"metrics": list(self._metrics.values()),
                    "params": [{"key": k, "value": v} for k, v in self._params.items()],
                    "tags": [{"key": k, "value": v} for k, v in self._tags.items()]}
        return {"run": {"info": self._info(), "data": data, "inputs": {}}}

    def _info(self) -> dict[str, Any]:
        run_id = self._ctx.run_id
        return {"run_id": run_id, "run_uuid": run_id, "run_name": self._tags.get("mlflow.runName", run_id[:8]),
                "experiment_id": EXPERIMENT, "user_id": "", "status": "RUNNING", "start_time": self._started_ms,
                "artifact_uri": f"mlflow-artifacts:/{run_id}/artifacts", "lifecycle_stage": "active"}

    def _update(self, args: dict[str, Any]) -> dict[str, Any]:
        """The client marks the run running at its start and finished at its end: troupe
        says how the run ended (the command's exit), so only a new name is recorded."""
        name = args.get("run_name")
        if isinstance(name, str) and name and self._tags.get("mlflow.runName") != name:
            self._log((), {}, {"mlflow.runName": _text(name, "run_name", TAG_VALUE_MAX)})
        return {"run_info": self._info()}

    def _log_metric(self, args: dict[str, Any]) -> dict[str, Any]:
        self._log([args], {}, {})
        return {}

    def _log_param(self, args: dict[str, Any]) -> dict[str, Any]:
        self._log((), {_key(args.get("key")): _text(args.get("value"), "value", PARAM_VALUE_MAX)}, {})
        return {}

    def _set_tag(self, args: dict[str, Any]) -> dict[str, Any]:
        self._log((), {}, {_key(args.get("key")): _text(args.get("value"), "value", TAG_VALUE_MAX)})
        return {}

    def _delete_tag(self, args: dict[str, Any]) -> dict[str, Any]:
        key = _key(args.get("key"))
        if key not in self._tags:
            raise MlflowError(404, "RESOURCE_DOES_NOT_EXIST", f"no tag {key!r} on run {self._ctx.run_id}")
        self._log((), {}, {key: None})
        return {}

    def _log_batch(self, args: dict[str, Any]) -> dict[str, Any]:
        params = {_key(p.get("key")): _text(p.get("value"), "value", PARAM_VALUE_MAX) for p in _items(args, "params")}
        tags: dict[str, str | None] = {_key(t.get("key")): _text(t.get("value"), "value", TAG_VALUE_MAX)
                                       for t in _items(args, "tags")}
        self._log(_items(args, "metrics"), params, tags)
        return {}

    def _experiment(self, args: dict[str, Any]) -> dict[str, Any]:
        """The run's one experiment, under the name the script gives it."""
        name = args.get("experiment_name")
        if name is None and args.get("experiment_id") != EXPERIMENT:
            raise MlflowError(404, "RESOURCE_DOES_NOT_EXIST", f"no experiment {args.get('experiment_id')!r}: a "
                                                              f"troupe run's experiment is {EXPERIMENT!r}")
        if isinstance(name, str) and name:
            self._experiment_name = name[:PARAM_KEY_MAX]
        return {"experiment": {"experiment_id": EXPERIMENT, "name": self._experiment_name,
                               "artifact_location": "mlflow-artifacts:/", "lifecycle_stage": "active"}}

    def _log(self, metrics: Any, params: dict[str, str], tags: Mapping[str, str | None]) -> None:
        """Checks the whole call first (MLflow logs all of a batch or none of it), then
        emits its points and one params event, in the order they were logged."""
        points = [self._point(m) for m in metrics]
        with self._lock:
            for key, value in params.items():
                if self._params.get(key, value) != value:
                    raise _invalid(f"Changing param values is not allowed. Param with key='{key}' was already logged "
                                   f"with value='{self._params[key]}' for run ID='{self._ctx.run_id}'. Attempted "
                                   f"logging new value '{value}'.")
            for point in points:
                if point is not None:
                    self._ctx.metric(point["key"], point["value"], step=point["step"],
                                     wall_time=point["timestamp"] / 1000)
                    self._metrics[point["key"]] = point
            fresh = {k: v for k, v in params.items() if k not in self._params}
            self._params.update(fresh)
            for key, tag in tags.items():
                if tag is None:
                    self._tags.pop(key, None)
                else:
                    self._tags[key] = tag
            if fresh or tags:
                payload: dict[str, Any] = {"params": fresh} if fresh else {}
                if tags:
                    payload["tags"] = dict(tags)
                self._ctx.sinks.emit(PARAMS, self._ctx.node_id, payload)

    def _point(self, metric: Any) -> dict[str, Any] | None:
        """A metric as a point, or None (said once a series) where no series holds it."""
        if not isinstance(metric, dict):
            raise _invalid("a metric is an object with key, value, timestamp and step")
        key = _key(metric.get("key"))
        try:
            value = float(metric.get("value"))  # type: ignore[arg-type]  # refused below when it is not a number
            step = int(metric.get("step") or 0)
            timestamp = int(metric.get("timestamp") or time.time() * 1000)
        except (TypeError, ValueError, OverflowError):
            raise _invalid(f"metric {key!r}: value, step and timestamp must be numbers") from None
        if len(key) > NAME_MAX or not 0 <= step <= STEP_MAX:
            self.say_once(f"point:{key}", f"MLflow metric {key[:60]!r} at step {step} is not charted: a series needs "
                                          f"a name of 1 to {NAME_MAX} characters and a step from 0 to 2**53")
            return None
        return {"key": key, "value": value, "timestamp": timestamp, "step": step}

    def say_once(self, key: str, message: str) -> None:
        with self._lock:
            if key in self._said:
                return
            self._said.add(key)
        self._ctx.warning(message, code="mlflow_not_recorded")

    # Files --------------------------------------------------------------------------
    def store_file(self, relative: str, length: int, read: Callable[[int], bytes]) -> None:
        """``log_artifact``'s PUT: the file, whole, under the run's folder, then stored as
        the run's artifact (hashed, and sent on from a worker, off this thread)."""
        prefix = f"{self._ctx.run_id}/artifacts/"
        if not relative.startswith(prefix):
            raise MlflowError(404, "RESOURCE_DOES_NOT_EXIST", f"{relative[:80]!r} is not under this run's "
                                                              f"artifact_uri (mlflow-artifacts:/{prefix})")
        name = relative[len(prefix):]
        problem = outside_run_dir(f"{FOLDER}/{name}")
        if problem is not None:
            raise _invalid(problem)
        path = self._folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f".{path.name}.part")
        with part.open("wb") as out:
            left = length
            while left > 0:
                chunk = read(min(left, _CHUNK))
                if not chunk:
                    raise _invalid(f"{name} ended after {length - left} of its {length} bytes")
                out.write(chunk)
                left -= len(chunk)
        os.replace(part, path)
        self._ctx.artifact(KIND, path)


def _key(value: Any) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= PARAM_KEY_MAX:
        raise _invalid(f"a key must be text of 1 to {PARAM_KEY_MAX} characters, got {str(value)[:60]!r}")
    return value


def _text(value: Any, what: str, limit: int) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise _invalid(f"{what} must be text of at most {limit} characters, got {str(value)[:60]!r}")
    return value


def _items(args: dict[str, Any], part: str) -> list[dict[str, Any]]:
    found = args.get(part) or []
    if not isinstance(found, list) or not all(isinstance(item, dict) for item in found):
        raise _invalid(f"{part} must be a list of objects")
    return found


_CALLS: dict[tuple[str, str], Callable[[MlflowEndpoint, dict[str, Any]], dict[str, Any]]] = {
    ("GET", "runs/get"): MlflowEndpoint._run,
    ("POST", "runs/update"): MlflowEndpoint._update,
    ("POST", "runs/log-metric"): MlflowEndpoint._log_metric,
    ("POST", "runs/log-parameter"): MlflowEndpoint._log_param,
    ("POST", "runs/set-tag"): MlflowEndpoint._set_tag,
    ("POST", "runs/delete-tag"): MlflowEndpoint._delete_tag,
    ("POST", "runs/log-batch"): MlflowEndpoint._log_batch,
    ("GET", "experiments/get-by-name"): MlflowEndpoint._experiment,
    ("GET", "experiments/get"): MlflowEndpoint._experiment,
}


class _Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive (the client's session reuses one connection); every
    answer is JSON with its length. Nothing is logged to the process's stderr (in-process
    that is the server's)."""

    protocol_version = "HTTP/1.1"
    server_version = "troupe-mlflow"

    def log_message(self, format: str, *args: Any) -> None:  # the base class's name
        pass

    def do_GET(self) -> None:  # http.server calls them by these names
        self._answer("GET")

    def do_POST(self) -> None:
        self._answer("POST")

    def do_PUT(self) -> None:
        self._answer("PUT")

    def do_PATCH(self) -> None:
        self._answer("PATCH")

    def do_DELETE(self) -> None:
        self._answer("DELETE")

    def _answer(self, method: str) -> None:
        endpoint: MlflowEndpoint = cast(Any, self.server).endpoint
        try:
            reply = self._reply(endpoint, method)
            status = 200
        except MlflowError as exc:
            reply, status = {"error_code": exc.code, "message": str(exc)}, exc.status
        except Exception as exc:  # a fault of ours: said as MLflow says one, the run goes on
            reply, status = {"error_code": "INTERNAL_ERROR", "message": f"{type(exc).__name__}: {exc}"}, 500
        data = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _reply(self, endpoint: MlflowEndpoint, method: str) -> dict[str, Any]:
        if not endpoint.authorized(self.headers.get("Authorization")):
            self._drain()
            raise MlflowError(401, "UNAUTHENTICATED", "this run's MLflow calls carry its MLFLOW_TRACKING_TOKEN")
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise MlflowError(411, "BAD_REQUEST", "a body needs a Content-Length")
        url = urlsplit(self.path)
        length = self._length()
        if method == "PUT" and url.path.startswith(_ARTIFACTS):
            endpoint.store_file(unquote(url.path[len(_ARTIFACTS):]), length, self.rfile.read)
            return {}
        if length > _BODY_MAX:
            self.close_connection = True
            raise MlflowError(413, "BAD_REQUEST", f"a call's body is at most {_BODY_MAX // 2**20} MiB")
        raw = self.rfile.read(length) if length else b""
        if not url.path.startswith(_API):
            raise MlflowError(404, "ENDPOINT_NOT_FOUND", f"troupe's MLflow endpoint does not serve {url.path[:80]}")
        try:
            body = json.loads(raw) if raw.strip() else {}
        except ValueError:
            raise _invalid("the body is not JSON") from None
        if not isinstance(body, dict):
            raise _invalid("the body is a JSON object")
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        return endpoint.call(method, url.path[len(_API):], query, body)

    def _length(self) -> int:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            raise MlflowError(400, "BAD_REQUEST", "Content-Length is not a length")
        return length

    def _drain(self) -> None:
        """A refused call's body is read (up to the cap), so the connection stays usable."""
        with contextlib.suppress(MlflowError):
            length = self._length()
            if length <= _BODY_MAX:
                self.rfile.read(length)
            else:
                self.close_connection = True
