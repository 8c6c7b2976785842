"""Finding runs: ``GET /api/runs`` (filtered, searched, tagged, paged, and with
``grouped=true`` a row per sweep and study) and ``PATCH /api/runs/{id}`` (a run's name,
tags and note)."""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from troupe.actors.store.run_list import EditRun, GroupRuns, ListGroups, ListRuns, MatchIds, RunKeys, RunValues
from troupe.protocol import events as ev
from troupe.protocol.api import TAG_PATTERN, RunEdit
from troupe.protocol.errors import InvalidRequest, WhereInvalid
from troupe.protocol.where import Node, key_of
from troupe.protocol.where import parse as parse_where
from troupe.web.change_rights import refuse_keep
from troupe.web.context import services
from troupe.web.errors import json_reply
from troupe.web.login import submitter_of
from troupe.web.queue_state import with_queue_reasons
from troupe.web.requests import int_query, one_query, read_model, run_id_from
from troupe.web.routes_runs import own_run, public_row, run_detail

routes = web.RouteTableDef()
CURSOR_PATTERN = r"^([0-9]{1,18})?$"
_TAG = re.compile(TAG_PATTERN)

MAX_SEARCH = 200  # characters of ?q; the OpenAPI document states the same bound
SEARCH_PATTERN = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"  # no control character (ECMA-262, as the document says)
_CONTROL = re.compile("[\u0000-\u001f\u007f-\u009f]")


def _decode_cursor(raw: str | None) -> int | None:
    if not raw:
        return None
    if raw.isascii() and raw.isdigit() and len(raw) <= 18:  # 18 digits: below SQLite's 64-bit INTEGER
        return int(raw)
    raise InvalidRequest("cursor is not one this server handed out (pass next_cursor back as it came)",
                         pointer="?cursor")


SORT_PATTERN = r"^-?[A-Za-z0-9_.:/\-]{1,128}$"
_SORT = re.compile(SORT_PATTERN)
METRIC_PATTERN = SORT_PATTERN.replace("^-?", "^")  # a series' name, as sort names it without its -
_METRIC = re.compile(METRIC_PATTERN)


def _sort_query(request: web.Request) -> str | None:
    """The series to order by; an empty ``sort=`` names none and is refused, as the
    document's pattern says (not read as no order)."""
    sort = one_query(request, "sort")
    if sort is not None and not _SORT.fullmatch(sort):
        raise InvalidRequest("sort is a metric series' name, with - before it for the highest first", pointer="?sort")
    return sort


def _tag_query(request: web.Request) -> str | None:
    tag = one_query(request, "tag") or None
    if tag is not None and not _TAG.fullmatch(tag):
        raise InvalidRequest("tag is letters, digits and _.:+/- (at most 40), starting with a letter or digit",
                             pointer="?tag")
    return tag


def _mine(request: web.Request) -> str | None:
    """``?mine=true``: the runs the asking session submitted (the server's token: "server")."""
    mine = one_query(request, "mine", "false")
    if mine not in ("true", "false"):
        raise InvalidRequest("mine is true or false", pointer="?mine")
    if mine == "false":
        return None
    who = services(request).login.who(request)
    if who is None:
        raise InvalidRequest("mine=true needs a session (a login link's, or the server's token) to say whose runs",
                             pointer="?mine", code="no_session")
    return submitter_of(who)


# Every query parameter GET /api/runs reads: any other is refused, never ignored (a
# misspelt filter answering every run reads as "all of them match").
LIST_QUERY = ("status", "sweep_id", "study_id", "limit", "cursor", "q", "tag", "grouped", "mine", "values", "sort",
              "where", "group_by", "metric")


def _known_query(request: web.Request) -> None:
    unknown = sorted(set(request.query) - set(LIST_QUERY))
    if unknown:
        raise InvalidRequest(f"GET /api/runs takes no query parameter {unknown[0]}; it takes {', '.join(LIST_QUERY)}",
                             pointer=f"?{unknown[0]}", code="unknown_parameter")


def _where_query(request: web.Request) -> Node | None:
    """``?where=``, parsed (a 400 where_invalid with the offset of a fault); empty: none."""
    text = one_query(request, "where") or ""
    control = _CONTROL.search(text)
    if control:
        raise WhereInvalid(f"at offset {control.start()}: where holds a control character", offset=control.start())
    return parse_where(text) if text.strip() else None


