"""A measured peak becomes the next budget of the same graph on a shared card: a peak of
0 (a context started, nothing allocated) is none measured, and no budget is ever 0 (a
run frame cannot carry it, and the child would read it as no cap at all)."""

from __future__ import annotations

import math

from tests.unit.stand_ins import run_record
from troupe.actors.placer.actor import PEAK_MARGIN, derived_budget
from troupe.actors.run_effects import peak_row
from troupe.protocol import events as ev


def test_a_peak_of_zero_is_none_measured_and_no_budget_is_zero() -> None:
    on_a_card = run_record("r1", devices=("cuda:0",), graph_digest="d")
    assert peak_row(on_a_card, ev.SUCCEEDED, (0, True, False)) is None
    row = peak_row(on_a_card, ev.SUCCEEDED, (900, True, False))
    assert row is not None and row.peak_mib == 900
    assert derived_budget(0, None) == 1
    assert derived_budget(900, None) == math.ceil(900 * PEAK_MARGIN)
