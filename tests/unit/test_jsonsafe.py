"""``jsonsafe.loads`` takes exactly the texts ``json.loads`` takes, with the same result:
a worker's event payloads and every stored payload are read with it."""

from __future__ import annotations

import json
import math

import pytest

from protocol import jsonsafe

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