@routes.get("/api/runs")
async def list_runs(request: web.Request) -> web.Response:
    svc = services(request)
    _known_query(request)
    where = _where_query(request)
    status = one_query(request, "status") or None
    if status is not None and not set(status.split(",")) <= ev.ALL_STATES:
        raise InvalidRequest(f"status is one of {sorted(ev.ALL_STATES)}, or several joined by commas; got {status!r}",
                             pointer="?status")
    grouped = one_query(request, "grouped", "false")
    if grouped not in ("true", "false"):
        raise InvalidRequest("grouped is true or false", pointer="?grouped")
    values = one_query(request, "values", "false")
    if values not in ("true", "false"):
        raise InvalidRequest("values is true or false", pointer="?values")
    limit = int_query(request, "limit", default=50, minimum=1, maximum=500) or 50
    before = _decode_cursor(one_query(request, "cursor"))
    raw_search = one_query(request, "q") or ""
    if len(raw_search) > MAX_SEARCH:  # the document's bound, refused, never cut short
        raise InvalidRequest(f"q is at most {MAX_SEARCH} characters, got {len(raw_search)}", pointer="?q")
    if _CONTROL.search(raw_search):  # a NUL or another control character matches nothing a person wrote
        raise InvalidRequest("q holds a control character; search for text", pointer="?q")
    search = raw_search.strip() or None
    tag = _tag_query(request)
    sweep_id, study_id = one_query(request, "sweep_id") or None, one_query(request, "study_id") or None
    mine = _mine(request)
    sort = _sort_query(request)  # checked whichever list it orders
    group_by = one_query(request, "group_by")
    if group_by is not None or one_query(request, "metric") is not None:
        return await _grouped_by(request, group_by, grouped == "true" or values == "true" or sort is not None, {
            "status": status, "sweep_id": sweep_id, "study_id": study_id, "search": search, "tag": tag,
            "submitted_by": mine, "where": where, "limit": limit, "offset": before or 0})
    if grouped == "true" and not (sweep_id or study_id):
        items, next_seq = await svc.store.read(ListGroups(status, limit, before, search, tag, mine, where=where))
        rows = await with_queue_reasons(svc, [item["run"] for item in items if item["kind"] == "run"])
        public = iter(public_row(r) for r in rows)
        found: list[dict[str, Any]] = [next(public) if item["kind"] == "run" else item for item in items]
    else:
        rows, next_seq = await svc.store.read(ListRuns(status, sweep_id, study_id, limit, before, search, tag, sort,
                                                         mine, where=where))
        found = [{**public_row(r), **({"sort_value": r["sort_value"]} if sort else {})}
                 for r in await with_queue_reasons(svc, rows)]
    if values == "true":
        found = await _with_values(svc, found)
    return json_reply({"runs": found, "next_cursor": None if next_seq is None else str(next_seq)})


async def _grouped_by(request: web.Request, group_by: str | None, other_shape: bool,
                      filters: dict[str, Any]) -> web.Response:
    """``?group_by=KEY[&metric=SERIES]``: a row per value of the key, within the same
    filters; its cursor is the number of groups before the page."""
    if group_by is None:
        raise InvalidRequest("metric goes with group_by: each group's count, mean, min, max and std of the series' "
                             "newest values", pointer="?metric", code="query_conflict")
    if other_shape:
        raise InvalidRequest("group_by answers groups, not runs: it takes no grouped=true, values=true or sort",
                             pointer="?group_by", code="query_conflict")
    try:
        key = key_of(group_by)
    except WhereInvalid as exc:  # said of ?group_by, its own offset
        exc.pointer = "?group_by"
        raise
    metric = one_query(request, "metric") or None
    if metric is not None and not _METRIC.fullmatch(metric):
        raise InvalidRequest("metric is a series' name", pointer="?metric")
    rows, next_offset = await services(request).store.read(GroupRuns(key, metric, **filters))
    return json_reply({"groups": rows, "group_by": key.text, "metric": metric,
                       "next_cursor": None if next_offset is None else str(next_offset)})


@routes.get("/api/runs/keys")
async def run_keys(request: web.Request) -> web.Response:
    """The keys ``where`` and ``group_by`` can name, each with how many stored runs have
    it (the page's suggestions, ``troupe ls --keys``)."""
    if request.query:
        raise InvalidRequest(f"GET /api/runs/keys takes no query parameter {sorted(request.query)[0]}",
                             pointer=f"?{sorted(request.query)[0]}", code="unknown_parameter")
    return json_reply(await services(request).store.read(RunKeys()))


async def _with_values(svc: Any, found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``?values=true``: each run with its params (``node.param``, as ``--set`` names
    them; never a secret's, nor a long text) and the newest value of each series, for the
    columns a person picks: read from the run index, as ``where`` reads them (one rule
    flattens a graph's params, ``run_index.flat_params``), no graph decoded."""
    values = await svc.store.read(RunValues(tuple(item["id"] for item in found if "kind" not in item)))
    return [item if "kind" in item else {**item, **values[item["id"]]} for item in found]


_PREFIX = re.compile(r"^[0-9a-f]{4,32}$")


@routes.get("/api/ids")
async def match_ids(request: web.Request) -> web.Response:
    """The runs, sweeps and studies whose id starts with ``?prefix`` (4 to 32 lower-case
    hex characters): a terminal's short id, as git and docker read theirs."""
    prefix = one_query(request, "prefix", "")
    if not _PREFIX.fullmatch(prefix):
        raise InvalidRequest("prefix is 4 to 32 lower-case hex characters (the start of an id)", pointer="?prefix")
    return json_reply(await services(request).store.read(MatchIds(prefix)))


@routes.patch("/api/runs/{run_id}")
async def edit_run(request: web.Request) -> web.Response:
    """A run's name, tags and note; the run itself (its record, its events) is untouched."""
    svc = services(request)
    run_id = run_id_from(request)
    body = await read_model(request, RunEdit)
    row = await own_run(svc, request, run_id, "rename, retag or note")
    given = body.model_fields_set
    if row is not None and "tags" in given:  # keep is the teacher's to give (change_rights)
        refuse_keep(svc.login.who(request), run_id, row.get("tags") or (), body.tags or ())
    await svc.store.write(EditRun(
        run_id, name=body.name, note=body.note,
        tags=tuple(sorted(set(body.tags or ()))) if "tags" in given else None,
        clear_name="name" in given and body.name is None, clear_note="note" in given and body.note is None))
    return json_reply(await run_detail(svc, run_id))
