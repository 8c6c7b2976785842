"""The store: schema version, batched ordered writes, retention, recovery. Every test
that takes the ``store`` fixture runs twice: with every batch committed by the store's
thread, and with the small batches of a run's writes committed on the loop."""

from __future__ import annotations

import asyncio

import apsw
import pytest

from tests.unit.stand_ins import run_record, store_run
from troupe.actors.errors import CheckpointGone, RunNeeded, RunNotFound, RunStillActive
from troupe.actors.store import StoreActor, StoreClient
from troupe.actors.store.events import AppendEvents, GetEvents
from troupe.actors.store.memory import LastPeak
from troupe.actors.store.retention import Prune, Pruned
from troupe.actors.store.run_list import EditRun, ListRuns
from troupe.actors.store.runs import DeleteRun, GetRun, ReadStream, Recover, UpdateRun, insert_run
from troupe.actors.store.schema import MIGRATIONS, SCHEMA_VERSION, open_database
from troupe.actors.store.studies import CreateStudy, GetStudy, UpdateStudy
from troupe.actors.store.workers import ListWorkers
from troupe.actors.store.writer import Writer
from troupe.actors.threaded import start_thread_actor


def run_id(seq):
    return f"{seq:032x}"


def insert(store, seq, status="succeeded", **later):
    return store_run(store, run_record(run_id(seq), seq), status, **later)


@pytest.fixture
async def client_of(tmp_path):
    """Makes a client and its store (``on_loop``: small batches of a run's writes are
    committed on the loop); stops them at the end, whatever the test did."""
    made = []

    def make(on_loop, **kwargs):
        db, runs = tmp_path / "db", tmp_path / "runs"
        made.append(StoreClient(start_thread_actor(StoreActor, "store", db, runs),
                                open_inline=(lambda: Writer.open(db, runs)) if on_loop else None, **kwargs))
        return made[-1]

    yield make
    for client in made:
        client.close()
        await client.ref.stop()


@pytest.fixture(params=["thread", "loop"])
async def store(client_of, request):
    committed = []
    client = client_of(request.param == "loop", on_committed=lambda writes: committed.extend(op for op, _ in writes))
    client.committed = committed
    return client


def test_the_schema_version_is_kept_in_user_version(tmp_path):
    conn = open_database(tmp_path / "db")
    assert conn.execute("PRAGMA user_version").fetchall()[0][0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchall()[0][0] == "wal"
    assert conn.execute("PRAGMA foreign_keys").fetchall()[0][0] == 1
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(RuntimeError, match="schema version"):
        open_database(tmp_path / "db")


def test_a_database_of_version_21_keeps_only_grouped_runs_in_the_sweep_and_study_indexes(tmp_path):
    conn = apsw.Connection(str(tmp_path / "db"))
    for number in range(21):
        conn.execute(MIGRATIONS[number])
    conn.execute("PRAGMA user_version=21")
    insert_run(conn, run_record(run_id(1), 1, sweep_id="s1"))
    insert_run(conn, run_record(run_id(2), 2, study_id="t1"))
    insert_run(conn, run_record(run_id(3), 3))
    conn.close()
    conn = open_database(tmp_path / "db")
    assert conn.execute("PRAGMA user_version").fetchall()[0][0] == SCHEMA_VERSION
    for column, index, key in (("sweep_id", "runs_sweep", "s1"), ("study_id", "runs_study", "t1")):
        plan = str(conn.execute(f"EXPLAIN QUERY PLAN SELECT id FROM runs WHERE {column} = ?", (key,)).fetchall())
        assert f"USING INDEX {index}" in plan
        assert conn.execute(f"SELECT id FROM runs WHERE {column} = ?", (key,)).fetchall() == [
            (run_id(1 if column == "sweep_id" else 2),)]
        # A partial index: no null entry for every run outside a group.
        (sql,), = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (index,)).fetchall()
        assert str(sql).endswith(f"WHERE {column} IS NOT NULL")


