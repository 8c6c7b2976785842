"""Reading request bodies and queries into schemas, with pointers on every mistake."""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar, overload

from aiohttp import web
from pydantic import BaseModel, ValidationError

from troupe.protocol.errors import InvalidRequest, NotFound, pointer_from_path
from troupe.protocol.jsonsafe import MAX_DEPTH, encodable
from troupe.web.context import services
from troupe.web.limits import read_body

Model = TypeVar("Model", bound=BaseModel)
RUN_ID = re.compile(r"[0-9a-f]{32}")  # used with fullmatch: "$" would let a trailing newline in
# The largest seq, step or cursor a query may name (SQLite's INTEGER is 64-bit).
MAX_INT_QUERY = 2**62
_INTEGER = re.compile(r"-?[0-9]{1,40}")  # no integer of thousands of digits


async def read_model(request: web.Request, model: type[Model]) -> Model:
    raw = await read_body(request, services(request).settings)
    if not raw:
        raise InvalidRequest("the request needs a JSON body", pointer="")
    try:
        # ``json.loads(raw, parse_constant=...)``, by a decoder made once, not one a call.
        body = _BODY.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    except RecursionError:
        raise InvalidRequest(f"the body is nested deeper than {MAX_DEPTH} levels", pointer="",
                             code="too_deep") from None
    except ValueError as exc:  # bad JSON, bad UTF-8, an integer of thousands of digits
        raise InvalidRequest(f"the body is not valid JSON: {str(exc)[:200]}", pointer="") from None
    if not isinstance(body, dict):
        raise InvalidRequest(f"the body must be a JSON object, not {type(body).__name__}", pointer="")
    if not _plainly_shallow(raw):
        _check_depth(body)
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise invalid_body(exc, body) from None


def _not_json(token: str) -> Any:
    # Python's json reads NaN and Infinity; JSON has no such numbers, and a client that
    # sends them would be told later, in words about a value it never sent.
    raise ValueError(f"{token} is not a JSON number")


_BODY = json.JSONDecoder(parse_constant=_not_json)


def _plainly_shallow(raw: bytes) -> bool:
    """Whether ``raw`` cannot hold what ``_check_depth`` looks for, seen from its bytes
    (C-speed counts, where the walk cost a small run's submit about 14 us): a level of
    nesting opens with a bracket, so fewer brackets than ``MAX_DEPTH`` are never too
    deep; and text no record can keep comes only from an escape or non-ASCII bytes. That
    holds for UTF-8 only: JSON in UTF-16 or UTF-32 (which the reader takes too) is ASCII
    bytes with NULs between, where an escape's bytes are not side by side."""
    return (raw.count(b"{") + raw.count(b"[") <= MAX_DEPTH and raw.isascii() and b"\\u" not in raw
            and b"\0" not in raw)


def _check_depth(body: Any) -> None:
    """400 ``too_deep`` for a body nested past ``MAX_DEPTH``, with a pointer to where.
    The walk keeps no pointers (every request pays for it); only a body found too deep
    is walked again to say where."""
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InvalidRequest(f"the body is nested deeper than {MAX_DEPTH} levels", pointer=_too_deep_at(body),
                                 code="too_deep")
        if isinstance(value, dict):
            for key, item in value.items():
                if not (key.isascii() and (not isinstance(item, str) or item.isascii())):
                    _check_text(key, body)
                    if isinstance(item, str):
                        _check_text(item, body)
            stack.extend((v, depth + 1) for v in value.values() if isinstance(v, dict | list))
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, str) and not item.isascii():
                    _check_text(item, body)
            stack.extend((v, depth + 1) for v in value if isinstance(v, dict | list))


def refuse_unencodable(text: str, pointer: str, what: str = "a string") -> None:
    """400 ``invalid_text`` for ``text`` that no record can keep, pointing at it."""
    if not encodable(text):
        raise InvalidRequest(f"{what} holds a lone surrogate (an escape such as \\ud800 with no pair), which is "
                             "not text: send valid Unicode", pointer=pointer, code="invalid_text")


def _check_text(text: str, body: Any) -> None:
    if not encodable(text):
        refuse_unencodable(text, _unencodable_at(body), "the body")


def _tokens(pointer: str) -> list[str]:
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer.split("/")[1:]]


def _unencodable_at(body: Any) -> str:
    """The pointer to the first key or string of ``body`` that is not text (only walked
    for a body already found to hold one)."""
    stack: list[tuple[Any, str]] = [(body, "")]
    while stack:
        value, pointer = stack.pop()
        if isinstance(value, str) and not encodable(value):
            return pointer
        if isinstance(value, dict):
            for key, item in value.items():
                if not encodable(key):  # named as \\ud800 in the pointer, which must itself be text
                    return pointer_from_path([*_tokens(pointer), key.encode("utf-8", "backslashreplace").decode()])
                stack.append((item, pointer_from_path([*_tokens(pointer), key])))
        elif isinstance(value, list):
            stack.extend((v, f"{pointer}/{i}") for i, v in enumerate(value))
    return ""


