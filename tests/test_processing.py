"""Processing: claim, read, apply, settle; workers, retries, dead letters, crashes, concurrency.

Every test breaks something on purpose (a poison row, an outage, a refused write, a SIGKILL,
racing writers and workers, steady SQLite traffic) and checks that nothing is lost: once the
workers have drained, the database and the index agree. SQLite and PostgreSQL (the concurrency
test on PostgreSQL only), both store adapters, the fake embedder.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from importlib.metadata import version
from pathlib import Path
from typing import Any, ClassVar

import pytest
import sqlalchemy as sa
from packaging.version import Version
from sqlalchemy import orm, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.declarative import ConcreteBase
from sqlalchemy.orm import Mapped, mapped_column, sessionmaker

from semantic_orm import (
    EdgeStore,
    QdrantClientStore,
    SemanticIndex,
    SemanticSearchMixin,
    SemanticText,
    Worker,
    outbox,
    processing,
)
from semantic_orm.chunking import Chunk, register_chunker, registry
from semantic_orm.maintenance import reconcile, status
from semantic_orm.testing import FlakyStore, HashEmbedder, MemoryStore

from .helpers import (
    COLL,
    PoisonEmbedder,
    assert_index_matches_database,
    foreign_keys_on,
    in_a_forked_child,
    jobs,
    payloads,
    points_of,
    pysqlite_recipe,
    reads_of,
    settle_fails_once,
    settled,
)
from .models import Article, Base, Comment

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def tables(engine: Engine) -> Engine:
    Base.metadata.create_all(engine)
    return engine


def test_deferred_mode_leaves_jobs_for_a_worker(tables: Engine, store: Any) -> None:
    idx = SemanticIndex(store=store, embedder=HashEmbedder(), mode="deferred")
    factory = sessionmaker(tables)
    idx.install(factory)
    with factory() as s:
        s.add_all(Article(title=f"a{i}", content=f"text number {i} about rivers") for i in range(5))
        s.commit()
    assert len(jobs(tables)) == 5 and store.count(COLL) == 0
    worker = Worker(idx, tables, poll_interval=0.01)
    worker.run(stop_when_idle=True)
    assert worker.processed == 5
    assert jobs(tables) == [] and store.count(COLL) == 5
    worker.start()  # the background thread picks up later commits
    with factory() as s:
        s.add(Article(title="late", content="a later row"))
        s.commit()
    idx.drain(tables, timeout=10)
    worker.stop()
    assert store.count(COLL) == 6


def test_a_workers_totals_keep_counts_not_every_failure(tables: Engine, store: Any) -> None:
    """Through an outage of any length a worker's totals count every failed pass but keep the
    failures (which hold the rows' text) of the latest one only."""
    flaky = FlakyStore(store)
    idx = SemanticIndex(
        store=flaky, embedder=HashEmbedder(), mode="deferred", retry_base=0.001, retry_cap=0.001
    )
    factory = sessionmaker(tables)
    idx.install(factory)
    with factory() as s:
        s.add_all(Article(title=f"a{i}", content=f"text {i} " * 200) for i in range(4))
        s.commit()
    flaky.down = True
    worker = Worker(idx, tables, poll_interval=0.001)
    passes = 0
    while worker.totals.retried < 4 * 20:
        report = worker.run_once()
        passes += bool(report.retried)
        time.sleep(0.003)
    assert passes >= 20
    assert worker.totals.sync.failed == report.sync.failed or not report.sync.failed
    assert 1 <= len(worker.totals.sync.failed) <= 4
    assert {op.pk for ops, _ in worker.totals.sync.failed for op in ops} <= {"1", "2", "3", "4"}
    flaky.down = False
    worker.run(stop_when_idle=True)
    idx.drain(tables, timeout=10)
    assert settled(tables) == [] and worker.processed == 4
    assert_index_matches_database(tables, store)


def test_a_total_keeps_the_latest_unknown_jobs_only() -> None:
    """Jobs no loaded model maps are retried for ever: a worker's total keeps those of the
    latest pass that had any, not every key it ever met."""
    total = processing.ProcessReport()
    for n in range(3):
        keys = [outbox.JobKey("ghost", "body", str(n * 10 + i)) for i in range(10)]
        total.add(processing.ProcessReport(claimed=10, unknown=keys))
        total.add(processing.ProcessReport())
    assert total.claimed == 30 and total.unknown == keys


def test_a_failing_worker_backs_off_and_logs_sparingly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Passes that fail as a whole (the database is down) are tried again after a doubling wait
    (capped); the first failure is logged with its traceback, the same one again at 2, 4, 8 ...
    in a row, another one in full, the recovery once."""

    idx = SemanticIndex(store=MemoryStore(), embedder=HashEmbedder())
    errors: list[Exception] = [
        sa.exc.OperationalError("SELECT", {}, Exception("database is down")) for _ in range(9)
    ]
    errors.insert(6, RuntimeError("something else"))

    def process(bind: Any, *, limit: int = 256) -> processing.ProcessReport:
        if errors:
            raise errors.pop(0)
        return processing.ProcessReport()

    monkeypatch.setattr(idx, "process", process)
    monkeypatch.setattr(processing, "FAILURE_WAIT_CAP", 0.016)  # (failure_wait reads it)
    worker = Worker(idx, None, poll_interval=0.001)
    waits: list[float] = []
    monkeypatch.setattr(worker._stop, "wait", lambda seconds: waits.append(seconds))
    with caplog.at_level("WARNING", logger="semantic_orm"):
        worker.run(stop_when_idle=True)  # returns once a pass went through with nothing due
    assert waits == pytest.approx(
        [0.001, 0.002, 0.004, 0.008, 0.016, 0.016, 0.016, 0.016, 0.016, 0.016]
    )
    logged = [(r.levelname, r.exc_info is not None, r.getMessage()) for r in caplog.records]
    assert [(level, full) for level, full, _ in logged] == [
        ("ERROR", True),  # the first failure
        ("WARNING", False),  # 2 in a row
        ("WARNING", False),  # 4 in a row
        ("ERROR", True),  # another error (the 7th pass)
        ("ERROR", True),  # the first one again (the 8th): it differs from the last
        ("WARNING", False),  # works again
    ]
    assert "database is down" in logged[1][2] and "2 passes in a row" in logged[1][2]
    assert "works again after 10 failed passes" in logged[-1][2]
    assert worker.failures == 0


@pytest.mark.parametrize("mode", ["inline", "deferred"])
def test_the_applications_orm_query_hooks_never_hide_a_row_from_its_sync(
    tables: Engine, store: Any, mode: str
) -> None:
    """A multi-tenant app filters every ORM query by the session's tenant (SQLAlchemy's
    documented ``do_orm_execute`` + ``with_loader_criteria`` recipe, on every ``Session``). The
    sync reads rows in no tenant's session: it must still see them, or it would take committed
    rows out of the index; searches still go through the app's filter."""

    def tenant_only(state: orm.ORMExecuteState) -> None:
        if state.is_select and not state.is_column_load and not state.is_relationship_load:
            lang = state.session.info.get("lang")
            state.statement = state.statement.options(
                orm.with_loader_criteria(Article, Article.lang == lang)
            )

    idx = SemanticIndex(store=store, embedder=HashEmbedder(), mode=mode)  # type: ignore[arg-type]
    french = sessionmaker(tables, info={"lang": "fr"})
    english = sessionmaker(tables, info={"lang": "en"})
    idx.install(french)
    idx.install(english)
    sa.event.listen(orm.Session, "do_orm_execute", tenant_only)
    try:
        with french() as s:
            s.add(Article(title="fr", lang="fr", content="la facture trimestrielle du client"))
            s.commit()
        with english() as s:
            s.add(Article(title="en", lang="en", content="the quarterly invoice of the client"))
            s.commit()
        if mode == "deferred":
            Worker(idx, tables, poll_interval=0.01).run(stop_when_idle=True)
        idx.drain(tables, timeout=10)
        assert store.count(COLL) == 2
        reports = reconcile(idx, Article, tables)
        assert [(r.queued, r.orphans) for r in reports] == [(0, 0)]
        assert store.count(COLL) == 2
        with french() as s:  # each tenant's search still sees its own rows only
            assert [h.obj.title for h in Article.semantic_search(s, "facture client")] == ["fr"]
        with english() as s:
            assert [h.obj.title for h in Article.semantic_search(s, "facture client")] == ["en"]
    finally:
        sa.event.remove(orm.Session, "do_orm_execute", tenant_only)
        idx.uninstall(french)
        idx.uninstall(english)
    assert_index_matches_database(tables, store)