async def test_writes_from_one_tick_commit_together_in_order(store):
    await insert(store, 1, "running")
    futures = [store.write(AppendEvents(run_id(1), ({"seq": i, "type": "log", "ts": "t", "payload": {"i": i}},)))
               for i in range(1, 201)]
    await asyncio.gather(*futures)
    events, cursor = await store.read(GetEvents(run_id(1)))
    assert [e["seq"] for e in events] == list(range(1, 201)) and cursor is None
    assert [op.events[0]["seq"] for op in store.committed if isinstance(op, AppendEvents)] == list(range(1, 201))
    # Appending a seq again is a no-op, so a retried write cannot duplicate.
    await store.write(AppendEvents(run_id(1), ({"seq": 5, "type": "log", "ts": "t", "payload": {"i": -1}},)))
    events, _ = await store.read(GetEvents(run_id(1)))
    assert len(events) == 200 and events[4]["payload"] == {"i": 5}


async def test_a_batch_takes_the_writes_of_each_turn_that_adds_to_it(client_of):
    """A burst (writes in turn after turn of the loop) is one commit; a write after the
    batch was taken starts the next."""
    batches: list[int] = []
    client = client_of(True, on_committed=lambda writes: batches.append(len(writes)))
    await insert(client, 1, "running")
    batches.clear()

    def event(seq: int) -> AppendEvents:
        return AppendEvents(run_id(1), ({"seq": seq, "type": "log", "ts": "t", "payload": {}},))

    client.write(event(1))
    for seq in (2, 3, 4):
        await asyncio.sleep(0)
        last = client.write(event(seq))
    await last
    await client.write(event(5))
    assert batches == [4, 1]


async def test_a_bad_op_fails_alone(store):
    good = insert(store, 1)
    bad = store.write(UpdateRun(run_id(1), {"no_such_column": 1}))
    also_good = insert(store, 2)
    await good
    with pytest.raises(ValueError):
        await bad
    await also_good
    runs, _ = await store.read(ListRuns())
    assert len(runs) == 2


async def test_delete_only_finished_runs(store):
    await insert(store, 1, "running")
    with pytest.raises(RunStillActive):
        await store.write(DeleteRun(run_id(1)))
    with pytest.raises(RunNotFound):
        await store.write(DeleteRun("f" * 32))


async def test_a_resume_and_the_run_it_resumes_from_are_never_parted(store):
    await insert(store, 1)
    resumed_from = {"epoch": 2, "node_id": "loop"}
    await store_run(store, run_record(run_id(2), 2, rerun_of=run_id(1), resumed_from=resumed_from))
    with pytest.raises(RunNeeded):  # its resume has not ended: the checkpoint is still to be read
        await store.write(DeleteRun(run_id(1)))
    assert await store.write(Prune(0)) == Pruned()  # retention keeps it for the same reason
    # A resume stored after its run was removed (pruned while the request was checked) is refused.
    await insert(store, 3)
    await store.write(DeleteRun(run_id(3)))
    with pytest.raises(CheckpointGone):
        await store_run(store, run_record(run_id(4), 4, rerun_of=run_id(3), resumed_from=resumed_from))
    assert await store.read(GetRun(run_id(4))) is None


@pytest.mark.parametrize("keep, survivors", [(-1, 6), (0, 1), (2, 2), (4, 4), (10, 6)])
async def test_retention_window_counts_active_runs_but_never_prunes_them(store, keep, survivors):
    for seq in range(1, 6):
        await insert(store, seq)
    await insert(store, 6, "running")  # newest, active
    pruned = await store.write(Prune(keep))
    left = [r["id"] for r in (await store.read(ListRuns(limit=100)))[0]]
    assert len(left) == survivors and run_id(6) in left
    assert len(pruned.run_ids) == 6 - survivors


