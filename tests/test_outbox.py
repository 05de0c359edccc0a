"""The outbox on its own: jobs, leases, settling, dead letters and checkpoints, on a connection.

SQLite and PostgreSQL; no store, no embedder.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from semantic_orm import outbox
from semantic_orm.exc import EmbeddingError, VectorStoreError
from semantic_orm.outbox import JobKey

from .helpers import jobs

K1, K2 = JobKey("article", "content", "1"), JobKey("article", "content", "2")


@pytest.fixture(params=["json", "expanding"])
def tables(
    engine: Engine, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Engine:
    """The outbox tables, with lists of keys and ids passed as the database reads them best
    (one JSON array) or, as on other databases and SQLite before 3.38, one value each."""
    if request.param == "expanding":
        monkeypatch.setattr(outbox, "_list_form", lambda conn, texts=(): None)
    with engine.begin() as conn:
        outbox.create_tables(conn)
    return engine


def test_enqueue_returns_the_jobs_and_leases_free_rows_only(tables: Engine) -> None:
    with tables.begin() as conn:
        (first,) = outbox.enqueue(conn, [K1], claimed_by="a", lease=60)
        assert first.claimed_by == "a" and first.key == K1
        born = outbox.enqueue(conn, [K1, K2], claimed_by="b", lease=60)
    # K1 is leased to "a": the new job waits, unclaimed; K2 was free
    assert [(j.key, j.claimed_by) for j in born] == [(K1, None), (K2, "b")]
    assert [j["id"] for j in jobs(tables)] == [first.id, *(j.id for j in born)]
    # born with no other job of its row (K2, and K1 at first) / beside one (K1 later)
    assert first.alone and [j.alone for j in born] == [False, True]


def test_enqueue_stores_every_key_as_given_whatever_its_characters(tables: Engine) -> None:
    """Keys of two columns, one given twice, one behind a live lease, pks that look like
    numbers or JSON or hold quotes and non-Latin text: each is stored as given, with its lease;
    one statement per column and lease state inserts them (the keys as one JSON array, not
    nine parameters a job)."""
    pks = ["1", "01", "1.0", "[1]", '"q"', "a'b", "日本語", "e\u0301", "\U0001f600", "\\n", " x "]
    keys = [JobKey("article", "content", pk) for pk in pks]
    other = JobKey("note", "body", "7")
    with tables.begin() as conn:
        (held,) = outbox.enqueue(conn, [keys[1]], claimed_by="other", lease=60)
    assert held.claimed_by == "other"
    statements: list[str] = []

    def record(conn: object, cursor: object, statement: str, *rest: object) -> None:
        statements.append(statement)

    now = outbox.utcnow()
    with tables.begin() as conn:
        sa.event.listen(conn, "before_cursor_execute", record)
        born = outbox.enqueue(conn, [*keys, other, keys[0]], claimed_by="me", lease=60, now=now)
    assert [j.key for j in born] == [*keys, other, keys[0]]
    assert len({j.id for j in born}) == len(born)
    assert born[0].id < born[-1].id  # a key given twice: its jobs in the order given
    assert [j.claimed_by for j in born] == ["me", None, *["me"] * (len(keys) - 2), "me", "me"]
    stored = {j["id"]: j for j in jobs(tables)}
    for job in born:
        row = stored[job.id]
        assert (row["table_name"], row["column_name"], row["row_pk"]) == tuple(job.key)
        assert row["claimed_by"] == job.claimed_by
        assert (row["attempts"], row["failures"], row["dead"]) == (0, 0, False)
        due = outbox.as_utc(row["next_attempt_at"])
        assert due == (now if job.key == keys[1] else now + dt.timedelta(seconds=60))
        assert outbox.as_utc(row["created_at"]) == now
    with tables.connect() as conn:
        as_json = outbox._list_form(conn) is not None
    if as_json:  # one insert a column, which looks at the leases too: every list as one
        # JSON array (PostgreSQL takes the rows' advisory locks first, a statement a column)
        reader = {"sqlite": "json_each", "postgresql": "json_array_elements_text"}
        inserts = [s for s in statements if "INSERT INTO" in s]
        locks = [s for s in statements if "pg_advisory_xact_lock" in s]
        assert len(inserts) == 2 and all(reader[tables.dialect.name] in s for s in inserts)
        assert len(locks) == (2 if tables.dialect.name == "postgresql" else 0)
        assert len(statements) == len(inserts) + len(locks)
    if tables.dialect.name == "sqlite":  # a NUL in a key (json_each would end it there)
        nul = [JobKey("article", "content", "a\x00b"), JobKey("article", "content", "a")]
        with tables.begin() as conn:
            made = outbox.enqueue(conn, nul, claimed_by="me", lease=60)
        stored = {j["id"]: j["row_pk"] for j in jobs(tables)}
        assert [stored[j.id] for j in made] == ["a\x00b", "a"]
        with tables.begin() as conn:
            assert outbox.settle_done(conn, made, token="me") == []
        assert not {j["row_pk"] for j in jobs(tables)} & {"a\x00b", "a"}


def test_a_job_born_alone_settles_in_one_statement_and_spares_newer_jobs(
    tables: Engine,
) -> None:
    with tables.begin() as conn:
        (mine,) = outbox.enqueue(conn, [K1], claimed_by="t", lease=60)
    with tables.begin() as conn:
        (newer,) = outbox.enqueue(conn, [K1])  # a later change of the row, for a worker
    statements: list[str] = []
    with tables.begin() as conn:
        sa.event.listen(conn, "before_cursor_execute", lambda *a: statements.append(a[2]))
        assert outbox.settle_done(conn, [mine], token="t") == []
    assert len(statements) == 1 and statements[0].startswith("DELETE")  # no lookup of older
    assert [j["id"] for j in jobs(tables)] == [newer.id]


@pytest.mark.parametrize("returning", [True, False], ids=["one-statement", "look-then-lease"])
def test_claim_takes_due_jobs_and_skips_rows_someone_is_syncing(
    tables: Engine, returning: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row's jobs wait while another processor's lease on one of them lives. The lease is
    taken with the look in one statement where an ``UPDATE`` returns rows; elsewhere (SQLite
    before 3.35) a look first."""
    monkeypatch.setattr(tables.dialect, "update_returning", returning)
    with tables.begin() as conn:
        outbox.enqueue(conn, [K1, K2])
        (taken,) = outbox.claim(conn, token="a", lease=60, limit=1)
    assert taken.key == K1
    with tables.begin() as conn:
        outbox.enqueue(conn, [K1])  # a newer change of the row "a" is syncing
        again = outbox.claim(conn, token="b", lease=60, limit=10)
    assert [j.key for j in again] == [K2]  # K1 waits until "a" settles, whoever asks
    with tables.begin() as conn:
        assert outbox.claim(conn, token="a", lease=60, limit=10) == []