class _Inherited(orm.DeclarativeBase):
    pass


class Entry(_Inherited):
    """A joined-inheritance base that loads its subclasses' tables with it."""

    __tablename__ = "entry"
    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(sa.String(20))
    __mapper_args__: ClassVar[dict[str, Any]] = {
        "polymorphic_on": "kind",
        "polymorphic_identity": "entry",
        "with_polymorphic": "*",
    }


class Memo(SemanticSearchMixin, Entry):
    """The semantic column on a joined subclass."""

    __tablename__ = "memo"
    id: Mapped[int] = mapped_column(sa.ForeignKey("entry.id"), primary_key=True)
    body: Mapped[str | None] = mapped_column(SemanticText())
    __mapper_args__: ClassVar[dict[str, Any]] = {"polymorphic_identity": "memo"}


class Letter(Entry):
    __tablename__ = "letter"
    id: Mapped[int] = mapped_column(sa.ForeignKey("entry.id"), primary_key=True)
    __mapper_args__: ClassVar[dict[str, Any]] = {"polymorphic_identity": "letter"}


class Staff(ConcreteBase, SemanticSearchMixin, _Inherited):
    """A concrete-inheritance base: its mapper selects from a UNION of its tables."""

    __tablename__ = "staff"
    id: Mapped[int] = mapped_column(primary_key=True)
    bio: Mapped[str | None] = mapped_column(SemanticText())
    __mapper_args__: ClassVar[dict[str, Any]] = {"polymorphic_identity": "staff", "concrete": True}


class Manager(Staff):
    __tablename__ = "manager"
    id: Mapped[int] = mapped_column(primary_key=True)
    bio: Mapped[str | None] = mapped_column(sa.Text)
    __mapper_args__: ClassVar[dict[str, Any]] = {
        "polymorphic_identity": "manager",
        "concrete": True,
    }


class Post(SemanticSearchMixin, _Inherited):
    """The semantic column on a joined-inheritance base, with a subclass (a table name no other
    test maps: the sync of a statement finds a table's model by its name)."""

    __tablename__ = "inherited_post"
    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(sa.String(20))
    body: Mapped[str | None] = mapped_column(SemanticText())
    __mapper_args__: ClassVar[dict[str, Any]] = {
        "polymorphic_on": "kind",
        "polymorphic_identity": "post",
    }


class Reply(Post):
    __tablename__ = "reply"
    id: Mapped[int] = mapped_column(sa.ForeignKey("inherited_post.id"), primary_key=True)
    __mapper_args__: ClassVar[dict[str, Any]] = {"polymorphic_identity": "reply"}


def test_a_base_tables_column_first_seen_through_a_subclass_syncs_every_row(
    engine: Engine, store: Any
) -> None:
    _Inherited.metadata.create_all(engine)
    idx = SemanticIndex(store=store, embedder=HashEmbedder())
    factory = sessionmaker(engine)
    idx.install(factory)
    with factory() as s:  # the column is first met through the subclass's mapper
        s.add(Reply(id=1, body="a reply about tides"))
        s.commit()
        s.add(Post(id=2, body="a post about tides"))  # a row of the base table only
        s.commit()
    idx.drain(engine, timeout=10)
    (report,) = reconcile(idx, Post, engine)
    assert (report.rows, report.queued) == (2, 0)
    with factory() as s:
        assert {h.obj.id for h in Post.semantic_search(s, "tides", limit=10)} == {1, 2}
    idx.uninstall(factory)


def test_orm_bulk_statements_of_a_joined_subclass_reach_the_base_tables_column(
    engine: Engine, installed: Any
) -> None:
    """``session.execute(insert(Reply), [...])`` and ``update(Reply)`` run one statement per
    table, each still naming the subclass's table: the base table's semantic column was never
    queued (no job, no point, nothing for drain to find)."""
    idx, factory = installed(metadata=_Inherited.metadata, expire_on_commit=True)
    with factory() as s:
        s.execute(
            sa.insert(Reply),
            [{"id": 1, "body": "a reply about tides"}, {"id": 2, "body": "a reply about snow"}],
        )
        s.commit()
        s.execute(sa.update(Reply), [{"id": 2, "body": "a reply about volcanoes"}])
        s.commit()
    idx.drain(engine, timeout=10)
    (report,) = reconcile(idx, Post, engine, process=False)
    assert (report.rows, report.queued) == (2, 0)
    with factory() as s:
        for query, key in (("tides", 1), ("volcanoes", 2)):
            assert [h.obj.id for h in Post.semantic_search(s, query, limit=1)] == [key]


def test_rows_of_inherited_models_are_read_from_their_own_tables(
    engine: Engine, store: Any
) -> None:
    """The sync reads a joined subclass through its parent's table, and a concrete base from its
    own table, not from the union its mapper queries (a cartesian product: SAWarning)."""
    _Inherited.metadata.create_all(engine)
    idx = SemanticIndex(store=store, embedder=HashEmbedder())
    factory = sessionmaker(engine)
    idx.install(factory)
    with factory() as s:
        s.add_all(Memo(id=i, body=f"memo {i} about the river delta") for i in range(3))
        s.add(Letter(id=10))
        s.add_all(Staff(id=i, bio=f"staff {i} who maps the river") for i in range(3))
        s.add(Manager(id=10, bio="a manager, not a staff row"))
        s.commit()
    with factory() as s:  # a manager under a staff row's key: the union holds both rows
        s.add(Manager(id=1, bio="a manager of the desert office"))
        s.commit()
    idx.drain(engine, timeout=10)
    for model in (Memo, Staff):
        (report,) = reconcile(idx, model, engine)
        assert (report.rows, report.queued) == (3, 0)
    with factory() as s:
        assert len(Memo.semantic_search(s, "river delta", limit=10)) == 3
        hits = Staff.semantic_search(s, "maps the river", limit=10)
        assert sorted((type(h.obj), h.obj.id) for h in hits) == [(Staff, i) for i in range(3)]
        assert all(h.obj.bio == f"staff {h.obj.id} who maps the river" for h in hits)
    idx.uninstall(factory)


class _Orphans(orm.DeclarativeBase):
    pass