async def test_retention_keeps_the_newest_runs_of_each_submitter_apart(store):
    # ann floods; the server's token and bob each ran one run before her, and one run of
    # hers is tagged keep: it is never pruned and takes no place in her window.
    await store_run(store, run_record(run_id(1), 1, submitted_by="server"), "succeeded")
    await store_run(store, run_record(run_id(2), 2, submitted_by="bob"), "succeeded")
    for seq in range(3, 13):
        await store_run(store, run_record(run_id(seq), seq, submitted_by="ann"), "succeeded")
    assert await store.write(EditRun(run_id(3), tags=("keep",)))
    pruned = await store.write(Prune(2))
    left = {r["id"] for r in (await store.read(ListRuns(limit=100)))[0]}
    assert left == {run_id(1), run_id(2), run_id(3), run_id(11), run_id(12)}
    assert sorted(pruned.run_ids) == [run_id(seq) for seq in range(4, 11)]
    assert pruned.by_submitter == (("ann", "session ann", 7),)
    assert await store.write(Prune(2)) == Pruned()  # nothing more: each is within its window


async def test_retention_reads_each_submitters_count_kept_by_the_runs_inserts_and_deletes(tmp_path, client_of):
    """A database of version 28 is counted by submitter once (schema 29); from then on the
    runs' inserts and deletes keep the counts, which is all a pass with nothing to prune
    reads: the newest run of each submitter stays, runs stored with none counted apart."""
    conn = apsw.Connection(str(tmp_path / "db"))
    for step in MIGRATIONS[:28]:
        step(conn) if callable(step) else conn.execute(step)
    conn.execute("PRAGMA user_version=28")
    for seq in range(1, 7):
        insert_run(conn, run_record(run_id(seq), seq, submitted_by="ann" if seq % 2 else None))
    conn.close()
    store = client_of(False)
    for seq in range(1, 7):
        await store.write(UpdateRun(run_id(seq), {"status": "succeeded"}))
    assert sorted((await store.write(Prune(1))).run_ids) == [run_id(seq) for seq in (1, 2, 3, 4)]
    for seq in (7, 8):
        await store_run(store, run_record(run_id(seq), seq, submitted_by="ann"), "succeeded")
    await store_run(store, run_record(run_id(9), 9, submitted_by="bob"), "succeeded")
    assert sorted((await store.write(Prune(1))).run_ids) == [run_id(5), run_id(7)]
    assert await store.write(Prune(1)) == Pruned()
    counts = apsw.Connection(str(tmp_path / "db")).execute("SELECT submitted_by, runs FROM submitter_runs").fetchall()
    assert sorted(counts) == [("", 1), ("ann", 1), ("bob", 1)]


async def test_recovery_interrupts_leftover_runs_with_a_terminal_event(store):
    await insert(store, 1, "running")
    await insert(store, 2, "queued")
    await insert(store, 3, "succeeded")
    await store.write(AppendEvents(run_id(1), ({"seq": 1, "type": "run_queued", "ts": "t", "payload": {}},)))
    recovered = (await store.write(Recover()))["interrupted"]
    assert sorted(recovered) == [run_id(1), run_id(2)]
    assert (await store.read(GetRun(run_id(1))))["status"] == "interrupted"
    events, _ = await store.read(GetEvents(run_id(1)))
    assert [e["seq"] for e in events] == [1, 2] and events[1]["payload"]["status"] == "interrupted"


async def test_recovery_adopts_worker_runs_and_keeps_queued_runs_when_asked(store):
    await insert(store, 1, "running", worker="gpu-a", holds=[["gpu-a", "GPU-1"]])
    await insert(store, 2, "queued")
    await insert(store, 3, "running")
    await store.write(AppendEvents(run_id(1), ({"seq": 1, "type": "run_queued", "ts": "t", "payload": {}},), 7))
    found = await store.write(Recover(keep_queued=True))
    assert found["interrupted"] == [run_id(3)]
    assert [r["id"] for r in found["queued"]] == [run_id(2)]
    [adopted] = found["adopted"]
    assert adopted["id"] == run_id(1) and adopted["next_seq"] == 2 and adopted["worker_counter"] == 7
    assert adopted["holds"] == [["gpu-a", "GPU-1"]]