def test_a_claimed_job_whose_row_has_no_older_one_settles_without_looking(
    tables: Engine,
) -> None:
    """The claim says which of its jobs supersede none (no older job of their row): settling
    them is one ``DELETE``; a job with an older one still deletes it with itself."""
    with tables.begin() as conn:
        (lone,) = outbox.enqueue(conn, [K1])
        older, newer = outbox.enqueue(conn, [K2, K2])
    with tables.begin() as conn:
        taken = outbox.claim(conn, token="t", lease=60, limit=10, ids=[lone.id, newer.id])
    assert {job.id: job.alone for job in taken} == {lone.id: True, newer.id: False}
    statements: list[str] = []
    with tables.begin() as conn:
        sa.event.listen(conn, "before_cursor_execute", lambda *a: statements.append(a[2]))
        assert outbox.settle_done(conn, [j for j in taken if j.alone], token="t") == []
    assert len(statements) == 1 and statements[0].startswith("DELETE")
    assert [j["id"] for j in jobs(tables)] == [older.id, newer.id]
    with tables.begin() as conn:
        assert outbox.settle_done(conn, [j for j in taken if not j.alone], token="t") == []
    assert jobs(tables) == []  # the older job went with the newer one


def test_two_claimers_never_take_one_rows_jobs_at_once(tables: Engine) -> None:
    """PostgreSQL: a lease is invisible to others until its claim commits, so each claim also
    tries its rows' advisory locks (never waiting): while one claim of a row's job is open,
    another claim of the same row's other job takes nothing, and after it commits the live
    lease keeps it waiting."""
    if tables.dialect.name != "postgresql":
        pytest.skip("concurrent claims: PostgreSQL (SQLite has one writer at a time)")
    with tables.begin() as conn:
        first, second = outbox.enqueue(conn, [K1, K1])  # a commit's job and a later one's
    with tables.connect() as a, tables.connect() as b:
        with a.begin():
            taken = outbox.claim(a, token="a", lease=60, limit=10, ids=[first.id])
            assert [job.id for job in taken] == [first.id]
            with b.begin():
                assert outbox.claim(b, token="b", lease=60, limit=10, ids=[second.id]) == []
        with b.begin():
            assert outbox.claim(b, token="b", lease=60, limit=10, ids=[second.id]) == []