class Shelf(_Orphans):
    """A parent whose notes are deleted with it, and when taken out of its list."""

    __tablename__ = "orphan_shelf"
    id: Mapped[int] = mapped_column(primary_key=True)
    notes: Mapped[list[ShelfNote]] = orm.relationship(cascade="all, delete-orphan")


class ShelfNote(SemanticSearchMixin, _Orphans):
    __tablename__ = "orphan_shelf_note"
    id: Mapped[int] = mapped_column(primary_key=True)
    shelf_id: Mapped[int] = mapped_column(sa.ForeignKey("orphan_shelf.id"))
    text: Mapped[str | None] = mapped_column(SemanticText())


def test_rows_a_delete_orphan_cascade_deletes_lose_their_points(
    engine: Engine, store: Any, installed: Any
) -> None:
    """A ``delete-orphan`` cascade deletes, during the flush, a child taken out of its parent's
    list (or left behind by replacing the list): such rows are not in ``session.deleted``, and
    their points stayed in the index for good."""
    idx, factory = installed(metadata=_Orphans.metadata, expire_on_commit=True)
    with factory() as s:
        shelf = Shelf(id=1, notes=[ShelfNote(id=i, text=f"note {i} on tides") for i in (1, 2, 3)])
        s.add(shelf)
        s.commit()
        shelf.notes.remove(shelf.notes[0])  # note 1: an orphan
        s.commit()
        shelf.notes = [shelf.notes[0], ShelfNote(id=4, text="note 4 about snow")]  # 3 goes
        s.commit()
    idx.drain(engine, timeout=10)
    coll = "orphan_shelf_note__text"
    assert sorted({p.payload["pk"] for p in store.points(coll)}) == ["2", "4"]
    assert assert_index_matches_database(engine, store, ShelfNote, "text", coll) == 2
    with factory() as s:
        s.delete(s.get(Shelf, 1))  # the ordinary cascade still does
        s.commit()
    idx.drain(engine, timeout=10)
    assert store.count(coll) == 0


def test_poison_row_is_dead_lettered_while_others_sync(tables: Engine, store: Any) -> None:
    idx = SemanticIndex(
        store=store, embedder=PoisonEmbedder(), mode="deferred", max_attempts=3, retry_base=0
    )
    factory = sessionmaker(tables)
    idx.install(factory)
    with factory() as s:
        s.add_all(Article(title=f"ok{i}", content=f"healthy row {i}") for i in range(100))
        s.add(Article(title="bad", content="this row is POISON for the model"))
        s.commit()
    report = idx.drain(tables, timeout=30)
    assert report.dead == 1
    (dead,) = jobs(tables)
    assert dead["dead"] and dead["attempts"] == 3
    assert "EmbeddingError: this text poisons the model" in dead["last_error"]
    assert store.count(COLL) == 100
    (col,) = [c for c in status(idx, tables) if c.column == "Article.content"]
    assert (col.rows, col.indexed_rows, col.pending_jobs, col.dead_jobs) == (101, 100, 0, 1)
    with tables.begin() as conn:
        assert outbox.requeue_dead(conn) == 1
    (job,) = jobs(tables)
    assert not job["dead"] and job["attempts"] == 0


class _LoweringChunker:
    """A custom chunker that breaks the contract: its chunks' text is lower-cased."""

    chunk_size, overlap = 900, 0

    def __init__(self, **_: Any) -> None:
        pass

    def chunk(self, text: str) -> list[Chunk]:
        return [Chunk(text.lower(), 0, 0, len(text), 1)] if text else []

    def config(self) -> dict[str, Any]:
        return {"strategy": "lowering", "chunk_size": 900, "overlap": 0}


