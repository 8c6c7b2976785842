"""Which card a process is on, read as CUDA reads it, without CUDA (issue 13, point 8)."""

from __future__ import annotations

import pytest

from troupe.subprocess_runner.devices import resolve_device, torch_device, visible_cards

CARDS = [(0, "GPU-0a1b"), (1, "GPU-77c2"), (2, "GPU-9f00"), (3, "GPU-9e11")]


@pytest.mark.parametrize("spec, shown", [
    (None, (0, 1, 2, 3)),          # unset: every card, in bus order
    ("", ()),                      # empty: none
    ("2,0", (2, 0)),               # CUDA's ordinal 0 is the first entry
    ("1, 3", (1, 3)),
    ("GPU-77c2,9f", (1, 2)),       # a UUID, or a unique prefix with or without GPU-
    ("9", ()),                     # a prefix shared by two cards names none: the list ends there
    ("3,7,1", (3,)),               # the list ends at the first card that does not exist
    ("2,2,1", (2,)),               # or at a repeat
    ("-1", ()),
])
def test_visible_cards_follow_cudas_rule(spec, shown):
    assert visible_cards(spec, CARDS) == shown


def test_plain_cuda_is_the_current_device_the_first_visible_card():
    available = tuple(f"cuda:{i}" for i in visible_cards("2,0", CARDS))
    assert resolve_device("cuda", available) == ("cuda:2", None)
    assert resolve_device("auto", available) == ("cuda:2", None)
    assert resolve_device("cuda:0", available) == ("cuda:0", None)
    device, warning = resolve_device("cuda:1", available)
    assert device == "cpu" and warning is not None and "cuda:1" in warning
    assert resolve_device("cuda", ()) == ("cpu", "device cuda is not available on this server; running on cpu")


def test_torch_names_a_card_by_its_place_among_the_visible_ones():
    assert torch_device("cuda:2", "2,0", CARDS) == "cuda:0"
    assert torch_device("cuda:0", "2,0", CARDS) == "cuda:1"
    assert torch_device("cuda:3", None, CARDS) == "cuda:3"
    assert torch_device("cuda:5", "2,0", CARDS) == "cuda:5"  # not a card here (simulated): kept
    assert torch_device("cpu", "2,0", CARDS) == "cpu"