def test_a_birth_lease_waits_for_an_open_claim_and_an_open_birth_keeps_claims_off(
    tables: Engine,
) -> None:
    """PostgreSQL: a job born leased takes its row's advisory lock (until its transaction
    ends) before it looks at the row's leases. A claim of the row's older job while the birth
    is open takes nothing; a birth while a claim of the row is open waits for that claim to
    commit, then sees its lease and is born unclaimed (due at once, for whoever holds the row
    next)."""
    if tables.dialect.name != "postgresql":
        pytest.skip("concurrent births and claims: PostgreSQL (SQLite has one writer at a time)")
    with tables.begin() as conn:
        (older,) = outbox.enqueue(conn, [K1])  # e.g. a worker's job, due at once
    with tables.connect() as user, tables.connect() as worker:
        with user.begin():
            (born,) = outbox.enqueue(user, [K1], claimed_by="me", lease=60)
            assert born.claimed_by == "me" and not born.alone  # the older job is there
            with worker.begin():
                assert outbox.claim(worker, token="w", lease=60, limit=10) == []
    with tables.begin() as conn:  # back to the start: the older job alone, due
        conn.execute(outbox.outbox.delete().where(outbox.outbox.c.id == born.id))
    births: list[outbox.Job] = []
    with tables.connect() as user, tables.connect() as worker:
        with worker.begin():
            (taken,) = outbox.claim(worker, token="w", lease=60, limit=10)
            assert taken.id == older.id

            def birth() -> None:
                with user.begin():
                    births.extend(outbox.enqueue(user, [K1, K2], claimed_by="me", lease=60))

            thread = threading.Thread(target=birth)
            thread.start()
            thread.join(0.5)
            assert thread.is_alive()  # waiting for the claim's lock on K1's row
        thread.join(10)
    assert [(job.key, job.claimed_by) for job in births] == [(K1, None), (K2, "me")]
    assert [(job.alone, job.key) for job in births] == [(False, K1), (True, K2)]


def test_a_birth_in_an_older_snapshot_is_left_for_a_claim(tables: Engine) -> None:
    """PostgreSQL in REPEATABLE READ or SERIALIZABLE: a transaction sees the leases of its
    first statement's time, not the ones committed while it waited for the rows' locks, so
    its jobs are born unclaimed, held back from workers for ``hold`` (the committing process
    claims them by id), and it takes no lock."""
    if tables.dialect.name != "postgresql":
        pytest.skip("isolation levels that read an older snapshot: PostgreSQL")
    now = outbox.utcnow()
    for level in ("REPEATABLE READ", "SERIALIZABLE"):
        with tables.connect().execution_options(isolation_level=level) as conn, conn.begin():
            (job,) = outbox.enqueue(conn, [K1], claimed_by="me", lease=60, hold=30, now=now)
            assert job.claimed_by is None and advisory_locks(conn) == 0
        (row,) = [j for j in jobs(tables) if j["id"] == job.id]
        assert row["claimed_by"] is None
        assert outbox.as_utc(row["next_attempt_at"]) == now + dt.timedelta(seconds=30)


