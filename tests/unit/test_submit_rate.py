"""A class session's runs submitted a minute (``troupe/web/quotas.py``): what leaves the window,
what a refusal says, and when it says to try again."""

from __future__ import annotations

from collections import deque

import pytest

from troupe.protocol.errors import QuotaExceeded
from troupe.web.quotas import RATE, _check_rate, quotas_from

LOAD = {"running": 0, "waiting": 0, "memory_mib": 0}


def test_what_left_the_last_minute_no_longer_counts():
    submitted = deque([0.0, 10.0, 20.0])
    _check_rate({RATE: 3}, LOAD, submitted, 1, now=60.5)  # the one at 0.0 has left the window
    assert list(submitted) == [10.0, 20.0]


def test_a_refusal_says_when_enough_have_left_for_all_it_asks():
    submitted = deque([0.0, 10.0, 20.0, 30.0])
    with pytest.raises(QuotaExceeded) as refused:
        _check_rate({RATE: 4}, LOAD, submitted, 2, now=40.0)  # two must leave: the second goes at 70
    assert refused.value.retry_after_s == 30
    assert refused.value.details == {"running": 0, "waiting": 0, "asked": 2, "limit": RATE,
                                     "submitted_last_minute": 4, RATE: 4, "retry_after_s": 30}
    assert list(submitted) == [0.0, 10.0, 20.0, 30.0]  # a refusal adds nothing


def test_more_at_once_than_a_minute_allows_has_no_time_to_wait():
    with pytest.raises(QuotaExceeded) as refused:
        _check_rate({RATE: 4}, LOAD, deque(), 5, now=0.0)
    assert refused.value.retry_after_s is None and refused.value.details["retry_after_s"] is None
    assert "at once" in refused.value.message


def test_a_rate_of_zero_is_no_limit():
    assert quotas_from(None, None, None, 0) == {}
    assert quotas_from(1, None, None, 30) == {"max_running": 1, RATE: 30}