def test_a_chunker_whose_chunks_are_not_the_text_fails_loudly(
    tables: Engine, store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk must be the text at its offsets, or its passage is not what was embedded: a
    custom chunker that breaks this dead-letters the row, naming the column, chunker and
    chunk, whatever the embedder (token-aware ones checked it already, when fitting)."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    register_chunker("lowering", _LoweringChunker)

    class Local(orm.DeclarativeBase):
        pass

    class Shouted(SemanticSearchMixin, Local):
        __tablename__ = "shouted_note"
        id: Mapped[int] = mapped_column(primary_key=True)
        body: Mapped[str] = mapped_column(SemanticText(chunker="lowering"))

    Local.metadata.create_all(tables)
    for embedder in (HashEmbedder(), HashEmbedder(max_seq_length=50)):
        idx = SemanticIndex(store=store, embedder=embedder, mode="deferred", max_attempts=1)
        factory = sessionmaker(tables)
        idx.install(factory)
        with factory() as s:
            s.add_all([Shouted(id=1, body="all lower case"), Shouted(id=2, body="Not So Here")])
            s.commit()
        assert idx.drain(tables, timeout=10).dead == 1
        (dead,) = jobs(tables)
        assert dead["row_pk"] == "2" and dead["dead"]
        assert "Shouted.body: chunker _LoweringChunker returned chunk 0" in dead["last_error"]
        assert [p.payload["pk"] for p in store.points("shouted_note__body")] == ["1"]
        with tables.begin() as conn:
            outbox.delete_column(conn, "shouted_note", "body")
            conn.execute(Shouted.__table__.delete())
        idx.uninstall(factory)
        store.drop_collection("shouted_note__body")
    # its chunker is registered for this test only: an index without models= made later in
    # this process would find the model and fail on it
    Local.registry.dispose()


def one_row_on_a_flaky_store(installed: Any, **settings: Any) -> tuple[Any, SemanticIndex]:
    """A deferred index on a store that can fail, and one committed row waiting for it."""
    idx, factory = installed(flaky=True, mode="deferred", **settings)
    with factory() as s:
        s.add(Article(title="t", content="rivers"))
        s.commit()
    return idx.store, idx


def test_transient_errors_retry_with_backoff_and_never_bury(
    tables: Engine, store: Any, installed: Any
) -> None:
    flaky, idx = one_row_on_a_flaky_store(installed, max_attempts=2, retry_base=0)
    flaky.down = True
    for _ in range(5):
        idx.process(tables)
    (job,) = jobs(tables)
    assert job["attempts"] == 5 and not job["dead"]  # an outage is not the row's fault
    flaky.down = False
    idx.drain(tables, timeout=10)
    assert store.count(COLL) == 1


def test_backoff_grows_and_is_capped(tables: Engine, installed: Any) -> None:
    flaky, idx = one_row_on_a_flaky_store(installed, retry_base=2, retry_cap=5)
    flaky.down = True
    for expected in (2, 4, 5, 5):  # seconds: doubled each attempt, capped at retry_cap
        with tables.begin() as conn:  # make the job due now, then fail it once more
            conn.execute(update(outbox.outbox).values(next_attempt_at=outbox.utcnow()))
        before = outbox.utcnow()
        idx.process(tables)
        after = outbox.utcnow()
        (job,) = jobs(tables)
        due = job["next_attempt_at"]
        due = due if due.tzinfo else due.replace(tzinfo=before.tzinfo)
        # the failure was recorded between `before` and `after`, however slow the machine
        assert before + dt.timedelta(seconds=expected) <= due
        assert due <= after + dt.timedelta(seconds=expected)


def test_sigkill_between_commit_and_sync(tables: Engine, tmp_path: Path) -> None:
    """A process dies inside the post-commit sync; a fresh process's worker completes it."""
    vectors = tmp_path / "vectors"
    url = tables.url.render_as_string(hide_password=False)
    script = f"""
import os, signal, sys
sys.path.insert(0, {str(ROOT)!r})
from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker
from semantic_orm import EdgeStore, SemanticIndex
from semantic_orm.testing import HashEmbedder
from tests.models import Article

class Killer(HashEmbedder):
    def encode(self, texts):
        os.kill(os.getpid(), signal.SIGKILL)

engine = create_engine({url!r})
index = SemanticIndex(store=EdgeStore({str(vectors)!r}), embedder=Killer())
Session = sessionmaker(engine)
index.install(Session)
with Session() as s:
    s.add_all(Article(title=f"r{{i}}", content=f"row {{i}} about lakes") for i in range(3))
    s.commit()
print("not reached")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()
    assert b"not reached" not in done.stdout
    with tables.connect() as conn:
        assert conn.execute(select(Article.id)).scalars().all() == [1, 2, 3]
    assert len(jobs(tables)) == 3  # committed with the rows
    store = EdgeStore(vectors)
    idx = SemanticIndex(store=store, embedder=HashEmbedder(), models=Base)
    idx.drain(tables, timeout=30)
    assert jobs(tables) == []
    assert_index_matches_database(tables, store)
    store.close()


def test_an_inline_commits_finished_jobs_go_with_the_next_commit_or_a_moment_later(
    tables: Engine, installed: Any
) -> None:
    """On SQLite a commit's synced jobs are not deleted by a transaction of their own: the next
    flush deletes them in its transaction (undone with it on a rollback), else a timer does."""
    if tables.dialect.name != "sqlite":
        pytest.skip("PostgreSQL: the timer deletes finished jobs (a flush there does not)")
    idx, factory = installed()
    idx.processor.later.delay = 60.0  # no timer inside this test
    first, second = "first text about rivers", "second text about lakes"
    with factory() as s:
        s.add(Article(id=1, title="t", content=first))
        s.commit()
        (job,) = jobs(tables)  # synced (below), still leased until deleted
        assert job["claimed_by"] == idx.token and job["row_pk"] == "1"
        assert [p["end_offset"] for p in points_of(idx, 1)] == [len(first)]
        art = s.get(Article, 1)
        assert art is not None
        art.content = second
        s.commit()  # the same row again: its first job is gone, so this one is born leased
        (job,) = jobs(tables)
        assert job["claimed_by"] == idx.token
        assert [p["end_offset"] for p in points_of(idx, 1)] == [len(second)]  # synced inline
    with factory() as s:
        s.add(Article(id=2, title="t", content="never committed"))
        s.flush()  # deletes the finished job in this transaction...
        s.rollback()  # ...and the rollback brings it back
    assert len(jobs(tables)) == 1
    idx.settle()  # the job was handed back, so it is deleted after all
    assert jobs(tables) == []
    idx.processor.later.delay = 0.05
    with factory() as s:
        s.add(Article(id=3, title="t", content="a third row"))
        s.commit()
    assert settled(tables) == []  # no later commit, no worker, no drain: the timer
    assert assert_index_matches_database(tables, idx.store) == 2


def test_a_steady_stream_of_inline_commits_needs_no_settle_transaction_of_its_own(
    tables: Engine, installed: Any
) -> None:
    """Each commit's flush deletes the last one's finished jobs; the timer only settles what
    waited its whole delay: the last commit's jobs, once the stream stops."""
    if tables.dialect.name != "sqlite":
        pytest.skip("PostgreSQL: the timer deletes finished jobs (a flush there does not)")
    idx, factory = installed()
    later = idx.processor.later
    later.delay = 0.8  # far above a commit's time, even on a loaded CI machine
    by_timer: list[int] = []
    take = later.take

    def watched(engine: Engine, settling: bool = False) -> list[Any]:
        taken = take(engine, settling)
        if taken and isinstance(threading.current_thread(), threading.Timer):
            by_timer.append(len(taken))
        return taken

    later.take = watched  # type: ignore[method-assign]
    started = time.monotonic()
    for i in range(1, 51):  # a commit every ~0.05 s, for several delays
        with factory() as s:
            s.add(Article(id=i, title="t", content=f"row {i} about rivers and lakes"))
            s.commit()
        time.sleep(0.05)
    assert time.monotonic() - started > 3 * later.delay
    assert by_timer == []  # the stream's own flushes took every job before it was due
    assert settled(tables) == []  # the stream stopped: the timer settles the last commit's
    assert by_timer == [1]
    assert assert_index_matches_database(tables, idx.store) == 50


def _a_finished_job(installed: Any) -> tuple[SemanticIndex, Any]:
    """An installed index whose one commit's job (row 1) is synced and waits to be deleted,
    with no timer: only flushes, ``settle()`` and the test take it."""
    idx, factory = installed()
    idx.processor.later.delay = 60.0
    with factory() as s:
        s.add(Article(id=1, title="t", content="a row about rivers"))
        s.commit()
    return idx, factory


def test_a_commit_while_the_timer_settles_its_rows_last_job_is_synced_inline(
    tables: Engine, installed: Any
) -> None:
    """The timer takes the finished jobs, then deletes them in a transaction of its own: until
    that ends they are still in the database, leased to this process. A commit of one of their
    rows meanwhile must pass them at its birth and be synced by itself, not wait for a lease
    this very process holds (found as a flaky test under load)."""
    idx, factory = _a_finished_job(installed)  # the test settles by hand, below
    later = idx.processor.later
    second = "second text about lakes and seas"
    (job,) = jobs(tables)  # synced, waiting to be deleted
    assert job["claimed_by"] == idx.token and [j.id for j in later.waiting(tables)] == [job["id"]]
    writing = idx.processor.writing
    seen: list[list[int]] = []  # (what flush() raises is caught: asserted after it)
    taken: list[bool] = []
    once = threading.Lock()  # other passes of this processor (a retrier) write too

    def after_a_commit(engine: Engine) -> Any:
        main = threading.current_thread() is threading.main_thread()  # (this flush's)
        if main and once.acquire(blocking=False):  # the job is taken, its delete not begun
            taken.append(later._jobs.get(tables, []) == [])
            with factory() as s:
                art = s.get(Article, 1)
                assert art is not None
                art.content = second
                s.commit()
            seen.append([p["end_offset"] for p in points_of(idx, 1)])
        return writing(engine)

    idx.processor.writing = after_a_commit
    later.flush(tables)
    del idx.processor.writing
    assert taken == [True] and seen == [[len(second)]]  # synced by its commit
    idx.settle()
    assert jobs(tables) == []
    assert assert_index_matches_database(tables, idx.store) == 1


def test_finished_jobs_a_rollback_gives_back_are_still_settled_by_the_timer(
    tables: Engine, installed: Any
) -> None:
    """Every flush takes the waiting jobs into its transaction and every rollback gives them
    back: they keep their age, so the timer settles them (they do not wait for their lease)."""
    if tables.dialect.name != "sqlite":
        pytest.skip("PostgreSQL: the timer deletes finished jobs (a flush there does not)")
    idx, factory = installed()
    idx.processor.later.delay = 1.0  # the job waits for it before the loop starts
    with factory() as s:
        s.add(Article(id=1, title="t", content="a row about rivers"))
        s.commit()
    assert len(jobs(tables)) == 1  # synced, waiting to be deleted
    deadline = time.monotonic() + 12 * idx.processor.later.delay
    while jobs(tables) and time.monotonic() < deadline:
        with factory() as s:
            s.add(Article(id=2, title="t", content="never committed"))
            s.flush()  # takes the finished job into this transaction...
            s.rollback()  # ...and gives it back
        time.sleep(0.05)
    assert jobs(tables) == []
    assert assert_index_matches_database(tables, idx.store) == 1


def test_a_settle_that_ends_leaves_the_jobs_another_settle_took_in_sight(
    tables: Engine, installed: Any
) -> None:
    """A settle that could not run puts its jobs back; another may take them before the first
    has ended: the first's end must not take them out of sight while the second deletes."""
    idx, _ = _a_finished_job(installed)
    later = idx.processor.later
    (job,) = later.waiting(tables)
    first = later.take(tables, settling=True)
    later._keep(tables, first)  # blocked: back to wait
    second = later.take(tables, settling=True)  # another settle takes them meanwhile
    later._settled(tables, first)  # the first settle ends
    assert [j.id for j in later.waiting(tables)] == [job.id]
    later._settled(tables, second)
    assert later.waiting(tables) == []


def test_finished_jobs_a_failing_flush_took_are_given_back(
    tables: Engine, installed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flush deletes the last commit's finished jobs, then writes its own: when that write
    fails, the database rolls back at once and the deleted jobs are back, so they must be back
    in the index's sight at once too, not when the session is rolled back or closed (else they
    hold their rows meanwhile, or for the rest of their lease: a commit of one of their rows
    could not be born leased, and waited for the retrier)."""
    if tables.dialect.name != "sqlite":
        pytest.skip("PostgreSQL: the timer deletes finished jobs (a flush there does not)")
    idx, factory = _a_finished_job(installed)
    later = idx.processor.later
    (first,) = jobs(tables)
    enqueue = outbox.enqueue

    def failing(conn: Any, keys: Any, **kw: Any) -> Any:
        raise sa.exc.OperationalError("INSERT INTO semantic_outbox", {}, Exception("disk I/O"))

    monkeypatch.setattr(outbox, "enqueue", failing)
    with factory() as s:
        art = s.get(Article, 1)
        assert art is not None
        art.content = "never committed"
        with pytest.raises(sa.exc.OperationalError):
            s.commit()  # its flush took the finished job, then failed
        # the database has rolled back (the session's transaction waits for rollback()):
        # the job is in the outbox again, and in the index's sight again at once
        assert [j.id for j in later.waiting(tables)] == [first["id"]]
        assert [job["id"] for job in jobs(tables)] == [first["id"]]
    assert [j.id for j in later.waiting(tables)] == [first["id"]]  # given back once
    monkeypatch.setattr(outbox, "enqueue", enqueue)
    second = "a row about lakes and seas"
    with factory() as s:
        art = s.get(Article, 1)
        assert art is not None
        art.content = second
        s.commit()
    assert [p["end_offset"] for p in points_of(idx, 1)] == [len(second)]  # by its commit
    idx.settle()
    assert jobs(tables) == []


def test_a_savepoints_flush_takes_the_finished_jobs_and_its_rollback_gives_them_back(
    tables: Engine, installed: Any
) -> None:
    """A row written again inside a savepoint right after its last commit is synced by that
    commit: the savepoint's flush deletes the finished job whose lease still held the row. A
    savepoint, or the transaction around a released one, that rolls back undoes the deletion
    and gives the job back once the transaction has ended (not before: it holds the database);
    it is settled later all the same."""
    if tables.dialect.name != "sqlite":
        pytest.skip("PostgreSQL: the timer deletes finished jobs (a flush there does not)")
    idx, factory = _a_finished_job(installed)
    later = idx.processor.later
    first = jobs(tables)
    assert len(first) == 1 and [j.id for j in later.waiting(tables)] == [first[0]["id"]]

    def seen_by(s: orm.Session) -> list[dict[str, Any]]:
        """The outbox as the session's own transaction sees it."""
        rows = s.connection().execute(select(outbox.outbox).order_by(outbox.outbox.c.id))
        return [dict(r._mapping) for r in rows]

    with factory() as s:
        art = s.get(Article, 1)
        assert art is not None
        savepoint = s.begin_nested()
        art.content = "undone with the savepoint"
        s.flush()
        assert first[0] not in seen_by(s) and later.waiting(tables) == []  # taken
        savepoint.rollback()
        assert first[0] in seen_by(s) and later.waiting(tables) == []  # back at the end
        s.commit()
    assert jobs(tables) == first and len(later.waiting(tables)) == 1

    def in_a_savepoint(s: orm.Session, text: str) -> None:
        with s.begin_nested():
            art = s.get(Article, 1)
            assert art is not None
            art.content = text

    with factory() as s:
        in_a_savepoint(s, "undone with the transaction")
        assert first[0] not in seen_by(s) and later.waiting(tables) == []
        s.rollback()
    assert jobs(tables) == first and len(later.waiting(tables)) == 1
    with factory() as s:
        in_a_savepoint(s, "a text about lakes, written in a savepoint")
        s.commit()
    assert assert_index_matches_database(tables, idx.store) == 1  # at once: no retry needed
    left = jobs(tables)
    assert len(left) == 1 and left != first  # the first job went with the commit: its own now
    idx.settle()
    assert jobs(tables) == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_process_has_its_own_token_and_none_of_its_parents_finished_jobs(
    tables: Engine, installed: Any
) -> None:
    """A server that loads the app, commits, then forks its workers: a worker's leases carry
    its own pid (what finds a dead process's leases), and it never settles, at exit or
    otherwise, the finished jobs its parent still holds (as its own they would be lost and
    queued again; under the parent's token, deleted behind its back)."""
    idx, factory = installed()
    idx.processor.later.delay = 60.0
    with factory() as s:
        s.add(Article(id=1, title="t", content="a row about rivers"))
        s.commit()
    before = jobs(tables)
    assert len(before) == 1 and before[0]["claimed_by"] == idx.token

    def exit_in_the_child() -> list[Any]:
        seen = [idx.token, idx.processor.token, len(idx.processor.later.waiting(tables))]
        processing._settle_at_exit()  # what the child's exit would run
        return seen

    pid, (token, processor_token, waiting) = in_a_forked_child(exit_in_the_child)
    assert token == processor_token != idx.token and f":{pid}:" in token
    assert waiting == 0
    assert jobs(tables) == before  # the parent's job: untouched by the child
    assert [j.id for j in idx.processor.later.waiting(tables)] == [before[0]["id"]]
    idx.settle()
    assert jobs(tables) == []


class _Defaults(orm.DeclarativeBase):
    pass


class Draft(SemanticSearchMixin, _Defaults):
    """A semantic column the database fills in when the insert leaves it out (not fetched by
    the insert: the attribute is expired, its value unknown to the session until loaded)."""

    __tablename__ = "draft"
    id: Mapped[int] = mapped_column(primary_key=True)
    content: Mapped[str | None] = mapped_column(
        SemanticText(chunk_size=200, overlap=40), server_default="a default text about lakes"
    )
    __mapper_args__: ClassVar[dict[str, Any]] = {"eager_defaults": False}


class Trimmed(SemanticText):
    """A column type that stores the text trimmed: not what the session holds."""

    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> str | None:
        value = super().process_bind_param(value, dialect)
        return value.strip() if value is not None else None


class Clipping(SemanticSearchMixin, _Defaults):
    __tablename__ = "clipping"
    id: Mapped[int] = mapped_column(primary_key=True)
    content: Mapped[str | None] = mapped_column(Trimmed(chunk_size=200, overlap=40))


def test_a_row_flushed_twice_in_one_transaction_is_synced_by_its_commit(
    tables: Engine, installed: Any
) -> None:
    """The second flush of a row (autoflush) finds the first one's job leased to this index:
    that lease holds nothing back (both are synced in one pass after the commit), so its job is
    born leased too and the commit syncs the row at once (no job left for the retrier)."""
    idx, factory = installed()
    idx.processor.later.delay = 60.0  # the finished jobs wait: the outbox shows them
    last = "second text, about lakes"
    with factory() as s:
        art = Article(id=1, title="t", content="first text, about rivers")
        s.add(art)
        s.flush()
        art.content = last
        s.flush()
        s.commit()
    born = jobs(tables)
    assert len(born) == 2 and all(j["claimed_by"] == idx.token for j in born)
    assert [p["end_offset"] for p in points_of(idx, 1)] == [len(last)]
    idx.settle()
    assert jobs(tables) == []


def test_born_jobs_whose_lease_ran_out_before_the_commit_are_claimed_first(
    tables: Engine, installed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction that commits after its jobs' birth leases ran out (or nearly: a quarter
    of the lease, 5 s at most) does not sync them as its own: another processor may have
    claimed them meanwhile. They are claimed by id like jobs born unclaimed. A birth passes
    only the earlier jobs of its own keys (the list it sends stays the size of its keys)."""
    idx, factory = installed(lease=1.0)
    passes: list[tuple[int, int]] = []
    process = idx.processor.process

    def spy(engine: Any, **kw: Any) -> Any:
        if "claimed" in kw or "ids" in kw:  # a commit's (not the background retrier's)
            passes.append((len(kw.get("claimed") or []), len(kw.get("ids") or [])))
        return process(engine, **kw)

    monkeypatch.setattr(idx.processor, "process", spy)
    sent: list[list[int]] = []
    enqueue = outbox.enqueue

    def spy_enqueue(conn: Any, keys: Any, **kw: Any) -> Any:
        sent.append(list(kw.get("ours", ())))
        return enqueue(conn, keys, **kw)

    monkeypatch.setattr(outbox, "enqueue", spy_enqueue)
    with factory() as s:
        s.add(Article(id=1, title="t", content="a row about rivers"))
        s.flush()
        s.add(Article(id=2, title="t", content="a row about lakes"))
        s.flush()
        time.sleep(1.1)  # past the lease: claimed (within its last quarter: left to the retrier)
        s.commit()
    assert passes == [(0, 2)]
    assert sent == [[], []]  # no earlier job of rows 1 and 2
    assert_index_matches_database(tables, idx.store)
    passes.clear()
    with factory() as s:
        s.add(Article(id=3, title="t", content="a row about the sea"))
        s.commit()
    assert passes == [(1, 0)]  # in time: synced as born


def test_finished_jobs_hold_no_row_while_their_lease_holds_and_outlive_a_failed_settle(
    tables: Engine, installed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A synced job waiting to be deleted passes a later birth of its row only while its own
    birth lease holds (one that ran out may have been claimed again, even by this index); a
    timer settle that fails keeps the jobs and tries again later, instead of leaving them to
    hold their rows until their leases end."""
    idx, factory = installed()
    later = idx.processor.later
    later.delay = 60.0
    with factory() as s:
        s.add(Article(id=1, title="t", content="a row about rivers"))
        s.commit()
    (waiting,) = later.waiting(tables)
    assert waiting.lease_end is not None
    with tables.connect() as conn:
        assert idx._finished(conn) == [waiting]
        later.take(tables)
        later.add(tables, [replace(waiting, lease_end=time.monotonic() + 1.0)])  # ending
        assert idx._finished(conn) == []
    calls: list[int] = []

    def broken(conn: Any, jobs: Any, token: str, watch: float) -> Any:
        calls.append(len(jobs))
        raise sa.exc.OperationalError("DELETE", {}, Exception("the database went away"))

    original = processing._settle_done
    monkeypatch.setattr(processing, "_settle_done", broken)
    later.flush(tables)
    assert calls == [1] and [j.id for j in later.waiting(tables)] == [waiting.id]
    monkeypatch.setattr(processing, "_settle_done", original)
    later.flush(tables)
    assert later.waiting(tables) == [] and jobs(tables) == []
    with factory() as s:  # once closed, a failed settle leaves its jobs to their leases
        s.add(Article(id=2, title="t", content="a row about lakes"))
        s.commit()
    monkeypatch.setattr(processing, "_settle_done", broken)
    later.close()
    assert calls == [1, 1] and later.waiting(tables) == []


def test_an_inline_commit_indexes_the_text_its_flush_wrote_without_reading_it_back(
    tables: Engine, installed: Any
) -> None:
    """Jobs born leased to the committing index are synced with the text the flush sent: no
    later commit's job for those rows can run before they are settled, so it is the rows'."""
    idx, factory = installed()
    idx.processor.later.delay = 60.0  # no timer racing the next flush for the finished jobs
    with reads_of(tables, "article") as seen, factory() as s:
        rows = [Article(id=i, title="t", content=f"row {i} about rivers") for i in (1, 2, 3)]
        s.add_all(rows)
        s.commit()
        rows[1].content = "row 2 is about lakes now"  # loaded: no SELECT of the session's
        s.add(Article(id=4, title="t", content=None))
        s.commit()
        rows[2].content = "row 3, written by a first flush"
        s.flush()
        rows[0].content = "row 1, written by a second flush"  # (its jobs' statements do not
        s.commit()  # make the first flush's texts unknown)
    assert seen == []  # no commit read its rows back
    assert [p["end_offset"] for p in points_of(idx, 2)] == [len("row 2 is about lakes now")]
    assert assert_index_matches_database(tables, idx.store) == 3


def test_what_a_flush_wrote_is_trusted_for_half_the_birth_lease(
    tables: Engine, installed: Any
) -> None:
    """A transaction that commits long after its flush is read back: its jobs' leases may have
    run out meanwhile, and another pass may have synced a newer value."""
    idx, factory = installed(lease=2.0)  # trusted for 1 s: far above a flush-to-commit stall
    with reads_of(tables, "article") as seen:
        for i, wait in ((1, 0.0), (2, 1.3)):
            with factory() as s:
                s.add(Article(id=i, title="t", content=f"row {i} about rivers"))
                s.flush()
                time.sleep(wait)
                s.commit()
            assert bool(seen) == (wait > 1.0)
    assert assert_index_matches_database(tables, idx.store) == 2


def test_rows_the_database_or_a_later_statement_changed_are_read_back(
    tables: Engine, installed: Any
) -> None:
    """What a flush cannot vouch for is read back after the commit: rows of a transaction
    that ran a statement after its flush (a text UPDATE, one returning rows), that deleted a
    row (a database cascade, a row replaced within one flush), a server default the insert did
    not fetch, a column type that changes what it binds. A savepoint keeps what it knew."""
    foreign_keys_on(tables)
    _Defaults.metadata.create_all(tables)
    idx, factory = installed()
    idx.processor.later.delay = 60.0  # no timer racing the next flush for the finished jobs
    with reads_of(tables, "article") as seen:

        def read_back(expected: bool) -> None:
            """Whether the last commit read its articles back."""
            assert bool(seen) == expected
            assert_index_matches_database(tables, idx.store)
            assert_index_matches_database(tables, idx.store, Comment, "body", "comment__body")
            seen.clear()  # the check's own SELECT too

        with factory() as s:
            one = Article(id=1, title="t", content="a text about rivers")
            two = Article(id=2, title="t", content="flushed first")
            three = Article(id=3, title="t", content="an article with a comment")
            s.add_all([one, two, three])
            s.flush()
            s.execute(
                sa.text("UPDATE article SET title = 'x', content = :c WHERE id = 2"),
                {"c": "then changed by a statement"},
            )
            s.commit()
        read_back(True)
        with factory() as s:
            s.add(one)
            one.content = "flushed, then"
            s.flush()
            s.execute(
                sa.text("UPDATE article SET content = :c WHERE id = 1 RETURNING id").columns(
                    id=sa.Integer
                ),
                {"c": "changed by a statement that returns rows"},
            ).all()
            s.commit()
        read_back(True)
        with factory() as s:
            s.add(Comment(id=1, article_id=3, body="a comment about lakes"))
            s.flush()
            s.delete(s.merge(three, load=False))  # the database deletes the comment
            s.commit()
        read_back(True)
        with factory() as s:
            s.delete(s.merge(two, load=False))
            s.add(Article(id=2, title="t", content="a row that took the same key"))
            s.commit()  # one flush: an UPDATE of row 2
        read_back(True)
        with factory() as s:
            art = s.merge(one, load=False)
            art.content = "kept by the outer transaction"
            s.flush()
            savepoint = s.begin_nested()
            art.content = "undone with the savepoint"
            s.flush()
            savepoint.rollback()
            s.commit()
        read_back(False)
        with factory() as s:  # the savepoint's flush deletes the last commit's finished job
            art = s.merge(one, load=False)
            with s.begin_nested():
                art.content = "written inside a savepoint that was released"
                s.flush()
            s.commit()
        read_back(False)
    with tables.connect() as conn:
        texts = dict(conn.execute(select(Article.id, Article.content)).all())
    assert texts == {
        1: "written inside a savepoint that was released",
        2: "a row that took the same key",
    }
    with factory() as s:
        s.add(Draft(id=1))  # the database writes the text
        s.add(Clipping(id=1, content="  a padded text about rivers  "))  # stored trimmed
        s.commit()
    assert assert_index_matches_database(tables, idx.store, Draft, collection="draft__content") == 1
    assert (
        assert_index_matches_database(tables, idx.store, Clipping, collection="clipping__content")
        == 1
    )


def test_sigkill_before_finished_jobs_are_deleted_loses_nothing(
    tables: Engine, tmp_path: Path
) -> None:
    """A process dies after its commit synced but before the jobs were deleted: another
    process takes the dead leases over, finds the rows up to date, and empties the outbox."""
    vectors = tmp_path / "vectors"
    url = tables.url.render_as_string(hide_password=False)
    script = f"""
import os, signal, sys
sys.path.insert(0, {str(ROOT)!r})
from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker
from semantic_orm import EdgeStore, SemanticIndex
from semantic_orm.testing import HashEmbedder
from tests.models import Article

engine = create_engine({url!r})
index = SemanticIndex(store=EdgeStore({str(vectors)!r}), embedder=HashEmbedder())
index.processor.later.delay = 600
Session = sessionmaker(engine)
index.install(Session)
with Session() as s:
    s.add_all(Article(title=f"r{{i}}", content=f"row {{i}} about lakes") for i in range(3))
    s.commit()
index.store.close()
print("synced", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()
    assert b"synced" in done.stdout
    left = jobs(tables)
    assert len(left) == 3 and all(j["claimed_by"] for j in left)  # synced, not deleted yet
    store = EdgeStore(vectors)
    assert store.count(COLL) == 3
    idx = SemanticIndex(store=store, embedder=HashEmbedder(), models=Base)
    idx.drain(tables, timeout=30)
    assert jobs(tables) == []
    assert assert_index_matches_database(tables, store) == 3
    store.close()


def test_concurrent_writers_and_workers_converge(postgresql_url: Any, tmp_path: Path) -> None:
    """Writers update and delete the same rows in random order while two workers drain."""
    from sqlalchemy import create_engine

    engine = create_engine(postgresql_url, pool_size=10)
    Base.metadata.create_all(engine)
    store = EdgeStore(tmp_path / "vectors")
    writer_index = SemanticIndex(store=store, embedder=HashEmbedder(), mode="deferred")
    factory = sessionmaker(engine)
    writer_index.install(factory)
    with factory() as s:
        s.add_all(Article(id=i, title="t", content=f"start {i}") for i in range(1, 21))
        s.commit()
    workers = [
        Worker(
            SemanticIndex(store=store, embedder=HashEmbedder(), models=Base),
            engine,
            batch_size=8,
            poll_interval=0.001,
        ).start()
        for _ in range(2)
    ]
    errors: list[BaseException] = []

    def write(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for n in range(60):
                with factory() as s:
                    pk = rng.randint(1, 20)
                    art = s.get(Article, pk, with_for_update=True)
                    if art is None:
                        s.add(Article(id=pk, title="again", content=f"back {seed} {n}"))
                    elif rng.random() < 0.2:
                        s.delete(art)
                    else:
                        art.content = " ".join([f"w{seed}x{n}"] * rng.randint(1, 80))
                    try:
                        s.commit()
                    except IntegrityError:  # two writers re-inserted the same row: one wins
                        s.rollback()
        except BaseException as exc:
            errors.append(exc)

    try:
        threads = [threading.Thread(target=write, args=(seed,)) for seed in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        writer_index.drain(engine, timeout=60)
    finally:
        for w in workers:
            w.stop()
    assert sum(w.processed for w in workers) > 0
    assert settled(engine) == []
    assert assert_index_matches_database(engine, store) > 0
    store.close()
    engine.dispose()


def _wal_engine(path: Any) -> Engine:
    engine = pysqlite_recipe(sa.create_engine(f"sqlite:///{path}"))

    @sa.event.listens_for(engine, "connect")
    def _wal(dbapi_conn: Any, record: Any) -> None:
        dbapi_conn.execute("PRAGMA journal_mode=WAL")

    return engine


def test_sqlite_worker_under_steady_writes_fails_no_app_commit(tmp_path: Any) -> None:
    engine = _wal_engine(tmp_path / "wal.sqlite3")
    Base.metadata.create_all(engine)

    class Slow(HashEmbedder):
        def encode(self, texts: Any) -> Any:
            time.sleep(0.02)
            return super().encode(texts)

    idx = SemanticIndex(store=MemoryStore(), embedder=Slow(), mode="deferred")
    factory = sessionmaker(engine)
    idx.install(factory)
    with factory() as s:
        s.add_all(Article(id=i, title="t", content=f"start {i}") for i in range(1, 11))
        s.commit()
    failures: list[str] = []
    stop = threading.Event()

    def app() -> None:
        n = 0
        while not stop.is_set() and n < 150:
            try:
                with factory() as s:
                    art = s.get(Article, 1 + n % 10)  # read, then write: the fragile kind
                    assert art is not None
                    art.content = f"version {n} of the text"
                    s.add(Article(title="new", content=f"new row {n}"))
                    s.commit()
            except Exception as exc:
                failures.append(repr(exc))
            n += 1

    worker = Worker(idx, engine, poll_interval=0.005, batch_size=16).start()
    writer = threading.Thread(target=app)
    writer.start()
    writer.join(120)
    stop.set()
    processed_during = worker.processed
    worker.stop()
    assert failures == []
    assert processed_during > 0
    idx.drain(engine, timeout=60)
    assert_index_matches_database(engine, idx.store)
    idx.uninstall(factory)
    engine.dispose()


def test_a_rejected_write_is_permanent_on_both_adapters(installed: Any) -> None:
    idx, factory = installed(flaky=True, mode="deferred", max_attempts=2, retry_base=0)
    with factory() as s:
        s.add(Article(id=1, title="t", content="the store refuses this"))
        s.commit()
    idx.store.reject = True
    report = idx.drain(factory.kw["bind"], timeout=10)
    assert report.dead == 1
    (job,) = jobs(factory.kw["bind"])
    assert job["dead"] and job["failures"] == 2


@pytest.mark.parametrize("adapter", ["edge", "client"])
def test_wrong_dimension_is_dead_lettered_and_drain_names_what_is_stuck(
    engine: Engine, tmp_path: Any, adapter: str
) -> None:
    if adapter == "client" and Version(version("qdrant-client")) < Version("1.19"):
        pytest.skip("qdrant-client's local mode took a vector of the wrong size before 1.19")
    Base.metadata.create_all(engine)
    store: Any = (
        EdgeStore(tmp_path / "v") if adapter == "edge" else QdrantClientStore(location=":memory:")
    )

    class Liar(HashEmbedder):
        """Says 64 dimensions, produces 32: the store refuses every vector."""

        def encode(self, texts: Any) -> Any:
            return super().encode(texts)[:, :32]

    idx = SemanticIndex(
        store=store, embedder=Liar(64), mode="deferred", max_attempts=3, retry_base=0
    )
    factory = sessionmaker(engine)
    idx.install(factory)
    with factory() as s:
        s.add(Article(id=1, title="t", content="wrong size"))
        s.commit()
    report = idx.drain(engine, timeout=20)
    assert report.dead == 1
    idx.uninstall(factory)
    flaky = FlakyStore(store)
    stuck = SemanticIndex(store=flaky, embedder=HashEmbedder(), mode="deferred", retry_base=0)
    stuck.install(factory)
    with factory() as s:
        s.add(Article(id=2, title="t", content="never reaches a store that is down"))
        s.commit()
    flaky.down = True
    with pytest.raises(
        TimeoutError, match=r"1 jobs still pending.*article\.content 2.*unreachable"
    ):
        stuck.drain(engine, timeout=1)
    stuck.uninstall(factory)
    store.close()


def test_only_permanent_failures_count_towards_dead_letters(installed: Any) -> None:
    idx, factory = installed(flaky=True, mode="deferred", max_attempts=2, retry_base=0)
    engine = factory.kw["bind"]
    with factory() as s:
        s.add(Article(id=1, title="t", content="patience"))
        s.commit()
    idx.store.down = True
    for _ in range(4):
        idx.process(engine)
    idx.store.down = False
    idx.store.reject = True
    idx.process(engine)
    (job,) = jobs(engine)
    assert job["attempts"] == 5 and job["failures"] == 1 and not job["dead"]
    idx.store.reject = False
    idx.drain(engine, timeout=10)
    assert settled(engine) == [] and idx.store.count(COLL) == 1


def test_dead_letters_remove_old_points_and_clear_when_a_later_job_succeeds(
    installed: Any,
) -> None:
    idx, factory = installed(embedder=PoisonEmbedder(), max_attempts=1, retry_base=0)
    engine = factory.kw["bind"]
    with factory() as s:
        art = Article(id=1, title="t", content="healthy text at first")
        s.add(art)
        s.commit()
        assert idx.store.count(COLL) == 1
        art.content = "now this row is POISON"
        s.commit()
        idx.settle()  # the first commit's finished job (it waits a moment to be deleted)
        (dead,) = jobs(engine)
        assert dead["dead"]
        assert payloads(idx.store, 1) == []  # the old text's points are gone
        art.content = "healthy again"
        s.commit()
    assert settled(engine) == []  # the later success cleared the dead job
    assert_index_matches_database(engine, idx.store)


def test_a_pass_whose_settle_failed_is_settled_by_the_next(
    tables: Engine, installed: Any, store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass that synced its rows but whose settle the database refused leaves them to the
    next pass, which settles them first: they are not left leased to this process until their
    leases end (300 s: drain() timed out, and a failure went unrecorded that long)."""
    idx, factory = installed(flaky=True, mode="deferred", retry_base=60)
    with factory() as s:
        s.add(Article(id=1, title="t", content="rivers"))
        s.commit()
    tries = settle_fails_once(monkeypatch)
    with pytest.raises(sa.exc.OperationalError, match="locked"):
        idx.process(tables)
    (job,) = jobs(tables)
    assert job["claimed_by"] == idx.token and store.count(COLL) == 1  # synced, not settled
    report = idx.drain(tables, timeout=5)
    assert tries == [1, 1] and report.claimed == 0 and jobs(tables) == []

    with factory() as s:  # a failed sync whose settle fails too
        s.add(Article(id=2, title="t", content="lakes"))
        s.commit()
    idx.store.down = True
    tries.clear()
    with pytest.raises(sa.exc.OperationalError):
        idx.process(tables)
    assert not idx.process(tables).claimed  # settles the first pass: records its failure
    (job,) = jobs(tables)
    assert job["attempts"] == 1 and job["claimed_by"] is None and "down" in job["last_error"]
    idx.store.down = False
    with tables.begin() as conn:  # due now (not in 60 s)
        conn.execute(update(outbox.outbox).values(next_attempt_at=outbox.utcnow()))
    idx.drain(tables, timeout=10)
    assert_index_matches_database(tables, store)


def _soon(check: Any, timeout: float = 10.0) -> bool:
    """Whether ``check()`` comes true within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_jobs_an_earlier_run_left_are_synced_by_a_process_that_does_not_write(
    tables: Engine, store: Any
) -> None:
    """A process killed between a commit and its sync leaves jobs; the next run's retrier looks
    for them at install (a factory bound to the engine) or at its first transaction, not only
    once it commits (an app that only read kept those rows out of the index)."""
    earlier = SemanticIndex(store=store, embedder=HashEmbedder(), mode="deferred")
    earlier_factory = sessionmaker(tables)
    earlier.install(earlier_factory)
    with earlier_factory() as s:
        s.add(Article(id=1, title="t", content="the crash lost this sync"))
        s.commit()
    earlier.uninstall(earlier_factory)
    unbound = sessionmaker()  # (Flask-SQLAlchemy style: the engine is known per session)
    idx = SemanticIndex(store=store, embedder=HashEmbedder())
    idx.install(unbound)
    try:
        time.sleep(0.3)
        assert store.count(COLL) == 0  # nothing knows the engine yet
        with unbound(bind=tables) as s:
            s.execute(select(1))  # a read
        assert _soon(lambda: store.count(COLL) == 1 and not jobs(tables))
    finally:
        idx.uninstall(unbound)
    earlier.install(earlier_factory)
    with earlier_factory() as s:
        s.add(Article(id=2, title="t", content="another one"))
        s.commit()
    earlier.uninstall(earlier_factory)
    bound = sessionmaker(tables)
    again = SemanticIndex(store=store, embedder=HashEmbedder())
    again.install(bound)  # and nothing else
    try:
        assert _soon(lambda: store.count(COLL) == 2 and not jobs(tables))
    finally:
        again.uninstall(bound)
    assert_index_matches_database(tables, store)