async def test_one_op_that_raises_anything_fails_alone_in_its_batch(store):
    await insert(store, 1, "running")
    await insert(store, 2, "running")
    huge = {"seq": 1, "type": "metric", "ts": "t", "payload": {"name": "loss", "step": 2**63, "value": 1.0}}
    fine = {"seq": 1, "type": "log", "ts": "t", "payload": {"message": "kept"}}
    # Written together: one batch, one transaction.
    bad, good = store.write(AppendEvents(run_id(1), (huge,))), store.write(AppendEvents(run_id(2), (fine,)))
    with pytest.raises(OverflowError):
        await bad
    await good
    events, _ = await store.read(GetEvents(run_id(2)))
    assert [e["payload"] for e in events] == [{"message": "kept"}]


@pytest.mark.parametrize("on_loop", [False, True])
async def test_a_removed_database_file_breaks_the_store(tmp_path, client_of, on_loop):
    client = client_of(on_loop)
    await insert(client, 1)
    await insert(client, 2)  # on the loop, when it may
    (tmp_path / "db").unlink()
    with pytest.raises(Exception, match="removed or replaced"):
        await insert(client, 3)
    exit_ = await asyncio.wait_for(client.ref.wait(), 5)
    assert exit_.reason == "broken" and isinstance(exit_.error, apsw.CantOpenError)


async def test_what_the_loop_commits_is_read_at_once_and_kept(tmp_path, client_of):
    client = client_of(True)
    await client.write(Recover(keep_queued=False))  # the thread's first commit: the file is migrated
    for seq in range(1, 301):  # a checkpoint is asked for on the way
        await insert(client, seq, "running")
        await client.write(AppendEvents(run_id(seq), ({"seq": 1, "type": "log", "ts": "t", "payload": {"n": seq}},)))
    events, _ = await client.read(GetEvents(run_id(300)))
    assert [e["payload"] for e in events] == [{"n": 300}]
    client.close()
    await client.ref.stop()
    conn = open_database(tmp_path / "db")
    assert conn.execute("SELECT COUNT(*) FROM events").fetchall()[0][0] == 300
    assert conn.execute("SELECT status FROM runs WHERE id = ?", (run_id(300),)).fetchall()[0][0] == "running"


async def test_a_runs_small_writes_commit_on_the_loop_and_larger_ones_need_the_stores_thread(tmp_path, client_of):
    client = client_of(True)
    await insert(client, 1, "running")  # the thread's first commit: the loop's connection may open
    await client.ref.stop()  # only the loop's own connection is left
    log = [{"seq": seq, "type": "log", "ts": "t", "payload": {"n": seq}} for seq in range(1, 66)]
    await client.write(AppendEvents(run_id(1), tuple(log[:32])))  # 32 rows: committed on the loop
    with pytest.raises(Exception, match="store"):
        await client.write(AppendEvents(run_id(1), tuple(log[32:])))  # 33: the thread's, and it is gone
    client.close()
    conn = open_database(tmp_path / "db")
    assert conn.execute("SELECT MAX(seq), COUNT(*) FROM events").fetchall()[0] == (32, 32)


async def test_retention_asked_for_by_runs_ending_together_is_one_prune(client_of):
    committed, marked = [], asyncio.Event()

    def seen(writes):
        committed.extend(writes)
        if any(op == Prune(5) for op, _ in writes):
            marked.set()

    client = client_of(True, on_committed=seen)
    for seq in range(1, 4):
        await insert(client, seq)
    for _ in range(3):  # three runs end within the delay
        client.write_soon(Prune(1), 0.05)
    client.write_soon(Prune(5), 0.06)  # a marker due after any of them
    await asyncio.wait_for(marked.wait(), 5)
    assert [(op, result.run_ids) for op, result in committed if isinstance(op, Prune)] == [
        (Prune(1), (run_id(1), run_id(2))), (Prune(5), ())]


async def test_the_run_list_is_read_on_the_loop_and_a_search_needs_the_stores_thread(tmp_path, client_of):
    """A bounded read (the newest runs, the workers, a graph's last peak) is answered on
    the loop's connection; a search, which may walk every run, goes to the thread."""
    client = client_of(True)
    for seq in (1, 2):
        await insert(client, seq)  # the thread's first commit: the loop's connection may open
    await client.ref.stop()  # only the loop's own connection is left
    runs, _ = await client.read(ListRuns(limit=1))
    assert [run["id"] for run in runs] == [run_id(2)]
    assert await client.read(LastPeak("no-such-graph", 1)) is None
    assert await client.read(ListWorkers()) == []
    with pytest.raises(Exception, match="store"):
        await client.read(ListRuns(search="x"))
    client.close()


