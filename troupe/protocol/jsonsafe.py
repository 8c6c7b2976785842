"""JSON that every client can parse: no ``NaN`` or ``Infinity`` tokens.

A loss that diverges is data, not a broken reply. A non-finite number becomes ``null``,
and the object that held it says what it was: ``{"value": null, "non_finite": "nan"}``
when the field is ``value`` (a metric point), else ``"non_finite": {"field": "inf"}``
(nested fields by their dotted path). ``dumps`` tries the fast path first and walks the
object only when a non-finite number is really there.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import pydantic_core

# How deep a body (a graph, a sweep) may nest: deeper than any graph needs; deeper still
# would only reach recursion limits further in (a script's literal stops Python at 200).
MAX_DEPTH = 64


def kind_of(number: float) -> str:
    """``nan``, ``inf`` or ``-inf``: the word the API and the CSV use."""
    if math.isnan(number):
        return "nan"
    return "inf" if number > 0 else "-inf"


def finite_json(payload: dict[str, Any], text: str | None = None) -> tuple[dict[str, Any], str]:
    """``finite(payload)`` and its JSON. The C encoder finds out first whether there is a
    non-finite number at all (far cheaper than a walk), and its text is kept. ``text``:
    the JSON ``payload`` was parsed from; without a ``NaN`` or ``Infinity`` token in it,
    and on one line (an event stream's ``data:`` line ends at a line break, which JSON
    allows between its tokens), it is the answer as it is."""
    if text is not None and "NaN" not in text and "Infinity" not in text and "\n" not in text and "\r" not in text:
        return payload, text
    try:
        return payload, _FINITE_OR_TEXT.encode(payload)
    except ValueError:
        cleaned = finite(payload)
        return cleaned, _FINITE_OR_TEXT.encode(cleaned)


def finite(payload: dict[str, Any]) -> dict[str, Any]:
    """The payload with every non-finite float replaced by null and marked; the payload
    itself when it has none."""
    found: dict[str, str] = {}
    cleaned = _clean(payload, "", found)
    if not found:
        return payload
    assert isinstance(cleaned, dict)
    cleaned["non_finite"] = found["value"] if set(found) == {"value"} else found
    return cleaned


def _clean(value: Any, path: str, found: dict[str, str]) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        found[path] = kind_of(value)
        return None
    if isinstance(value, dict):
        return {k: _clean(v, f"{path}.{k}" if path else str(k), found) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v, f"{path}.{i}" if path else str(i), found) for i, v in enumerate(value)]
    return value


def loads(text: str | bytes) -> Any:
    """JSON text as Python, by pydantic-core's parser: about four times as fast as
    ``json.loads`` on the small objects a run's events are, which a relayed metric stream
    parses tens of thousands of a second. What it refuses goes to ``json.loads``, so the
    two accept the same texts (the standard library also takes an escaped lone surrogate)."""
    try:
        return pydantic_core.from_json(text)
    except ValueError:
        pass
    try:
        return json.loads(text)
    except RecursionError:  # nested deeper than Python's reader goes: refused as any bad JSON
        raise ValueError("the JSON is nested too deep to read") from None


_FLAT = frozenset({str, int, float, bool, type(None)})


def dumps_flat(payload: dict[str, Any]) -> str:
    """``json.dumps(payload, default=str)``'s JSON (non-finite numbers stay ``NaN`` and
    ``Infinity`` tokens), by pydantic-core's encoder when every key is text and every
    value a plain string, number, boolean or null (a metric point, a log line): about
    seven times as fast, and an agent relays tens of thousands of such events a second.
    Anything else goes to ``json.dumps``, which writes a date or a set as it always did."""
    if all(type(key) is str and type(value) in _FLAT for key, value in payload.items()):
        try:
            return pydantic_core.to_json(payload, inf_nan_mode="constants").decode()
        except ValueError:  # a lone surrogate, which json.dumps escapes
            pass
    return json.dumps(payload, default=str)


def dumps_stored(value: Any) -> str:
    """The JSON a column of the store keeps (a run's graph, its options, its execution
    facts), read back only by ``json.loads``: pydantic-core's encoder, several times as
    fast as ``json.dumps`` on a graph, writing a non-finite number as ``json.dumps``
    does. What it refuses (a lone surrogate) goes to ``json.dumps``, as it always did."""
    try:
        return pydantic_core.to_json(value, inf_nan_mode="constants").decode()
    except (ValueError, TypeError, pydantic_core.PydanticSerializationError):
        return json.dumps(value)


def dumps(obj: Any, default: Callable[[Any], Any] | None = None) -> str:
    """``json.dumps`` that never writes ``NaN``/``Infinity``; ``default`` is ``str`` or
    None (what the callers pass), each with an encoder made once, not one a call."""
    encoder = _FINITE if default is None else _FINITE_OR_TEXT if default is str else json.JSONEncoder(
        allow_nan=False, default=default)
    try:
        return encoder.encode(obj)
    except ValueError:
        found: dict[str, str] = {}
        return encoder.encode(_clean(obj, "", found))


# ``json.dumps`` with other than its defaults makes a new encoder each call.
_FINITE = json.JSONEncoder(allow_nan=False)
_FINITE_OR_TEXT = json.JSONEncoder(allow_nan=False, default=str)


def encodable(text: str) -> bool:
    """Whether ``text`` can be written as UTF-8: JSON's ``\\ud800`` escape reads into a lone
    surrogate, which passes every schema and then fails the first encoder that meets it
    (the store's, a log's, a worker frame's), far from the request that sent it."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
