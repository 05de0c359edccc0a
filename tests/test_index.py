"""The index as installed in an application: what it installs on, where its outbox goes, and
how its commits sync (inline, after a durable commit; never inside a transaction it does not own).

SQLite (files and memory) and PostgreSQL, both store adapters, the fake embedder.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session as OrmSession
from sqlalchemy.orm import sessionmaker
from sqlalchemy.pool import StaticPool

from semantic_orm import (
    ConfigurationError,
    EdgeStore,
    SemanticIndex,
    SemanticTypeError,
    outbox,
    signals,
)
from semantic_orm.applying import ApplyReport, Outage
from semantic_orm.exc import VectorStoreError
from semantic_orm.search import asemantic_search
from semantic_orm.testing import FlakyStore, HashEmbedder, MemoryStore

from .helpers import (
    COLL,
    LONG,
    assert_index_matches_database,
    async_url,
    jobs,
    points_of,
    pysqlite_recipe,
    settled,
)
from .models import Article, Base, Note


def test_install_is_explicit_scoped_and_removable(
    engine: Any, index: SemanticIndex, hash_embedder: HashEmbedder
) -> None:
    from .models import Base

    Base.metadata.create_all(engine)
    plain_factory = sessionmaker(engine)
    synced_factory = sessionmaker(engine)
    index.install(synced_factory)
    index.install(synced_factory)  # twice is harmless
    with plain_factory() as s:
        s.add(Article(title="a", content="never indexed"))
        s.commit()
    assert index.store.count(COLL) == 0
    with synced_factory() as s:
        s.add(Article(title="b", content="indexed once"))
        s.commit()
    assert index.store.count(COLL) == 1
    assert hash_embedder.texts_encoded == 1
    index.uninstall(synced_factory)
    with synced_factory() as s:
        s.add(Article(title="c", content="after uninstall"))
        s.commit()
    assert index.store.count(COLL) == 1
    # a single Session can be tracked too
    with OrmSession(engine) as s:
        index.install(s)
        s.add(Article(title="d", content="single session"))
        s.commit()
        index.uninstall(s)
    assert index.store.count(COLL) == 2


def test_another_index_on_the_same_factory_is_refused(
    engine: Any, index: SemanticIndex, store: Any
) -> None:

    factory = sessionmaker(engine)
    index.install(factory)
    with pytest.raises(ConfigurationError, match="already installed"):
        SemanticIndex(store=store, embedder=HashEmbedder()).install(factory)
    index.uninstall(factory)


def test_targets_sharing_sessions_take_one_index(
    engine: Any, index: SemanticIndex, store: Any
) -> None:
    """Two listen targets that share sessions would both stage each write: refused, whichever
    comes first and whether the index is the same or another."""

    class Custom(OrmSession):  # not Session itself: other tests' factories may be installed
        pass

    Base.metadata.create_all(engine)
    other = SemanticIndex(store=MemoryStore(), embedder=HashEmbedder())
    factory = sessionmaker(engine, class_=Custom)
    index.install(factory)
    try:
        with factory() as s:
            for idx in (index, other):  # one of the factory's sessions
                with pytest.raises(ConfigurationError, match=r"a sessionmaker \(of .*Custom"):
                    idx.install(s)
            art = Article(title="a", content="queued once")
            s.add(art)
            s.commit()
            key = art.id
        with pytest.raises(
            ConfigurationError, match=r"sessions of the Session subclass .*Custom.*queue every"
        ):
            other.install(Custom)  # the class the factory's sessions derive from
        assert settled(engine) == [] and len(points_of(index, key)) == 1
        assert other.store.count(COLL) == 0
    finally:
        index.uninstall(factory)
    # in the other order: a session first, then its class
    with Custom(engine) as s:
        other.install(s)
        try:
            with pytest.raises(ConfigurationError, match="one Session"):
                index.install(Custom)
        finally:
            other.uninstall(s)
    # unrelated targets stay independent: two factories, one index each
    second = sessionmaker(engine, class_=Custom)
    index.install(factory)
    other.install(second)
    try:
        with second() as s:
            s.add(Article(title="b", content="the other index"))
            s.commit()
        assert other.store.count(COLL) == 1
    finally:
        index.uninstall(factory)
        other.uninstall(second)
    # a factory dropped without uninstall holds nothing back once collected
    dropped = sessionmaker(engine, class_=Custom)
    other.install(dropped)
    del dropped
    index.install(Custom)
    index.uninstall(Custom)


def test_every_new_factory_is_listened_on_even_if_never_uninstalled(sqlite_url: Any) -> None:
    """A factory per request or tenant, installed and dropped without ``uninstall()``: each new
    one is tracked. (SQLAlchemy keys its record of listeners by ``id(target)``, which a dead
    factory's class hands to a new one: a check through ``event.contains`` skipped those.)"""
    engine = sa.create_engine(sqlite_url)
    Base.metadata.create_all(engine)
    idx = SemanticIndex(store=MemoryStore(), embedder=HashEmbedder())
    seen: set[int] = set()
    reused = 0
    gc.collect()
    gc.freeze()  # the collections below then scan what this test made, not the suite's heap
    try:
        for n in range(200):
            factory = sessionmaker(engine)
            reused += id(factory.class_) in seen
            seen.add(id(factory.class_))
            idx.install(factory)
            with factory() as s:  # the tracker's before_flush refuses what cannot be indexed
                s.add(Article(title="t", content=12345))  # type: ignore[arg-type]
                with pytest.raises(SemanticTypeError, match="content"):
                    s.flush()
            del factory, s
            if n % 5 == 0:
                gc.collect()
        assert reused  # the case the test is for did happen
    finally:
        gc.unfreeze()
        idx.close()
        engine.dispose()


def test_an_index_dropped_without_close_ends_its_retry_thread(sqlite_url: Any) -> None:
    """The background retrier holds its index weakly, also while it waits: an index dropped
    without ``close()`` is collected and its thread ends."""
    engine = sa.create_engine(sqlite_url)
    Base.metadata.create_all(engine)
    idx = SemanticIndex(store=MemoryStore(), embedder=HashEmbedder())
    factory = sessionmaker(engine)
    idx.install(factory)
    with factory() as s:
        s.add(Article(title="t", content="wakes the retrier"))
        s.commit()
    thread = idx._retry._thread
    assert thread is not None and thread.is_alive()
    gone = weakref.ref(idx)
    del idx, factory, s
    deadline = time.monotonic() + 10
    while (gone() is not None or thread.is_alive()) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    assert gone() is None and not thread.is_alive()
    engine.dispose()


def test_an_application_after_commit_that_raises_does_not_hide_the_commit(
    engine: Any, index: SemanticIndex
) -> None:
    """A listener registered before the index's that raises in ``after_commit`` (the database
    has committed by then): the commit is still synced when the session ends."""
    Base.metadata.create_all(engine)
    factory = sessionmaker(engine)

    @sa.event.listens_for(factory, "after_commit")
    def fails(session: Any) -> None:
        raise RuntimeError("the application's listener")

    index.install(factory)
    try:
        with factory() as s:
            art = Article(title="t", content="committed, then a listener fails")
            s.add(art)
            with pytest.raises(RuntimeError, match="application's listener"):
                s.commit()
            key = art.id
        assert len(points_of(index, key)) == 1
        assert settled(engine) == []
    finally:
        index.uninstall(factory)


def test_store_outage_keeps_the_commit_and_the_job(engine: Any, installed: Any) -> None:
    idx, factory = installed(flaky=True, retry_base=0.01)
    flaky = idx.store
    failures: list[dict[str, Any]] = []

    def on_fail(sender: Any, **kw: Any) -> None:
        failures.append({"sender": sender, **kw})

    with signals.sync_failed.connected_to(on_fail):
        flaky.down = True
        with factory() as s:
            art = Article(title="t", content=LONG)
            s.add(art)
            s.commit()  # does not raise
        with factory() as s:
            assert s.get(Article, art.id) is not None
        (job,) = jobs(engine)
        # the background retrier may already have tried again (retry_base is 0.01 s)
        assert job["row_pk"] == str(art.id) and job["attempts"] >= 1 and not job["dead"]
        assert "unreachable" in job["last_error"]
        assert failures and failures[0]["sender"] is Article
        assert failures[0]["pks"] == [str(art.id)]
        flaky.down = False
        idx.drain(engine, timeout=10)
    assert settled(engine) == []
    assert len(points_of(idx, art.id)) > 1
    with factory() as s:
        (hit,) = Article.semantic_search(s, "topic number 7", limit=1)
        assert hit.obj.id == art.id


class CountingStore(FlakyStore):
    """A :class:`FlakyStore` that counts the calls that reach it."""

    calls = 0

    def _check(self, write: bool = False) -> None:
        self.calls += 1
        super()._check(write)


def test_commits_do_not_wait_on_a_store_found_unreachable(engine: Any, store: Any) -> None:
    """Once a commit's sync found the store unreachable, later commits (each would wait for
    the store's timeout) leave their rows to the retrier at once; once an attempt gets through,
    commits sync inline again. Nothing is lost."""
    Base.metadata.create_all(engine)
    counting = CountingStore(store)
    idx = SemanticIndex(store=counting, embedder=HashEmbedder(), retry_base=2.0)
    factory = sessionmaker(engine, expire_on_commit=False)
    idx.install(factory)
    try:
        counting.down = True
        with factory() as s:
            first = Article(title="first", content="the store is down now")
            s.add(first)
            s.commit()
        tried = counting.calls
        assert tried >= 1
        with factory() as s:
            rows = [
                Article(title=f"r{i}", content=f"written during the outage {i}") for i in range(3)
            ]
            for row in rows:
                s.add(row)
                s.commit()  # each commit's sync fails at once, without calling the store
        assert counting.calls == tried
        waiting = jobs(engine)
        assert {j["row_pk"] for j in waiting} == {str(a.id) for a in (first, *rows)}
        assert all("unreachable" in j["last_error"] and not j["dead"] for j in waiting)
        counting.down = False
        idx.drain(engine, timeout=30)  # a background attempt: it goes to the store
        assert settled(engine) == []
        assert_index_matches_database(engine, counting)
        with factory() as s:  # the outage is over: a commit syncs inline again
            late = Article(title="late", content="after the outage")
            s.add(late)
            s.commit()
        assert len(points_of(idx, late.id)) == 1
    finally:
        idx.uninstall(factory)


def test_searches_fail_fast_while_the_store_is_down(engine: Any, store: Any) -> None:
    """A search that finds the store unreachable starts an outage (shared with the syncs):
    searches meanwhile fail at once, without calling it (each would wait for the store's
    timeout), sync and async alike, and so do commits' syncs; past the window one tries it
    again, and the first that gets through ends the outage. A sync's failure alone holds no
    search back. (Deferred mode: no background retrier calls the store meanwhile.)"""
    Base.metadata.create_all(engine)
    counting = CountingStore(store)
    idx = SemanticIndex(store=counting, embedder=HashEmbedder(), mode="deferred", retry_base=0.5)
    factory = sessionmaker(engine, expire_on_commit=False)
    idx.install(factory)
    outage = idx.applier.outage
    try:
        with factory() as s:
            s.add(Article(id=1, title="t", content="the store answers for now"))
            s.commit()
        idx.drain(engine, timeout=10)
        with factory() as s:
            s.add(Article(id=3, title="t", content="synced while it is down"))
            s.commit()
        counting.down = True
        idx.process(engine)  # a sync finds it down
        assert outage.since is not None
        counting.down = False  # back: the next search tries it, and ends the outage
        with factory() as s:
            assert [h.obj.id for h in Article.semantic_search(s, "store answers")] == [1]
        assert outage.since is None
        counting.down = True
        before = counting.calls
        with factory() as s:
            with pytest.raises(VectorStoreError, match="FlakyStore is down"):
                Article.semantic_search(s, "store answers")
            assert counting.calls == before + 1  # it tried, and found it down
            for _ in range(3):
                with pytest.raises(VectorStoreError, match="search again once it answers"):
                    Article.semantic_search(s, "store answers")
        asyncio.run(_async_search_fails_fast(engine, idx))
        # an inline commit's sync would fail at once too
        assert isinstance(outage.admit(True), VectorStoreError)
        assert counting.calls == before + 1
        time.sleep(0.55)  # past the window: a search tries the store again
        with factory() as s:
            with pytest.raises(VectorStoreError, match="FlakyStore is down"):
                Article.semantic_search(s, "store answers")
            assert counting.calls == before + 2
            counting.down = False
            with pytest.raises(VectorStoreError, match="search again"):  # (the window doubled)
                Article.semantic_search(s, "store answers")
            time.sleep(1.05)
            assert [h.obj.id for h in Article.semantic_search(s, "store answers")][:1] == [1]
        assert outage.since is None  # over
        idx.drain(engine, timeout=30)
        assert_index_matches_database(engine, counting)
    finally:
        idx.uninstall(factory)


async def _async_search_fails_fast(engine: Engine, idx: SemanticIndex) -> None:
    aengine = create_async_engine(async_url(engine.url))
    try:
        async with AsyncSession(aengine) as s:
            with pytest.raises(VectorStoreError, match="search again once it answers"):
                await asemantic_search(s, Article, "store answers", index=idx)
    finally:
        await aengine.dispose()


def test_an_outage_refuses_inline_syncs_for_a_doubling_while() -> None:
    """:class:`Outage`: inline syncs skip the store for a window after a failure (doubling,
    capped) and while another attempt is on its way; background attempts always go; past the
    window an inline sync tries itself; one that gets through ends the outage. A refused
    request or a drifted collection is no outage."""
    down = ApplyReport(failed=[([], VectorStoreError("connection refused"))])
    outage = Outage(first=0.5, cap=1.0)
    for reachable in (
        ApplyReport(),
        ApplyReport(failed=[([], VectorStoreError("bad request", transient=False))]),
        ApplyReport(failed=[([], ConfigurationError("drifted"))]),
    ):
        assert outage.admit(True) is None
        outage.record(reachable)
        assert outage.since is None
    assert outage.admit(True) is None
    outage.record(down)
    refused = outage.admit(True)
    assert isinstance(refused, VectorStoreError) and refused.transient
    assert "connection refused" in str(refused)
    assert outage.admit(False) is None  # the retrier's attempt goes ...
    assert outage.admit(True) is not None  # ... and inline syncs wait for it
    outage.record(down)  # it failed too: the window doubles (1.0 s)
    time.sleep(0.6)
    assert outage.admit(True) is not None
    time.sleep(0.5)
    assert outage.admit(True) is None  # past the window: an inline sync tries itself
    outage.record(ApplyReport())
    assert outage.since is None and outage.error is None
    assert outage.admit(True) is None
    outage.record(ApplyReport())


def test_a_later_commit_syncs_the_current_value_and_settles_older_jobs(
    engine: Any, installed: Any
) -> None:
    idx, factory = installed(flaky=True)
    flaky = idx.store
    with factory() as s:
        art = Article(title="t", content=LONG)
        s.add(art)
        flaky.down = True
        s.commit()
        assert len(jobs(engine)) == 1
        flaky.down = False
        art.content = "newest content"
        s.commit()
    assert settled(engine) == []
    (only,) = points_of(idx, art.id)
    assert only["end_offset"] == len("newest content")


def _memory_engine(pool: Any) -> Engine:
    if pool is StaticPool:
        return pysqlite_recipe(
            sa.create_engine(
                "sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False}
            )
        )
    return pysqlite_recipe(sa.create_engine("sqlite://"))  # SingletonThreadPool


@pytest.mark.parametrize("pool", [StaticPool, None], ids=["static", "singleton"])
def test_in_memory_sqlite_and_the_external_transaction_recipe(pool: Any) -> None:
    engine = _memory_engine(pool)
    Base.metadata.create_all(engine)
    idx = SemanticIndex(store=MemoryStore(), embedder=HashEmbedder())
    idx.install(OrmSession)  # the class the recipe's sessions use
    try:
        for _ in range(2):  # the second round finds no outbox created by the first
            conn = engine.connect()
            outer = conn.begin()
            s = OrmSession(bind=conn, join_transaction_mode="create_savepoint")
            s.add(Article(id=1, title="t", content="rolled back with the test"))
            s.commit()
            nested = s.begin_nested()
            s.add(Article(id=2, title="t", content="in a savepoint"))
            nested.rollback()
            s.close()
            outer.rollback()
            conn.close()
            assert idx.store.count(COLL) == 0
        with OrmSession(engine) as s:  # a real commit still works, and syncs
            s.add(Article(id=3, title="t", content="committed for real"))
            s.commit()
        assert idx.store.count(COLL) == 1
    finally:
        idx.uninstall(OrmSession)


def test_joined_external_transaction_on_a_server(engine: Engine, store: Any) -> None:
    Base.metadata.create_all(engine)
    idx = SemanticIndex(store=store, embedder=HashEmbedder())
    factory = sessionmaker(join_transaction_mode="create_savepoint")
    idx.install(factory)
    conn = engine.connect()
    outer = conn.begin()
    with factory(bind=conn) as s:
        s.add(Article(id=1, title="t", content="never committed"))
        s.commit()
    outer.rollback()
    conn.close()
    idx.drain(engine, timeout=10)
    assert store.count(COLL) == 0 and settled(engine) == []
    idx.uninstall(factory)


@pytest.mark.postgres
def test_concurrent_first_commits_on_a_fresh_database(postgresql_url: Any) -> None:
    engine = sa.create_engine(postgresql_url, pool_size=10)
    Base.metadata.create_all(engine)
    idx = SemanticIndex(store=MemoryStore(), embedder=HashEmbedder(), mode="deferred")
    factory = sessionmaker()  # unbound: the outbox is created at first use
    idx.install(factory)
    assert _commit_at_once(factory, engine, 6) == []
    assert len(jobs(engine)) == 6
    idx.uninstall(factory)
    engine.dispose()


def _commit_at_once(factory: sessionmaker[OrmSession], engine: Any, n: int) -> list[BaseException]:
    """Commit one new article in each of ``n`` threads started together; what they raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(n)

    def commit(i: int) -> None:
        try:
            start.wait()
            with factory(bind=engine) as s:
                s.add(Article(id=i, title="t", content=f"row {i}"))
                s.commit()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(1, n + 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_a_first_transaction_finds_the_outbox_through_its_own_connection(db_url: Any) -> None:
    """A process's first transactions find an existing outbox through their own connection:
    each took a second one from the pool, and a burst of them, holding every connection,
    waited for the pool's timeout (5 s each, then errors, measured with a pool of 2)."""
    setup = sa.create_engine(db_url)
    Base.metadata.create_all(setup)
    with setup.begin() as conn:
        outbox.create_tables(conn)
    setup.dispose()
    engine = sa.create_engine(db_url, pool_size=1, max_overflow=0, pool_timeout=3)
    checkouts: list[int] = []
    sa.event.listen(engine, "checkout", lambda *args: checkouts.append(1))
    idx = SemanticIndex(store=MemoryStore(), embedder=HashEmbedder(), mode="deferred")
    factory = sessionmaker()  # unbound: the outbox is looked for at the first transaction
    idx.install(factory)
    try:
        with factory(bind=engine) as s:
            s.add(Article(id=1, title="t", content="a row"))
            s.commit()
        assert len(checkouts) == 1  # (a second checkout waits out the timeout, then fails)
        assert len(jobs(engine)) == 1
    finally:
        idx.uninstall(factory)
        engine.dispose()


def test_a_first_transaction_on_sqlite_creates_the_outbox_through_its_own_connection(
    tmp_path: Any,
) -> None:
    """On SQLite (whose driver begins a transaction only at the first write) the outbox is
    created in a transaction of its own on the first transaction's connection: it took a
    second one from the pool, and a burst of first transactions (an application's first
    requests) holding every connection waited for the pool's timeout, then failed (here three
    at once on a pool of three). Concurrent first transactions are serialized."""
    engine = sa.create_engine(
        f"sqlite:///{tmp_path / 'app.sqlite3'}", pool_size=3, max_overflow=0, pool_timeout=3
    )
    Base.metadata.create_all(engine)
    checkouts: list[int] = []
    sa.event.listen(engine, "checkout", lambda *args: checkouts.append(1))
    idx = SemanticIndex(store=MemoryStore(), embedder=HashEmbedder(), mode="deferred")
    factory = sessionmaker()  # unbound: the outbox is created at the first transaction
    idx.install(factory)
    try:
        assert _commit_at_once(factory, engine, 3) == []
        assert len(checkouts) == 3
        assert len(jobs(engine)) == 3
    finally:
        idx.uninstall(factory)
        engine.dispose()


def test_per_model_binds(tmp_path: Any, pg_url: Any, store: Any) -> None:
    first = sa.create_engine(f"sqlite:///{tmp_path / 'a.sqlite3'}")
    second = sa.create_engine(f"sqlite:///{tmp_path / 'b.sqlite3'}")
    Article.__table__.create(first)
    Note.__table__.create(second)
    idx = SemanticIndex(store=store, embedder=HashEmbedder())
    factory = sessionmaker(binds={Article: first, Note: second})
    idx.install(factory)
    with factory() as s:
        s.add(Article(id=1, title="t", content="an article"))
        s.add(Note(slug="n", summary="a note", body="its body"))
        s.commit()
    assert settled(first) == [] and settled(second) == []
    assert store.count(COLL) == 1 and store.count("note__body") == 1
    idx.uninstall(factory)


def test_inline_commit_of_many_rows(installed: Any) -> None:
    idx, factory = installed()
    with factory() as s:
        s.add_all(Article(id=i, title="t", content=f"row number {i}") for i in range(1, 1501))
        s.commit()
    engine = factory.kw["bind"]
    assert settled(engine) == []
    assert idx.store.count(COLL) == 1500


def test_inline_mode_retries_by_itself(installed: Any) -> None:
    idx, factory = installed(flaky=True, retry_base=0.05)
    engine = factory.kw["bind"]
    idx.store.down = True
    with factory() as s:
        s.add(Article(id=1, title="t", content="waits for the store"))
        s.commit()
    assert len(jobs(engine)) == 1
    idx.store.down = False
    deadline = time.monotonic() + 20
    while jobs(engine) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert settled(engine) == []  # no worker, no drain, no later commit
    assert idx.store.count(COLL) == 1


def test_install_outlives_a_database_not_reachable_yet(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """A service may start (and install at import) before its database answers: the install
    says so and leaves the outbox to the first transaction, whose row reaches the index."""
    Base.metadata.create_all(engine)
    engine.dispose()  # (the server restarting: the pool's connections gone with it)
    down = [True]
    dbapi = engine.dialect.loaded_dbapi

    @sa.event.listens_for(engine, "do_connect")
    def refuse(*args: Any) -> None:
        if down[0]:
            raise dbapi.OperationalError("connection refused: the server is starting")

    idx = SemanticIndex(store=MemoryStore(), embedder=HashEmbedder(dimension=64))
    factory = sessionmaker(engine, expire_on_commit=False)
    with caplog.at_level("WARNING", logger="semantic_orm"):
        idx.install(factory)  # does not raise
    assert "the outbox could not be checked at install" in caplog.text
    assert "the server is starting" in caplog.text and "Traceback" not in caplog.text
    down[0] = False
    assert not sa.inspect(engine).has_table(outbox.OUTBOX_TABLE)  # left for later
    try:
        with factory() as s:
            s.add(Article(id=1, title="t", content=LONG))
            s.commit()
        idx.drain(engine, timeout=10)
        assert settled(engine) == []
        assert assert_index_matches_database(engine, idx.store) > 0
    finally:
        idx.uninstall(factory)
        idx.close()


def test_closing_one_index_of_a_shared_store_leaves_it_to_the_others(
    engine: Engine, store: Any
) -> None:
    """An index per tenant on one store (the README's layout): a tenant's index closed (evicted,
    say) does not close the store under the others; the last one's close does."""
    Base.metadata.create_all(engine)
    embedder = HashEmbedder(dimension=64)
    evicted = SemanticIndex(store=store, embedder=embedder, collection_prefix="evicted__")
    kept = SemanticIndex(store=store, embedder=embedder, collection_prefix="kept__")
    factory = sessionmaker(engine, expire_on_commit=False)
    kept.install(factory)
    try:
        evicted.close()
        with factory() as s:  # the store still works for the other index
            s.add(Article(id=1, title="t", content=LONG))
            s.commit()
            kept.drain(engine, timeout=10)
            assert [h.obj.id for h in Article.semantic_search(s, "topic number 7")] == [1]
        assert assert_index_matches_database(engine, store, collection=f"kept__{COLL}") > 0
    finally:
        kept.uninstall(factory)
        kept.close()
    if isinstance(store, EdgeStore):  # the last one closed it
        with pytest.raises(VectorStoreError, match="is closed"):
            store.index_state(f"kept__{COLL}")


def test_an_outage_lets_one_search_at_a_time_try_the_store() -> None:
    """:meth:`Outage.admit_search`: in an outage, a search tries the store while no other
    search is on its way and none failed within the window; the others fail at once; one
    that reaches the store ends the outage. A sync's failure opens no search window."""
    down = VectorStoreError("connection refused")
    outage = Outage(first=0.2, cap=1.0)
    assert outage.admit(False) is None
    outage.ended(down)  # a background sync found it down
    assert outage.since is not None
    probe = outage.admit_search()  # no search window: it tries
    assert probe is None
    refused = outage.admit_search()  # one at a time
    assert isinstance(refused, VectorStoreError) and "search again" in str(refused)
    outage.ended(down, search=True)  # the probe failed: a window for searches
    assert outage.admit_search() is not None
    time.sleep(0.45)  # (the window doubled to 0.4 s)
    assert outage.admit_search() is None
    assert outage.admit_search() is not None
    outage.ended(None, search=True)  # got through
    assert outage.since is None and outage.admit_search() is None
    outage.ended(None, search=True)
