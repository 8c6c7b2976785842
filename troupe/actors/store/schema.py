"""The database schema and its forward migrations, applied in order at open.

``PRAGMA user_version`` holds how many migrations have run; a database from a newer
troupe (a higher version than we know) is refused rather than guessed at.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import apsw

from troupe.actors.store.logged import SCHEMA as LOGGED_SCHEMA
from troupe.actors.store.run_index import fill as fill_run_index
from troupe.actors.store.run_index import fill_logged, mark_booleans

log = logging.getLogger("troupe.store")

# A migration is SQL, or a function of the connection where rows must be read and
# rewritten (run 23 parses each stored graph).
MIGRATIONS: tuple[str | Callable[[apsw.Connection], None], ...] = (
    # 1: runs, their events, metrics, artifacts and recorded outputs.
    """
    CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        name TEXT,
        status TEXT NOT NULL,
        device TEXT NOT NULL,
        queue_key TEXT NOT NULL,
        lane TEXT NOT NULL,
        editor_session TEXT,
        seed INTEGER,
        deterministic INTEGER NOT NULL DEFAULT 0,
        record_outputs INTEGER NOT NULL DEFAULT 0,
        graph TEXT NOT NULL,
        options TEXT NOT NULL,
        warnings TEXT NOT NULL DEFAULT '[]',
        enqueue_seq INTEGER NOT NULL UNIQUE,
        created_at TEXT NOT NULL,
        started_at TEXT,
        finished_at TEXT,
        error TEXT,
        error_detail TEXT,
        sweep_id TEXT,
        sweep_variant INTEGER,
        study_id TEXT
    );
    CREATE INDEX runs_queue ON runs(queue_key, status, enqueue_seq);
    CREATE INDEX runs_status ON runs(status, enqueue_seq);
    CREATE TABLE events (
        run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        type TEXT NOT NULL,
        ts TEXT NOT NULL,
        node_id TEXT,
        payload TEXT NOT NULL,
        PRIMARY KEY (run_id, seq)
    ) WITHOUT ROWID;
    CREATE TABLE metrics (
        run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        series TEXT NOT NULL,
        step INTEGER NOT NULL,
        value REAL NOT NULL,
        ts TEXT NOT NULL,
        seq INTEGER NOT NULL,
        PRIMARY KEY (run_id, seq)
    ) WITHOUT ROWID;
    CREATE INDEX metrics_series ON metrics(run_id, series, seq);
    CREATE TABLE artifacts (
        run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        node_id TEXT,
        kind TEXT NOT NULL,
        path TEXT NOT NULL,
        created_at TEXT NOT NULL
    );
    CREATE INDEX artifacts_run ON artifacts(run_id);
    CREATE TABLE recorded_outputs (
        run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        node_id TEXT NOT NULL,
        outputs TEXT NOT NULL,
        PRIMARY KEY (run_id, node_id)
    ) WITHOUT ROWID;
    """,
    # 2: sweeps and their variants. A variant keeps its objective and final metrics, so
    # results outlive the runs (deleted or pruned).
    """
    CREATE TABLE sweeps (
        id TEXT PRIMARY KEY,
        name TEXT,
        state TEXT NOT NULL,
        spec TEXT NOT NULL,
        objective TEXT NOT NULL,
        domains TEXT NOT NULL,
        total INTEGER NOT NULL,
        created_at TEXT NOT NULL
    );
    CREATE TABLE sweep_variants (
        sweep_id TEXT NOT NULL REFERENCES sweeps(id) ON DELETE CASCADE,
        idx INTEGER NOT NULL,
        run_id TEXT NOT NULL,
        params TEXT NOT NULL,
        seed INTEGER,
        status TEXT,
        objective_value REAL,
        final_metrics TEXT,
        PRIMARY KEY (sweep_id, idx)
    ) WITHOUT ROWID;
    CREATE INDEX sweep_variants_run ON sweep_variants(run_id);
    CREATE INDEX runs_sweep ON runs(sweep_id);
    """,
    # 3: studies and their attempts. An attempt row is written with its run, in one
    # transaction, and keeps the run's outcome when the run is gone.
    """
    CREATE TABLE studies (
        id TEXT PRIMARY KEY,
        name TEXT,
        state TEXT NOT NULL,
        halt_reason TEXT,
        spec TEXT NOT NULL,
        budget TEXT NOT NULL,
        active_seconds REAL NOT NULL DEFAULT 0,
        plugin_id TEXT,
        created_at TEXT NOT NULL
    );
    CREATE TABLE study_attempts (
        study_id TEXT NOT NULL REFERENCES studies(id) ON DELETE CASCADE,
        variant INTEGER NOT NULL,
        repeat INTEGER NOT NULL,
        attempt INTEGER NOT NULL,
        run_id TEXT NOT NULL,
        status TEXT,
        objective_value REAL,
        PRIMARY KEY (study_id, attempt)
    ) WITHOUT ROWID;
    CREATE INDEX study_attempts_run ON study_attempts(run_id);
    """,
    # 4: jobs that plugins own (a study, today), idempotent per plugin and key.
    """
    CREATE TABLE plugin_jobs (
        id TEXT PRIMARY KEY,
        plugin_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        idempotency_key TEXT NOT NULL,
        spec_digest TEXT NOT NULL,
        study_id TEXT REFERENCES studies(id),
        created_at TEXT NOT NULL,
        UNIQUE (plugin_id, idempotency_key)
    );
    """,
    # 5: worker enrollment: one-time tokens and per-worker credentials, hashes only.
    """
    CREATE TABLE enrollments (
        token_hash TEXT PRIMARY KEY,
        name TEXT,
        expires_at REAL NOT NULL,
        uses_left INTEGER NOT NULL,
        revoked INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL
    );
    CREATE TABLE workers (
        name TEXT PRIMARY KEY,
        credential_hash TEXT NOT NULL UNIQUE,
        machine_id TEXT NOT NULL,
        revoked INTEGER NOT NULL DEFAULT 0,
        enrolled_at TEXT NOT NULL
    );
    """,
    # 6: the worker a run executes on (null: in-process).
    """
    ALTER TABLE runs ADD COLUMN worker TEXT;
    """,
    # 7: adoption after a restart: the (provider, physical device) slots a worker run
    # holds, the highest frame counter of its worker applied (replay dedup), and facts
    # about the server itself (a stop that kept queued runs for the next start).
    """
    ALTER TABLE runs ADD COLUMN holds TEXT;
    ALTER TABLE runs ADD COLUMN worker_counter INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE server_state (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    """,
    # 8: non-finite metric points are data: value NULL and what it was ("nan", "inf",
    # "-inf") in non_finite.
    """
    CREATE TABLE metrics_new (
        run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        series TEXT NOT NULL,
        step INTEGER NOT NULL,
        value REAL,
        non_finite TEXT,
        ts TEXT NOT NULL,
        seq INTEGER NOT NULL,
        PRIMARY KEY (run_id, seq)
    ) WITHOUT ROWID;
    INSERT INTO metrics_new(run_id, series, step, value, ts, seq) SELECT run_id, series, step, value, ts, seq
        FROM metrics;
    DROP TABLE metrics;
    ALTER TABLE metrics_new RENAME TO metrics;
    CREATE INDEX metrics_series ON metrics(run_id, series, seq);
    """,
    # 9: shared cards. A card's policy (by NVML UUID), a run's memory budget and the peak
    # it measured, and the last peak of each graph on each number of cards, which
    # outlives the runs (retention) as the next run's budget.
    """
    ALTER TABLE runs ADD COLUMN graph_digest TEXT;
    ALTER TABLE runs ADD COLUMN memory_budget_mib INTEGER;
    ALTER TABLE runs ADD COLUMN memory_budget_source TEXT;
    ALTER TABLE runs ADD COLUMN peak_memory_mib INTEGER;
    ALTER TABLE runs ADD COLUMN peak_memory_exact INTEGER;
    ALTER TABLE runs ADD COLUMN out_of_memory INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE card_policies (
        uuid TEXT PRIMARY KEY,
        sharing TEXT NOT NULL,
        reserved_mib INTEGER NOT NULL,
        updated_at TEXT NOT NULL
    );
    CREATE TABLE memory_peaks (
        graph_digest TEXT NOT NULL,
        cards INTEGER NOT NULL,
        peak_mib INTEGER NOT NULL,
        failed_budget_mib INTEGER,
        measured_at TEXT NOT NULL,
        PRIMARY KEY (graph_digest, cards)
    ) WITHOUT ROWID;
    """,
    # 10: flavors, four of them seeded here: a migration runs once for a database, so a
    # flavor somebody deleted is never put back.
    """
    CREATE TABLE flavors (
        name TEXT PRIMARY KEY,
        cpus INTEGER,
        gpus INTEGER,
        memory_gib REAL,
        ram INTEGER,
        duration_s REAL,
        description TEXT NOT NULL DEFAULT '',
        updated_at TEXT NOT NULL
    );
    INSERT INTO flavors(name, cpus, gpus, memory_gib, ram, duration_s, description, updated_at) VALUES
        ('cpu-small', 1, 0, NULL, 2048, NULL, 'one core and 2 GB: data preparation', '1970-01-01T00:00:00Z'),
        ('cpu-large', 4, 0, NULL, 8192, NULL, 'four cores and 8 GB: CPU training', '1970-01-01T00:00:00Z'),
        ('gpu-small', 2, 1, 6, 8192, NULL, 'one card, a 6 GiB budget where it is shared', '1970-01-01T00:00:00Z'),
        ('gpu-large', 4, 1, 20, 32768, NULL, 'one card, a 20 GiB budget where it is shared', '1970-01-01T00:00:00Z');
    """,
    # 11: a run for a one-shot agent (a batch job's), which waits for one only so long,
    # and how long a run is expected to take (a batch job that ends sooner is not sent it).
    """
    ALTER TABLE runs ADD COLUMN one_shot INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE runs ADD COLUMN duration_s REAL;
    """,
    # 12: what executed a run (the environment fingerprint, schema 2), from the process that
    # did; and uploaded files (their bytes live under TROUPE_HOME/files, named by id).
    """
    ALTER TABLE runs ADD COLUMN execution_facts TEXT;
    CREATE TABLE files (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        size INTEGER NOT NULL,
        sha256 TEXT NOT NULL,
        created_at TEXT NOT NULL
    );
    """,
    # 13: an artifact says where its bytes live (backend local, mount, transfer or s3; the
    # mount label or the bucket) with its size and sha256, and has an id of its own. A row
    # is written only once the whole file is stored. Rows of earlier versions keep their
    # absolute path, backend NULL.
    """
    CREATE TABLE artifacts_13 (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        node_id TEXT,
        kind TEXT NOT NULL,
        path TEXT NOT NULL,
        backend TEXT,
        label TEXT,
        size INTEGER,
        sha256 TEXT,
        created_at TEXT NOT NULL
    );
    INSERT INTO artifacts_13(run_id, node_id, kind, path, created_at)
        SELECT run_id, node_id, kind, path, created_at FROM artifacts ORDER BY rowid;
    DROP TABLE artifacts;
    ALTER TABLE artifacts_13 RENAME TO artifacts;
    CREATE INDEX artifacts_run ON artifacts(run_id);
    """,
    # 14: the runs of a sweep or a study share their base graph, stored once by digest;
    # such a run's graph column holds only its params ("node.param" -> value).
    """
    CREATE TABLE graph_bases (digest TEXT PRIMARY KEY, graph TEXT NOT NULL) WITHOUT ROWID;
    ALTER TABLE runs ADD COLUMN graph_base TEXT;
    CREATE INDEX runs_graph_base ON runs(graph_base) WHERE graph_base IS NOT NULL;
    """,
    # 15: a run made again from another (rerun_of), and one that continues another's
    # training from a checkpoint (resumed_from: {run_id, artifact_id, epoch, sha256, nodes}).
    """
    ALTER TABLE runs ADD COLUMN rerun_of TEXT;
    ALTER TABLE runs ADD COLUMN resumed_from TEXT;
    CREATE INDEX runs_rerun_of ON runs(rerun_of) WHERE rerun_of IS NOT NULL;
    """,
    # 16: an artifact's state: pending (kept in a worker's outbox, on its way), stored, or
    # failed (with the reason); rows from before are stored.
    """
    ALTER TABLE artifacts ADD COLUMN state TEXT NOT NULL DEFAULT 'stored';
    ALTER TABLE artifacts ADD COLUMN reason TEXT;
    """,
    # 17: a training run's progress, {"epoch", "epochs"}, from the metrics it reports.
    """
    ALTER TABLE runs ADD COLUMN progress TEXT;
    """,
    # 18: login links good for N uses until they expire, and the sessions they opened
    # (teacher, class or read), by the sha256 of their secrets; when a spent one-shot
    # worker's agent exited (it leaves the Workers list until it connects again).
    """
    ALTER TABLE workers ADD COLUMN exited_at TEXT;
    CREATE TABLE login_links (
        token_hash TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        uses_left INTEGER NOT NULL,
        expires_at REAL NOT NULL,
        created_at TEXT NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        secret_hash TEXT NOT NULL UNIQUE,
        kind TEXT NOT NULL,
        label TEXT NOT NULL DEFAULT '',
        created_at TEXT NOT NULL,
        last_seen_at TEXT NOT NULL,
        revoked INTEGER NOT NULL DEFAULT 0
    ) WITHOUT ROWID;
    """,
    # 19: a run's note and its tags, which the list filters by.
    """
    ALTER TABLE runs ADD COLUMN note TEXT;
    CREATE TABLE run_tags (
        run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        tag TEXT NOT NULL,
        PRIMARY KEY (run_id, tag)
    ) WITHOUT ROWID;
    CREATE INDEX run_tags_tag ON run_tags(tag, run_id);
    CREATE INDEX runs_study ON runs(study_id);
    """,
    # 20: a session ends when its link said (or a setting's maximum), and with its link
    # when that is revoked; a link can be revoked.
    """
    ALTER TABLE sessions ADD COLUMN expires_at REAL;
    ALTER TABLE sessions ADD COLUMN link_id TEXT;
    ALTER TABLE login_links ADD COLUMN revoked INTEGER NOT NULL DEFAULT 0;
    """,
    # 21: who submitted each run (a session's id, or "server" for the server's token),
    # for fair order and quotas; the limits a class link gives the sessions it opens
    # (JSON: max_running, max_waiting, max_memory_mib), copied onto each session.
    """
    ALTER TABLE runs ADD COLUMN submitted_by TEXT;
    CREATE INDEX runs_submitter ON runs(submitted_by, status) WHERE submitted_by IS NOT NULL;
    ALTER TABLE login_links ADD COLUMN quotas TEXT;
    ALTER TABLE sessions ADD COLUMN quotas TEXT;
    """,
    # 22: most runs belong to no sweep and no study; their rows no longer each hold an
    # entry (a page written with every run's insert) in these two indexes, which every
    # query reads only by an id (``sweep_id = ?`` implies it is not null).
    """
    DROP INDEX runs_sweep;
    CREATE INDEX runs_sweep ON runs(sweep_id) WHERE sweep_id IS NOT NULL;
    DROP INDEX runs_study;
    CREATE INDEX runs_study ON runs(study_id) WHERE study_id IS NOT NULL;
    """,
    # 23: the index ``where`` reads (troupe/actors/store/run_index.py): each run's scalar params
    # and node types, each series' newest, lowest and highest value, the keys with their
    # counts; filled here from the runs already stored.
    fill_run_index,
    # 24: the params and tags a run's script logged (MLflow's log_param, set_tag):
    # troupe/actors/store/logged.py.
    LOGGED_SCHEMA,
    # 25: who started each sweep (a session's id, or "server"), as its runs record it:
    # a class session cancels only its own sweeps. An older sweep takes its runs'
    # submitter; one with none left has none (the teacher's).
    """
    ALTER TABLE sweeps ADD COLUMN submitted_by TEXT;
    UPDATE sweeps SET submitted_by = (SELECT r.submitted_by FROM sweep_variants v JOIN runs r ON r.id = v.run_id
                                      WHERE v.sweep_id = sweeps.id AND r.submitted_by IS NOT NULL LIMIT 1);
    """,
    # 26: who uploaded each file (a session's id, or "server"), as runs record their
    # submitter: a class session deletes only its own uploads. A file stored before has
    # none (the teacher's).
    """
    ALTER TABLE files ADD COLUMN uploaded_by TEXT;
    """,
    # 27: a queued run's place (``runs._POSITION``: the queued-lane runs queued ahead on
    # its key, counted for each POST's reply, each stream's start and each listed queued
    # run) reads this index alone: with the lane in it, no run ahead is looked up in the
    # table (a place behind 3,000 queued runs: 1.4 -> 0.3 ms). It serves every read the
    # index it replaces served (a key's queued runs in order).
    """
    DROP INDEX runs_queue;
    CREATE INDEX runs_queue ON runs(queue_key, status, lane, enqueue_seq);
    """,
    # 28: which indexed params are booleans (run_params.boolean), so that the Runs list
    # reads its rows' params from the run index as they were given (true, not 1) instead
    # of decoding each row's graph (run_index.params_of).
    mark_booleans,
    # 29: how many runs each submitter has stored ('' for runs stored without one), kept
    # by the runs' own inserts and deletes: retention's pass reads who is over the limit
    # from it instead of counting every stored run after each run's end (33 ms of the
    # store's thread at 1,000,000 runs).
    """
    CREATE TABLE submitter_runs (submitted_by TEXT NOT NULL PRIMARY KEY, runs INTEGER NOT NULL) WITHOUT ROWID;
    INSERT INTO submitter_runs SELECT COALESCE(submitted_by, ''), COUNT(*) FROM runs GROUP BY 1;
    CREATE TRIGGER runs_counted AFTER INSERT ON runs BEGIN
        INSERT INTO submitter_runs VALUES (COALESCE(NEW.submitted_by, ''), 1)
            ON CONFLICT(submitted_by) DO UPDATE SET runs = runs + 1;
    END;
    CREATE TRIGGER runs_uncounted AFTER DELETE ON runs BEGIN
        UPDATE submitter_runs SET runs = runs - 1 WHERE submitted_by = COALESCE(OLD.submitted_by, '');
    END;
    CREATE TRIGGER runs_recounted AFTER UPDATE OF submitted_by ON runs
        WHEN COALESCE(OLD.submitted_by, '') != COALESCE(NEW.submitted_by, '') BEGIN
        UPDATE submitter_runs SET runs = runs - 1 WHERE submitted_by = COALESCE(OLD.submitted_by, '');
        INSERT INTO submitter_runs VALUES (COALESCE(NEW.submitted_by, ''), 1)
            ON CONFLICT(submitted_by) DO UPDATE SET runs = runs + 1;
    END;
    """,
    # 30: the params runs' scripts logged (schema 24) in the run index, where
    # ``params.NAME`` reads them (troupe/actors/store/run_index.py).
    fill_logged,
)

SCHEMA_VERSION = len(MIGRATIONS)


class _QuietConstraints(logging.Filter):
    """apsw hands SQLite's own log to the root logger, where a failed constraint, a
    damaged page or a file that is no database (each of which the store answers and logs
    in its own words, and a refused start says in one line) were more lines per error."""

    def filter(self, record: logging.LogRecord) -> bool:
        code = getattr(record, "sqlite_code", None)
        return not (isinstance(code, int) and code & 0xFF in _SAID_IN_OUR_WORDS)


_SAID_IN_OUR_WORDS = frozenset({apsw.SQLITE_CONSTRAINT, apsw.SQLITE_CORRUPT, apsw.SQLITE_NOTADB})


def open_database(path: Path) -> apsw.Connection:
    """Opens (creating if needed) and migrates the database."""
    root = logging.getLogger()
    if not any(isinstance(f, _QuietConstraints) for f in root.filters):
        root.addFilter(_QuietConstraints())
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = apsw.Connection(str(path))
    conn.execute("PRAGMA synchronous=NORMAL")
    version = int(conn.execute("PRAGMA user_version").fetchall()[0][0])  # type: ignore[arg-type]  # apsw types a cell as any SQLite value; user_version is an integer
    if version > SCHEMA_VERSION:
        raise RuntimeError(f"{path} has schema version {version}; this troupe knows up to {SCHEMA_VERSION}")
    for number in range(version, SCHEMA_VERSION):
        conn.execute("BEGIN IMMEDIATE")
        try:
            step = MIGRATIONS[number]
            if callable(step):
                step(conn)
            else:
                conn.execute(step)
            conn.execute(f"PRAGMA user_version={number + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        log.info("migrated %s to schema version %d", path, number + 1)
    return conn


def check_writable(path: Path) -> None:
    """Opens and migrates the database, then writes a row and takes it back: what a
    server needs of it, found out before anything starts (a read-only file, another
    program's lock, a file that is not a database, one from a newer troupe)."""
    conn = open_database(path)
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:  # a read-only file is found at the first statement that writes, not at BEGIN
            conn.execute("INSERT OR REPLACE INTO server_state(key, value) VALUES ('write_check', '1')")
        finally:
            conn.execute("ROLLBACK")
    finally:
        conn.close()