def _log(first, last, finished=True, payload="x"):
    kinds = ["log"] * (last - first + 1)
    if finished:
        kinds[-1] = "run_finished"
    return tuple({"seq": seq, "type": kind, "ts": f"t{seq}", "node_id": "a" if seq % 2 else None,
                  "payload": {"n": seq, "text": payload}}
                 for seq, kind in zip(range(first, last + 1), kinds, strict=True))


@pytest.mark.parametrize("on_loop", [False, True])
async def test_a_stream_read_right_after_a_runs_end_answers_what_the_database_holds(tmp_path, client_of, on_loop):
    """A run's log is followed from its first event as it is committed, and a stream's
    first page of it, once it has ended, is what the database would answer for any
    ``after``: also for a log too long to follow, a worker's frames, a log that did not
    start at 1, a run restored after a restart, and a run deleted since."""
    client = client_of(on_loop)
    runs = {1: [_log(1, 1, False), _log(2, 12)],  # a quick run: queued, then the rest
            2: [_log(1, 3, False), _log(4, 40, payload="y" * 600)],  # longer than a page
            3: [_log(1, 5)],  # a worker's run (a frame counter)
            4: [_log(2, 6)],  # its first events were never written (not followed)
            5: [_log(1, 4, False)],  # still running
            6: [_log(1, 1, False), _log(2, 5)]}  # another quick run
    for seq, writes in runs.items():
        await insert(client, seq, "running")
        for events in writes:
            client.write(AppendEvents(run_id(seq), events, counter=7 if seq == 3 else None))
        await client.write(UpdateRun(run_id(seq), {"status": "succeeded" if seq != 5 else "running"}))
    await insert(client, 7, "running")
    await client.write(AppendEvents(run_id(7), _log(1, 1, False)))
    client.close()  # the server starts again, and run 7 is restored from its row: its log starts again at 1
    await client.write(AppendEvents(run_id(7), ({**_log(1, 1, False)[0], "ts": "again"}, *_log(2, 3))))
    runs[7] = []
    database = Writer.open(tmp_path / "db", tmp_path / "runs")
    try:
        for seq in runs:
            for after in (0, 1, 3, 12, 13, 40):
                query = ReadStream(run_id(seq), after=after, cap_bytes=16 * 1024)
                assert await client.read(query) == database.read(query), (seq, after)
        client.write(AppendEvents(run_id(1), _log(13, 13, False)))  # an event after its end
        await client.write(DeleteRun(run_id(6)))
        for seq in (1, 6):
            query = ReadStream(run_id(seq), after=0, cap_bytes=16 * 1024)
            assert await client.read(query) == database.read(query)
        assert await client.read(ReadStream(run_id(6), cap_bytes=16 * 1024)) is None
    finally:
        database.close()


async def test_a_study_state_written_from_given_states_changes_nothing_from_another(store):
    """A cancel and the study's own halt (or a resume) can cross: the one committed first
    wins, the other changes nothing and says so."""
    study_id = "5" * 32
    spec = {"objective": {"metric": "loss", "direction": "minimize"}}
    await store.write(CreateStudy({"id": study_id, "name": "s", "state": "running", "spec": spec, "budget": {},
                                   "created_at": "2026-12-07T00:00:00Z"}))
    assert await store.write(UpdateStudy(study_id, {"state": "cancelled"}, ("running", "halted"))) is True
    assert await store.write(UpdateStudy(study_id, {"state": "halted", "halt_reason": "x"}, ("running",))) is False
    assert await store.write(UpdateStudy(study_id, {"state": "running"}, ("halted", "running", "failed"))) is False
    assert await store.write(UpdateStudy(study_id, {"state": "cancelled"}, ("running", "halted"))) is False
    study = await store.read(GetStudy(study_id))
    assert (study["state"], study["halt_reason"]) == ("cancelled", None)