def _too_deep_at(body: Any) -> str:
    stack: list[tuple[Any, int, str]] = [(body, 1, "")]
    while stack:
        value, depth, pointer = stack.pop()
        if depth > MAX_DEPTH:
            return pointer
        if isinstance(value, dict):
            stack.extend((v, depth + 1, f"{pointer}/{k}") for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, depth + 1, f"{pointer}/{i}") for i, v in enumerate(value))
    return ""


def invalid_body(exc: ValidationError, body: Any, within: str = "") -> InvalidRequest:
    """The 400 for a body the model refused, pointing at its first mistake; ``within``:
    the pointer of the part of a larger body that was validated (``/spec``)."""
    first = exc.errors()[0]
    loc = [p for p in first["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
    pointer = pointer_from_path(loc)
    what = "/".join(str(p) for p in loc) or "body"
    node_id = None
    if len(loc) >= 3 and loc[0] == "graph" and loc[1] == "nodes" and isinstance(loc[2], int):
        try:
            node_id = body["graph"]["nodes"][loc[2]].get("id")
        except (KeyError, IndexError, TypeError, AttributeError):
            node_id = None
        if not isinstance(node_id, str):
            node_id = None
    code = "invalid_request"
    if first["type"] == "extra_forbidden" and len(loc) == 3 and tuple(loc[:2]) == ("options", "target"):
        code = "unknown_target_option"  # a run meant for elsewhere must never run here
    prefix = within.strip("/") + "/" if within else ""
    return InvalidRequest(f"{prefix}{what}: {first['msg']}", pointer=within + pointer, node_id=node_id, code=code)


def wants_csv(request: web.Request) -> bool:
    """``?format=csv`` (True) or ``json``, the default; anything else is refused, as the
    document's enum says, never read as json."""
    return choice_query(request, "format", ("json", "csv")) == "csv"


def choice_query(request: web.Request, name: str, choices: tuple[str, ...]) -> str:
    """A query parameter that takes one of ``choices`` (the first is the default), given
    at most once: ``?format=csv&format=json`` is refused, never read first-wins."""
    given = _once(request, name)
    value = choices[0] if given is None else given  # ?format= (empty) is no choice, as the document says
    if value not in choices:
        raise InvalidRequest(f"{name} must be {' or '.join(choices)}, got {value[:40]!r}", pointer=f"?{name}")
    return value


def hex_id(request: web.Request, kind: str) -> str:
    """The ``{kind}_id`` of the path; 404 ``{kind}_not_found`` unless it is 32 lowercase hex."""
    value = request.match_info[f"{kind}_id"]
    if not RUN_ID.fullmatch(value):
        raise NotFound(f"{value!r} is not a {kind} id (32 lowercase hex characters)", code=f"{kind}_not_found")
    return value


def run_id_from(request: web.Request) -> str:
    return hex_id(request, "run")


def int_query(request: web.Request, name: str, *, default: int | None = None, minimum: int = 0,
              maximum: int = MAX_INT_QUERY) -> int | None:
    raw = _once(request, name)
    if raw is None or raw == "":
        return default
    # ASCII digits, an optional minus, nothing else: Python's int() also reads "1_0",
    # "+5", " 5" and other scripts' digits, which no client means and no schema allows.
    if not _INTEGER.fullmatch(raw):
        raise InvalidRequest(f"query parameter {name} must be an integer, got {raw!r}", pointer=f"?{name}")
    value = int(raw)
    if value < minimum or value > maximum:
        bound = f"between {minimum} and {maximum}"
        raise InvalidRequest(f"query parameter {name} must be {bound}, got {value}", pointer=f"?{name}")
    return value


@overload
def one_query(request: web.Request, name: str) -> str | None: ...
@overload
def one_query(request: web.Request, name: str, default: str) -> str: ...
def one_query(request: web.Request, name: str, default: str | None = None) -> str | None:
    """A query parameter given at most once (twice: a 400, never read first-wins), or
    ``default`` when it is not given."""
    found = _once(request, name)
    return default if found is None else found


def _once(request: web.Request, name: str) -> str | None:
    """A query parameter's one value (None: not given); given twice, it is refused."""
    given = request.query.getall(name, [])
    if len(given) > 1:
        raise InvalidRequest(f"query parameter {name} is given {len(given)} times; give it once", pointer=f"?{name}")
    return given[0] if given else None