def test_a_transaction_born_leases_jobs_for_a_bounded_number_of_rows(
    tables: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: each row born leased holds an advisory lock until the transaction ends (in
    the server's shared lock table, which a bulk write would fill): past ``BIRTH_LOCKS`` (a
    share of ``max_locks_per_transaction``) rows in one transaction, it takes no more locks
    and its further jobs are born unclaimed, for a claim after the commit."""
    if tables.dialect.name != "postgresql":
        pytest.skip("advisory locks: PostgreSQL")
    with tables.connect() as conn:
        budget = int(conn.exec_driver_sql("SHOW max_locks_per_transaction").scalar_one())
    monkeypatch.setattr(outbox, "BIRTH_LOCKS", 3.5 / budget)  # three rows
    k3 = JobKey("article", "content", "3")
    with tables.begin() as conn:
        leased = outbox.enqueue(conn, [K1, K2], claimed_by="me", lease=60)
        assert [j.claimed_by for j in leased] == ["me", "me"] and advisory_locks(conn) == 2
        over = outbox.enqueue(conn, [k3, JobKey("note", "body", "1")], claimed_by="me", lease=60)
        assert [j.claimed_by for j in over] == [None, None] and advisory_locks(conn) == 2
        (late,) = outbox.enqueue(conn, [JobKey("article", "content", "9")], claimed_by="me")
        assert late.claimed_by is None and advisory_locks(conn) == 2  # refused from then on
    with tables.begin() as conn:  # a new transaction counts from zero
        fresh = [JobKey("article", "content", str(pk)) for pk in (3, 4, 5)]
        born = outbox.enqueue(conn, fresh, claimed_by="me", lease=60)
        assert [j.claimed_by for j in born] == ["me"] * 3 and advisory_locks(conn) == 3


def advisory_locks(conn: sa.Connection) -> int:
    """The advisory locks ``conn``'s PostgreSQL backend holds."""
    query = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
    return int(conn.exec_driver_sql(query).scalar_one())


def test_a_birth_passes_its_own_finished_jobs_only(tables: Engine) -> None:
    """A finished job that waits to be deleted still holds its lease; a birth of the same
    processor does not count it (its ``ours`` ids), but a live lease of another processor
    on one of those ids holds the row all the same (its lease expired and was taken)."""
    with tables.begin() as conn:
        (done,) = outbox.enqueue(conn, [K1], claimed_by="me", lease=60)
        (held,) = outbox.enqueue(conn, [K1], claimed_by="me", lease=60)
        assert held.claimed_by is None  # a lease of its own processor holds it all the same
        (again,) = outbox.enqueue(conn, [K1], claimed_by="me", lease=60, ours=[done.id])
        assert again.claimed_by == "me" and not again.alone
        (busy,) = outbox.enqueue(conn, [K2], claimed_by="me", lease=60, ours=[done.id])
        assert busy.claimed_by == "me"
        conn.execute(
            outbox.outbox.update().where(outbox.outbox.c.id == busy.id).values(claimed_by="other")
        )
        (held,) = outbox.enqueue(conn, [K2], claimed_by="me", lease=60, ours=[busy.id])
        assert held.claimed_by is None


def test_settling_supersedes_older_jobs_and_clears_dead_ones(tables: Engine) -> None:
    with tables.begin() as conn:
        old, dead = outbox.enqueue(conn, [K1, K1])
        outbox.settle_failed(
            conn, [], EmbeddingError("x"), token="t", permanent=True, retry_in=0, max_failures=1
        )
        conn.execute(outbox.outbox.update().where(outbox.outbox.c.id == dead.id).values(dead=True))
        newest = outbox.enqueue(conn, [K1, K2], claimed_by="t", lease=60)
    with tables.begin() as conn:
        lost = outbox.settle_done(conn, [j for j in newest if j.claimed_by], token="t")
    assert lost == []
    assert [j["row_pk"] for j in jobs(tables)] == []  # older and dead jobs of K1 went too
    del old


def test_superseding_a_job_whose_lease_ran_out_leaves_the_row_watched(tables: Engine) -> None:
    """A processor whose lease ran out while it embedded may still write its older read of the
    row after a newer job was synced and settled: its own settle would find its job gone and
    queue the row again, but if it dies first the older text stayed for good. Superseding such
    a job leaves one for the row, due ``watch`` seconds later."""
    with tables.begin() as conn:
        outbox.enqueue(conn, [K1], claimed_by="slow", lease=60)
        (done,) = outbox.enqueue(conn, [K2], claimed_by="slow", lease=60)
        past = outbox.utcnow() - dt.timedelta(seconds=1)  # both leases ran out
        conn.execute(outbox.outbox.update().values(next_attempt_at=past))
        newer = outbox.enqueue(conn, [K1, K2], claimed_by="fast", lease=60)
        conn.execute(outbox.outbox.delete().where(outbox.outbox.c.id == done.id))  # (settled)
    with tables.begin() as conn:
        assert outbox.settle_done(conn, newer, token="fast", watch=120) == []
    (left,) = jobs(tables)
    assert left["row_pk"] == K1.pk and left["claimed_by"] is None and left["attempts"] == 0
    wait = (outbox.as_utc(left["next_attempt_at"]) - outbox.utcnow()).total_seconds()
    assert 100 < wait <= 120
    with tables.begin() as conn:  # without watch (the default): nothing left
        conn.execute(outbox.outbox.delete())
        outbox.enqueue(conn, [K1], claimed_by="slow", lease=60)
        conn.execute(outbox.outbox.update().values(next_attempt_at=past))
        newer = outbox.enqueue(conn, [K1], claimed_by="fast", lease=60)
    with tables.begin() as conn:
        assert outbox.settle_done(conn, newer, token="fast") == []
    assert jobs(tables) == []


def test_a_lost_lease_is_reported(tables: Engine) -> None:
    with tables.begin() as conn:
        (job,) = outbox.enqueue(conn, [K1], claimed_by="slow", lease=60)
        conn.execute(outbox.outbox.update().values(claimed_by="other"))  # expired and retaken
        assert outbox.settle_done(conn, [job], token="slow") == [K1]
    assert len(jobs(tables)) == 1  # the other processor's job is untouched


def test_failures_back_off_and_only_permanent_ones_bury(tables: Engine) -> None:
    down = VectorStoreError("unreachable")
    poison = EmbeddingError("poison")
    with tables.begin() as conn:
        outbox.enqueue(conn, [K1])
    for error, permanent in [(down, False), (down, False), (poison, True), (poison, True)]:
        with tables.begin() as conn:
            claimed = outbox.claim(conn, token="t", lease=60, limit=1)
            dead = outbox.settle_failed(
                conn, claimed, error, token="t", permanent=permanent, retry_in=0, max_failures=2
            )
    (row,) = jobs(tables)
    assert dead == 1 and row["dead"] and row["attempts"] == 4 and row["failures"] == 2
    assert row["last_error"] == "EmbeddingError: poison" and row["claimed_by"] is None
    with tables.begin() as conn:
        assert outbox.requeue_dead(conn, "article", "content", "2") == 0
        assert outbox.requeue_dead(conn, "article", "content", "1") == 1
    (row,) = jobs(tables)
    assert not row["dead"] and row["failures"] == 0


def test_leases_of_processes_that_died_here_are_released(tables: Engine) -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead_token = f"{socket.gethostname()[:40]}:{int(gone.stdout)}:x"
    alive_token = f"{socket.gethostname()[:40]}:1:x"  # init never dies
    with tables.begin() as conn:
        outbox.enqueue(conn, [K1], claimed_by=dead_token, lease=600)
        outbox.enqueue(conn, [K2], claimed_by=alive_token, lease=600)
        assert outbox.orphaned_tokens(conn) == [dead_token]
        assert outbox.release(conn, [dead_token]) == 1
        assert [j.key for j in outbox.claim(conn, token="new", lease=60, limit=10)] == [K1]


def test_counts_errors_and_pending_describe_the_queue(tables: Engine) -> None:
    with tables.begin() as conn:
        outbox.enqueue(conn, [K1, K2])
        claimed = outbox.claim(conn, token="t", lease=60, limit=1)
        outbox.settle_failed(
            conn,
            claimed,
            VectorStoreError("down"),
            token="t",
            permanent=False,
            retry_in=60,
            max_failures=5,
        )
    with tables.connect() as conn:
        counts = outbox.counts(conn)[("article", "content")]
        assert (counts["pending"], counts["retrying"], counts["dead"]) == (2, 1, 0)
        (error,) = outbox.errors(conn)
        assert error["state"] == "retrying" and error["error"] == "VectorStoreError: down"
        assert [p["row_pk"] for p in outbox.pending(conn)] == ["2", "1"]  # next due first
        assert outbox.next_due(conn) is not None and outbox.has_due(conn)


def test_checkpoints_are_read_written_and_cleared(tables: Engine) -> None:
    with tables.begin() as conn:
        assert outbox.checkpoint(conn, "pass") is None
        outbox.checkpoint(conn, "pass", '{"after": "41"}')
        outbox.checkpoint(conn, "pass", '{"after": "42"}')
    with tables.begin() as conn:
        assert outbox.checkpoint(conn, "pass") == '{"after": "42"}'
        outbox.checkpoint(conn, "pass", "")
        assert outbox.checkpoint(conn, "pass") is None


def test_an_outbox_from_an_older_version_is_upgraded(engine: Engine) -> None:
    old = sa.Table(  # the first release's outbox: no failures, no leases
        outbox.OUTBOX_TABLE,
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("table_name", sa.String(255), nullable=False),
        sa.Column("column_name", sa.String(255), nullable=False),
        sa.Column("row_pk", sa.Text, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("last_error", sa.Text),
        sa.Column("dead", sa.Boolean, nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    with engine.begin() as conn:
        old.create(conn)
        conn.execute(
            old.insert().values(
                table_name="article",
                column_name="content",
                row_pk="1",
                attempts=0,
                dead=False,
                next_attempt_at=dt.datetime.now(dt.UTC),
                created_at=dt.datetime.now(dt.UTC),
            )
        )
    with engine.begin() as conn:
        outbox.create_tables(conn)
    (row,) = jobs(engine)
    assert row["failures"] == 0 and row["claimed_by"] is None


_BOUNDED_SCANS = ("VIRTUAL TABLE", "CONSTANT ROW", "(subquery-")
"""Scans in an SQLite plan that read the statement's own keys, not the outbox: a JSON array
(``json_each``), a list of values, a subquery of them."""


@contextlib.contextmanager
def _outbox_statements(engine: Engine) -> Iterator[list[tuple[str, object]]]:
    """The statements on the outbox that ``engine`` runs meanwhile, with their parameters."""
    seen: list[tuple[str, object]] = []

    def record(conn: object, cursor: object, statement: str, params: object, *rest: object) -> None:
        if "semantic_orm_outbox" in statement:
            seen.append((statement, params))

    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)


def _plans(
    engine: Engine, seen: list[tuple[str, object]]
) -> Iterator[tuple[str, list[str], list[str]]]:
    """SQLite's plan of each statement ``seen``: its steps, and those that scan the outbox
    (under any name: a subquery's alias too), reading every job."""
    with engine.connect() as conn:
        for statement, params in seen:
            rows = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", params)
            plan = [str(row[-1]) for row in rows]
            scans = [
                step
                for step in plan
                if step.startswith("SCAN ") and not any(b in step for b in _BOUNDED_SCANS)
            ]
            yield statement, plan, scans


def test_a_commit_reads_its_rows_jobs_through_the_row_index_whatever_the_backlog(
    tables: Engine,
) -> None:
    """Jobs scheduled for later (a retry backlog after a store outage) must not be walked by
    the statements of a commit's jobs: SQLite's planner, without statistics, prefers the due-time
    index for any lease condition, so those conditions are checked on the rows the row index
    finds (the commit's cost then follows its own rows, never the backlog). The birth of the
    jobs is one of them (whether each row had another job: a subquery of its RETURNING read
    every job of the column for each new one)."""
    if tables.dialect.name != "sqlite":
        pytest.skip("a planner choice of SQLite's (PostgreSQL plans with table statistics)")
    with tables.begin() as conn:  # jobs of other rows, due in a year
        backlog = [JobKey("other", "text", str(k)) for k in range(300)]
        outbox.enqueue(conn, backlog, hold=365 * 86400, returning=False)
    with _outbox_statements(tables) as seen:
        with tables.begin() as conn:  # a commit of 200 rows (the planner's choice follows sizes)
            keys = [JobKey("article", "content", str(k)) for k in range(200)]
            born = outbox.enqueue(conn, keys, claimed_by="me", lease=60)
            outbox.claim(conn, token="me", lease=60, limit=500, ids=[j.id for j in born])
            outbox.settle_done(conn, born[:100], token="me")
            failed = EmbeddingError("x")
            outbox.settle_failed(
                conn, born[100:150], failed, token="me", permanent=True, retry_in=0, max_failures=5
            )
            outbox.dead_letter(conn, keys[100:], "gone")
    assert seen
    for statement, plan, scans in _plans(tables, seen):
        # the due-time index (dead, next_attempt_at) leads through every pending job
        assert not scans and not any("_due" in step for step in plan), (statement, plan)
    left = [(j["row_pk"], j["dead"]) for j in jobs(tables) if j["table_name"] == "article"]
    assert left == [(str(k), True) for k in range(100, 200)]


def test_passes_and_tools_read_what_they_take_whatever_the_backlog(tables: Engine) -> None:
    """A worker's pass takes the earliest due jobs through the due-time index, ending at its
    ``limit`` (in id order SQLite sorted every due job of a backlog first); ``has_due`` reads
    one entry of it; ``expedite`` and ``requeue_dead`` of a column or row go through the row
    index, not through every pending (or dead) job."""
    if tables.dialect.name != "sqlite":
        pytest.skip("SQLite's plans (PostgreSQL plans with table statistics)")
    now = outbox.utcnow()
    with tables.begin() as conn:  # a backlog: due jobs of one column, later ones of another
        due = [JobKey("article", "content", str(k)) for k in range(300)]
        outbox.enqueue(conn, due, returning=False, now=now - dt.timedelta(seconds=60))
        later = [JobKey("other", "text", str(k)) for k in range(300)]
        outbox.enqueue(conn, later, hold=3600, returning=False)
        outbox.dead_letter(conn, later[:100], "gone")
        first = outbox.enqueue(conn, [K2], now=now - dt.timedelta(seconds=600))  # due earliest
    with _outbox_statements(tables) as seen:
        with tables.begin() as conn:
            taken = outbox.claim(conn, token="me", lease=60, limit=10)
            assert outbox.has_due(conn)
            assert outbox.expedite(conn, "other", "text") == 200
            assert outbox.requeue_dead(conn, "other", "text", "5") == 1
    assert len(taken) == 10 and taken[0].id == first[0].id  # the earliest due first
    for statement, plan, scans in _plans(tables, seen):
        assert not scans and not [step for step in plan if "TEMP B-TREE" in step], plan
        if not statement.startswith("SELECT"):  # a claim's and has_due's: the due index
            assert not any("_due" in step for step in plan), (statement, plan)


def test_jobs_roll_back_with_their_transaction_even_as_its_first_statement(
    tables: Engine,
) -> None:
    """Whatever statement writes them (born leased, held, plain), jobs are the transaction's:
    Python's sqlite3 opens a transaction only before an INSERT, UPDATE, DELETE or REPLACE, so
    a birth worded as a leading ``WITH`` was committed on its own (on an engine as
    ``create_engine`` makes it, without the tests' pysqlite recipe)."""
    plain = sa.create_engine(tables.url)
    try:
        for options in ({"claimed_by": "me", "lease": 60}, {"hold": 30}, {}):
            with plain.connect() as conn:
                trans = conn.begin()
                assert outbox.enqueue(conn, [K1, K2], **options)  # type: ignore[arg-type]
                trans.rollback()
            assert jobs(tables) == [], options
    finally:
        plain.dispose()


def test_no_birth_lease_without_a_transaction(tables: Engine) -> None:
    """PostgreSQL in AUTOCOMMIT: each statement is its own transaction, so a row's lock would
    end before the look at its leases; the jobs are born unclaimed, held for ``hold``."""
    if tables.dialect.name != "postgresql":
        pytest.skip("advisory locks: PostgreSQL")
    autocommit = tables.connect().execution_options(isolation_level="AUTOCOMMIT")
    with autocommit as conn, conn.begin():  # (a transaction for SQLAlchemy, none for the server)
        (job,) = outbox.enqueue(conn, [K1], claimed_by="me", lease=60, hold=30)
        assert job.claimed_by is None and advisory_locks(conn) == 0
