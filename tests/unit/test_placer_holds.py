"""The placer's record of held slots answers by run and by device alike (a fresh ledger
learns its holders from it), through every change a run's slots go through."""

from __future__ import annotations

from troupe.actors.placer.holds import Holds


def test_a_devices_holders_follow_every_change_of_the_runs_slots():
    holds = Holds()
    holds.add("r1", "w1", "w1/cuda:0")
    holds.add("r1", "w1", "w1/cuda:0")  # said twice: held once
    holds.add("r1", "w1", "w1/cuda:1")
    holds.add("r2", "local", "cpu@m")
    holds.add("r3", "w1", "w1/cuda:0")
    assert holds.on("w1/cuda:0") == ("r1", "r3")
    assert holds["r1"] == [("w1", "w1/cuda:0"), ("w1", "w1/cuda:1")]
    assert "r2" in holds and "r9" not in holds and holds.get("r9") == []

    assert holds.pop("r1") == [("w1", "w1/cuda:0"), ("w1", "w1/cuda:1")]
    assert holds.on("w1/cuda:0") == ("r3",) and holds.on("w1/cuda:1") == ()
    assert holds.pop("r1") == []

    holds.set("r3", [("w2", "w2/cuda:0")])  # adopted again, elsewhere: it left w1's card
    assert holds.on("w1/cuda:0") == () and holds.on("w2/cuda:0") == ("r3",)
    holds.set("r4", ())  # adopted with no slot: still a run the placer holds for
    assert "r4" in holds and holds["r4"] == []
    assert sorted(map(tuple, holds.values())) == [(), (("local", "cpu@m"),), (("w2", "w2/cuda:0"),)]
