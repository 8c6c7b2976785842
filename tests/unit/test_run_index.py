"""The run index through the store's writer: a key whose making was rolled back with a
failed op is made again for the next run (the ids a connection keeps are only those a
committed transaction made), and a run's rows go with it; a param a script logged is a
key at its newest value."""

from __future__ import annotations

import pytest

from tests.unit.stand_ins import run_record
from troupe.actors.store.logged import RecordLogged
from troupe.actors.store.run_list import ListRuns, RunKeys
from troupe.actors.store.runs import DeleteRun, InsertRun, UpdateRun
from troupe.actors.store.writer import Writer
from troupe.protocol.errors import WhereUnknownKey
from troupe.protocol.where import key_text, parse


def _graph(value: float) -> dict:
    return {"nodes": [{"id": "z", "type": "core.Constant", "params": {"fresh": value}}], "edges": []}


def _found(writer: Writer, where: str) -> list[str]:
    return [row["id"] for row in writer.read(ListRuns(where=parse(where)))[0]]


def test_a_key_made_by_an_op_that_failed_alone_is_made_again(tmp_path):
    writer = Writer.open(tmp_path / "db", tmp_path / "runs")
    writer.conn.execute("INSERT INTO studies(id, name, state, spec, budget, created_at) "
                        "VALUES ('s', 's', 'running', '{}', '{}', 't')")
    attempt = {"study_id": "s", "variant": 0, "repeat": 0, "attempt": 0}
    first = writer.commit([InsertRun(run_record("a" * 32, 1), {**attempt, "run_id": "a" * 32})])
    assert not isinstance(first[0], Exception), first
    # One batch: the first op makes the key z.fresh, then fails (its attempt exists) and is
    # rolled back alone; the second names the same key.
    results = writer.commit([InsertRun(run_record("b" * 32, 2, graph=_graph(1)), {**attempt, "run_id": "b" * 32}),
                             InsertRun(run_record("c" * 32, 3, graph=_graph(2)))])
    assert isinstance(results[0], Exception) and not isinstance(results[1], Exception)
    assert _found(writer, "z.fresh = 2") == ["c" * 32]
    assert _found(writer, "z.fresh > 0") == ["c" * 32]
    assert {k["key"]: k["runs"] for k in writer.read(RunKeys())["keys"]}["z.fresh"] == 1
    # and the next run, read with the key's id kept, is counted too; a delete takes its rows
    writer.commit([InsertRun(run_record("d" * 32, 4, graph=_graph(3)))])
    assert _found(writer, "z.fresh >= 2") == ["d" * 32, "c" * 32]
    assert writer.commit([UpdateRun("c" * 32, {"status": "succeeded"}), DeleteRun("c" * 32)]) == [None, None]
    assert {k["key"]: k["runs"] for k in writer.read(RunKeys())["keys"]}["z.fresh"] == 1
    assert _found(writer, "z.fresh >= 2") == ["d" * 32]
    writer.close()


def test_a_logged_param_is_indexed_at_its_newest_value_and_goes_with_its_run(tmp_path):
    writer = Writer.open(tmp_path / "db", tmp_path / "runs")
    node_named_params = {"nodes": [{"id": "params", "type": "core.Constant", "params": {"lr": 5}}], "edges": []}
    writer.commit([InsertRun(run_record("a" * 32, 1, graph=node_named_params))])

    def counted() -> dict[str, int]:
        return {k["key"]: k["runs"] for k in writer.read(RunKeys())["keys"] if k["kind"] in ("logged", "param")}

    assert writer.commit([RecordLogged("a" * 32, {"lr": "0.1", "opt": "adam"}, {})]) == [None]
    assert _found(writer, "params.lr = 0.1") == ["a" * 32] and _found(writer, "params.lr < 1") == ["a" * 32]
    assert _found(writer, "`params.lr` = 5") == ["a" * 32]  # a node called params, quoted
    assert counted() == {"`params.lr`": 1, "params.lr": 1, "params.opt": 1}
    assert key_text("param", "params.lr") == "`params.lr`" and key_text("logged", "a b") == "params.`a b`"
    assert writer.commit([RecordLogged("a" * 32, {"lr": "0.2"}, {})]) == [None]  # logged again: its newest
    assert (_found(writer, "params.lr = 0.1"), _found(writer, "params.lr = 0.2")) == ([], ["a" * 32])
    assert counted()["params.lr"] == 1
    assert writer.commit([RecordLogged("a" * 32, {"opt": "x" * 500}, {})]) == [None]  # no filter value
    assert "params.opt" not in counted()
    with pytest.raises(WhereUnknownKey):  # no run has it now
        _found(writer, "params.opt ~ 'x'")
    assert writer.commit([UpdateRun("a" * 32, {"status": "succeeded"}), DeleteRun("a" * 32)]) == [None, None]
    assert counted() == {}
    writer.close()
