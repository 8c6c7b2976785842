"""``jsonsafe.loads`` takes exactly the texts ``json.loads`` takes, with the same result:
a worker's event payloads and every stored payload are read with it."""

from __future__ import annotations

import datetime
import json
import math

import pytest

from troupe.protocol import jsonsafe

ACCEPTED = [
    '{"name": "loss", "step": 3, "value": 0.25}',
    '{"a": 123456789012345678901234567890}',  # beyond 64 bits
    '{"a": 1.0000000000000002, "b": 5e-324, "c": -0.0, "d": 1e400}',
    '{"a": 1, "a": 2}',  # the last wins
    '{"x": "\\u00e9\\n", "y": [1, {"z": null}], "t": true}',
    '{"a": "\\ud800"}',  # a lone surrogate escape: pydantic-core refuses it, json takes it
    ' {"a": 1}\n',
    "[1, 2]",
]
REFUSED = ['{"a": ', '{"a": 1} x', "", '{"a": 1,}', "{'a': 1}", '{"a": "x\ny"}', '{"a": 01}', '{"a": .5}']


@pytest.mark.parametrize("text", ACCEPTED)
def test_what_json_takes_is_read_alike(text):
    assert jsonsafe.loads(text) == json.loads(text)


def test_non_finite_tokens_are_read_as_json_reads_them():
    read = jsonsafe.loads('{"a": NaN, "b": Infinity, "c": -Infinity}')
    assert math.isnan(read["a"]) and read["b"] == math.inf and read["c"] == -math.inf


@pytest.mark.parametrize("text", REFUSED)
def test_what_json_refuses_is_refused(text):
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        jsonsafe.loads(text)


FLAT = [{"name": "loss", "value": 0.123456789, "step": 3}, {"value": math.nan, "hi": math.inf, "lo": -math.inf},
        {"big": 10**30, "neg": -0.0, "tiny": 1e-7, "huge": 1e300},
        {"text": "é \u2028 \"q\" \\ \n", "ok": True, "none": None}, {"lone": "\ud800"}, {}]
NOT_FLAT = [{"when": datetime.datetime(2020, 1, 2, 3, 4, 5)}, {"set": {1}}, {"nested": {"a": [1, 2]}},
            {1: "int key"}, {"bytes": b"xy"}]


@pytest.mark.parametrize("payload", FLAT + NOT_FLAT)
def test_an_agents_payload_reads_back_as_json_dumps_wrote_it(payload):
    """An agent encodes each relayed event with ``dumps_flat``: what the control plane
    reads back is what ``json.dumps(default=str)`` gave, NaN tokens included."""
    ours, theirs = jsonsafe.loads(jsonsafe.dumps_flat(payload)), json.loads(json.dumps(payload, default=str))
    assert json.dumps(ours, sort_keys=True) == json.dumps(theirs, sort_keys=True)  # NaN == NaN as text
    if payload in NOT_FLAT:
        assert jsonsafe.dumps_flat(payload) == json.dumps(payload, default=str)  # not plain: the same text


STORED = [{"version": 1, "nodes": [{"id": "a", "type": "core.Constant", "params": {"value": 2.5}}], "edges": []},
          {"lane": "queued", "target": {"worker": "w1", "devices": ["cuda:0"]}, "tags": ("a", "b")},
          {"value": math.nan, "hi": [math.inf, -math.inf]}, {1: "int key", "text": "é \u2028 \"q\""},
          {"lone": "\ud800"}, [], None]


@pytest.mark.parametrize("value", STORED)
def test_a_stored_column_reads_back_as_json_dumps_wrote_it(value):
    """The store writes a run's JSON columns with ``dumps_stored``: what ``json.loads``
    reads back is what it read of ``json.dumps``'s text, NaN tokens and a lone surrogate
    included."""
    ours, theirs = json.loads(jsonsafe.dumps_stored(value)), json.loads(json.dumps(value))
    assert json.dumps(ours, sort_keys=True) == json.dumps(theirs, sort_keys=True)  # NaN == NaN as text
