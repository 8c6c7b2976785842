"""``troupe.Client``: a troupe server driven from Python (a notebook, a script, the CLI).

    import troupe
    client = troupe.Client()                      # the server this machine runs or logged in to
    run = client.run("hello.json", set={"a.value": 5})
    run.ok, run.metrics()["val_loss"][-1].value

Every call is one or a few HTTP requests through one connection pool; nothing here
starts an event loop, so it runs inside Jupyter's as it does in a plain script."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from troupe.client._config import locate
from troupe.client._errors import NotFound, Refused
from troupe.client._handles import Run, Study, Sweep
from troupe.client._http import Http
from troupe.protocol.api import RunDetail, RunEdit, RunRow
from troupe.protocol.replies import StudyDetail, SweepDetail

_WHOLE_ID = re.compile(r"^[0-9a-f]{32}$")
_PREFIX = re.compile(r"^[0-9a-f]{4,31}$")
_PAGE = 500  # rows a list asks for at a time (the most the server gives)


class Client:
    """A session with one server. ``url`` and ``token`` name it; left out, it is found
    as the CLI finds it (``TROUPE_URL``/``TROUPE_TOKEN``, the server ``troupe start``
    runs on this ``TROUPE_HOME``, then ``troupe login``'s). ``timeout``: seconds for one
    request (not for a ``wait``, which takes its own)."""

    def __init__(self, url: str | None = None, *, token: str | None = None, timeout: float = 30.0,
                 ca: str | None = None, unix_socket: str | None = None) -> None:
        place = locate(url, token)
        self.url = place.url
        self.http = Http(place.url, place.token, unix_socket=unix_socket, ca=ca or place.ca, timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def __repr__(self) -> str:
        return f"<troupe.Client {self.url}>"

    # Runs --------------------------------------------------------------------------

    def run(self, graph: Any, *, set: Mapping[str, Any] | None = None, target: str | Mapping[str, Any] | None = None,
            seed: int | None = None, name: str | None = None, tags: Sequence[str] | None = None,
            device: str | None = None, options: Mapping[str, Any] | None = None, wait: bool = True,
            timeout: float | None = None) -> Run:
        """Submits ``graph`` (a dict, a path to its JSON, or a graph model) and, with
        ``wait``, returns once it ended (``troupe.Timeout`` past ``timeout``). ``set``
        changes params first, as ``troupe run --set`` does (``"NODE.PARAM"`` or
        ``"NODE.vars.NAME"`` -> value); ``target``: a worker's name, or the target
        object (``{"worker": "gpu-a", "devices": ["cuda:1"]}``)."""
        document = _graph_document(graph)
        tagged = _tags(tags)
        if tagged and "keep" in tagged:
            self._may_keep()
        chosen: dict[str, Any] = dict(options or {})
        if set:
            chosen["params_set"] = self._apply_sets(document, set)
        if target is not None:
            chosen["target"] = {"worker": target} if isinstance(target, str) else dict(target)
        if seed is not None:
            chosen["seed"] = seed
        if device is not None:
            chosen["device"] = device
        body: dict[str, Any] = {"graph": document, "options": chosen}
        if name is not None:
            body["name"] = name
        created = self.http.request("POST", "/api/runs", body)
        run = Run(self, run_id=created["run_id"], status=created["status"])
        if tagged:
            self.http.request("PATCH", f"/api/runs/{run.id}", {"tags": tagged})
        return run.wait(timeout) if wait else run

    def _may_keep(self) -> None:
        """The tag ``keep`` is the teacher's to give (retention never removes its runs): a
        class session is refused it, so ``run(tags=["keep"])`` says so before submitting,
        not after, when the run it made would run on."""
        if self.info()["login"].get("session") == "class":
            raise Refused(403, "keep_is_the_teachers", "the tag keep is the teacher's to give: a class session may "
                          "not put it on a run, its own included; ask the teacher. Nothing was submitted", "/tags")

    def get(self, id_or_prefix: str) -> Run:
        """The run of that id, or of the one id that starts with it (4 or more characters)."""
        run_id = self.full_id("runs", id_or_prefix)
        return Run(self, RunDetail.model_validate(self.http.request("GET", f"/api/runs/{run_id}")))

    def runs(self, *, status: str | None = None, tag: str | None = None, sweep: str | None = None,
             study: str | None = None, where: str | None = None, q: str | None = None,
             limit: int | None = None) -> list[Run]:
        """Runs newest first, every page read (up to ``limit``)."""
        return [Run(self, RunRow.model_validate(row)) for row in
                self._rows(status=status, tag=tag, sweep=sweep, study=study, where=where, q=q, limit=limit)]

    def runs_frame(self, *, status: str | None = None, tag: str | None = None, sweep: str | None = None,
                   study: str | None = None, where: str | None = None, q: str | None = None,
                   limit: int | None = None, group_by: str | None = None, metric: str | None = None) -> Any:
        """The same runs as a pandas DataFrame: a row per run, its params as ``node.param``
        columns and each series' newest value as ``metric.SERIES``. With ``group_by`` (a
        key of ``where``: ``adam.lr``, ``type``, ``status``...) a row per value of it
        instead: its ``runs`` and, with ``metric``, ``metric.SERIES.mean`` / ``.min`` /
        ``.max`` / ``.std`` of those runs' newest values (``.runs``: how many had one)."""
        from troupe.client._frames import groups_frame, runs_frame

        if group_by is not None:
            return groups_frame(self._groups(group_by, metric, status=status, tag=tag, sweep=sweep, study=study,
                                             where=where, q=q, limit=limit), group_by, metric)
        if metric is not None:
            raise ValueError("metric goes with group_by: each group's statistics of that series")
        return runs_frame(self._rows(status=status, tag=tag, sweep=sweep, study=study, where=where, q=q,
                                     limit=limit, values=True))

    def run_keys(self) -> dict[str, Any]:
        """The keys ``where`` and ``group_by`` can name, each with how many runs have it:
        ``{"keys": [{"key", "kind", "runs", "direction"?}], "types": [{"name", "runs"}]}``."""
        return dict(self.http.request("GET", "/api/runs/keys"))

    def _groups(self, group_by: str, metric: str | None, *, limit: int | None, sweep: str | None,
                study: str | None, **query: Any) -> list[dict[str, Any]]:
        _check_limit(limit)
        params = {**query, "group_by": group_by, "metric": metric, "sweep_id": sweep and self.full_id("sweeps", sweep),
                  "study_id": study and self.full_id("studies", study)}
        groups: list[dict[str, Any]] = []
        cursor = None
        while limit is None or len(groups) < limit:
            page = self.http.request("GET", "/api/runs", params={
                **params, "cursor": cursor, "limit": min(_PAGE, limit - len(groups)) if limit else _PAGE})
            groups.extend(page["groups"])
            cursor = page.get("next_cursor")
            if not cursor:
                break
        return groups

    def _rows(self, *, limit: int | None, sweep: str | None, study: str | None, **query: Any) -> list[dict[str, Any]]:
        _check_limit(limit)
        params = {**query, "sweep_id": sweep and self.full_id("sweeps", sweep),
                  "study_id": study and self.full_id("studies", study)}
        rows: list[dict[str, Any]] = []
        cursor = None
        while limit is None or len(rows) < limit:
            page = self.http.request("GET", "/api/runs", params={
                **params, "cursor": cursor, "limit": min(_PAGE, limit - len(rows)) if limit else _PAGE})
            rows.extend(r for r in page["runs"] if "kind" not in r)  # a folded sweep or study row is no run
            cursor = page.get("next_cursor")
            if not cursor:
                break
        return rows

    # Sweeps and studies ------------------------------------------------------------

    def sweep(self, spec: Mapping[str, Any] | str | Path, *, set: Mapping[str, Any] | None = None,
              wait: bool = True, timeout: float | None = None) -> Sweep:
        """Starts a sweep (``spec``: the request's body, or a path to its JSON, as
        ``troupe sweep start`` takes it) and, with ``wait``, returns once it ended."""
        created = self.http.request("POST", "/api/sweeps", self._spec(spec, set))
        found = self.get_sweep(created["sweep_id"])
        return found.wait(timeout) if wait else found

    def get_sweep(self, sweep_id: str) -> Sweep:
        whole = self.full_id("sweeps", sweep_id)
        return Sweep(self, SweepDetail.model_validate(self.http.request("GET", f"/api/sweeps/{whole}")))

    def study(self, spec: Mapping[str, Any] | str | Path, *, set: Mapping[str, Any] | None = None,
              wait: bool = True, timeout: float | None = None) -> Study:
        """Starts a study (``spec`` as ``troupe study start`` takes it) and, with
        ``wait``, returns once it finished or halted on its budget."""
        created = self.http.request("POST", "/api/studies", self._spec(spec, set))
        found = self.get_study(created["id"])
        return found.wait(timeout) if wait else found

    def get_study(self, study_id: str) -> Study:
        whole = self.full_id("studies", study_id)
        return Study(self, StudyDetail.model_validate(self.http.request("GET", f"/api/studies/{whole}")))

    def _spec(self, spec: Mapping[str, Any] | str | Path, sets: Mapping[str, Any] | None) -> dict[str, Any]:
        body = dict(spec) if isinstance(spec, Mapping) else _json_object(Path(spec))
        if sets:
            graph = body.get("base_graph")
            if not isinstance(graph, dict):
                raise ValueError("the spec has no base_graph for set to change")
            body["base_graph"] = graph = json.loads(json.dumps(graph))
            body["options"] = {**(body.get("options") or {}), "params_set": self._apply_sets(graph, sets)}
        return body

    # The server --------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        return dict(self.http.request("GET", "/api/info"))

    def workers(self) -> list[dict[str, Any]]:
        return list(self.http.request("GET", "/api/workers")["workers"])

    def queues(self) -> list[dict[str, Any]]:
        return list(self.http.request("GET", "/api/queues")["queues"])

    def packs(self) -> list[dict[str, Any]]:
        return list(self.http.request("GET", "/api/packs")["packs"])

    def enroll_worker(self, name: str | None = None, *, uses: int = 1, ttl_s: float | None = None) -> str:
        """A one-time enrollment for a worker: returns the command that starts its agent
        (``troupe agent start --url ... --token ...``), to run on that machine."""
        body: dict[str, Any] = {"uses": uses}
        if name is not None:
            body["name"] = name
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        return str(self.http.request("POST", "/api/workers/enrollments", body)["command"])

    # Ids and params ----------------------------------------------------------------

    def full_id(self, kind: str, given: str) -> str:
        """The whole id of the run, sweep or study (``kind``: runs, sweeps, studies) that
        ``given`` starts; ``NotFound`` for none, ``ValueError`` for several or too short."""
        what = {"runs": "run", "sweeps": "sweep", "studies": "study"}[kind]
        text = str(given).strip().lower()
        if _WHOLE_ID.fullmatch(text):
            return text
        if not _PREFIX.fullmatch(text):
            raise ValueError(f"{given!r} is no {what} id: give its 32 hex characters, or 4 or more of its first")
        matches = self.http.request("GET", "/api/ids", params={"prefix": text}).get(kind, [])
        if not matches:
            raise NotFound(404, f"{what}_not_found", f"no {what} has an id starting with {text}")
        if len(matches) > 1:
            raise ValueError(f"{given!r} names more than one {what}: {', '.join(m[:12] for m in matches)}; "
                             "give more of the id")
        return str(matches[0])

    def _apply_sets(self, graph: dict[str, Any], sets: Mapping[str, Any]) -> dict[str, Any]:
        """``set`` applied to ``graph`` in place by the rules of ``--set`` (one place
        says how a value is read for a param's type and which names exist)."""
        from troupe.cli.errors import CliError
        from troupe.cli.set_params import apply_sets, catalog_params

        catalog = self.http.request("GET", "/api/nodes")
        given = [f"{key}={_as_text(value)}" for key, value in sets.items()]
        try:
            return apply_sets(graph, given, catalog_params(catalog["nodes"]))
        except CliError as exc:  # a name the graph lacks, a value its param cannot take
            raise ValueError(str(exc).replace("--set ", "set ")) from None


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _graph_document(graph: Any) -> dict[str, Any]:
    """A graph given as a dict (copied: the caller's stays as it was), a path, or a model."""
    if isinstance(graph, str | Path):
        return _json_object(Path(graph))
    if isinstance(graph, Mapping):
        return dict(json.loads(json.dumps(graph)))
    if hasattr(graph, "model_dump"):
        return dict(graph.model_dump(mode="json", exclude_none=True))
    raise TypeError(f"a graph is a dict, a path to its JSON or a graph model, not {type(graph).__name__}")


def _json_object(path: Path) -> dict[str, Any]:
    try:
        found = json.loads(path.read_text())
    except OSError as exc:
        raise FileNotFoundError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    if not isinstance(found, dict):
        raise ValueError(f"{path} holds no JSON object")
    return found


def _check_limit(limit: int | None) -> None:
    """A list's ``limit``: None for every run (or group), else how many at most (0:
    none, as a slice of none). A negative one was an empty list, as if nothing matched."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit is how many at most: 1 or more (0: none), or None for all; got {limit!r}")


def _tags(tags: Sequence[str] | None) -> list[str] | None:
    """The tags a run will be given, checked before it is submitted: they go in a second
    request, and a refusal there would leave a run the caller was told had failed (and
    would submit again)."""
    if not tags:
        return None
    tagged = sorted({*tags}) if all(isinstance(tag, str) for tag in tags) else list(tags)
    try:
        RunEdit.model_validate({"tags": tagged})
    except ValidationError as exc:
        problem = exc.errors()[0]
        raise ValueError(f"tags {tagged}: {problem['msg']} ({'/'.join(map(str, problem['loc']))}); nothing was "
                         "submitted") from None
    return tagged
