"""Async applications: AsyncSession, async_sessionmaker, awaitable search, adrain, AsyncWorker.

On aiosqlite and asyncpg (against the throwaway PostgreSQL), both store adapters, the fake
embedder. The event loop must never run the embedding: a probe task measures the longest gap
between its ticks while a commit syncs with an embedder that blocks its thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import inspect
import itertools
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import create_engine, delete, func, select
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    async_scoped_session,
    async_sessionmaker,
    create_async_engine,
)

from semantic_orm import (
    AsyncWorker,
    ConfigurationError,
    SemanticIndex,
    asemantic_search,
    maintenance,
    outbox,
    processing,
    semantic_search,
)
from semantic_orm.testing import FlakyStore, HashEmbedder

from .helpers import COLL, assert_index_matches_database, points_of, reads_of, settle_fails_once
from .models import Article, Note

pytestmark = pytest.mark.asyncio


class Blocking(HashEmbedder):
    """Blocks its thread while it embeds (as a real model on a CPU does)."""

    def encode(self, texts: Any) -> Any:
        time.sleep(1.0)
        return super().encode(texts)


async def _longest_stall(work: Any) -> float:
    """Run ``work`` while a task ticks every 5 ms; the longest gap between ticks, in seconds."""
    stop = asyncio.Event()
    gaps: list[float] = []

    async def tick() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.02)
    await work()
    stop.set()
    await ticker
    return max(gaps)


async def test_async_sessions_sync_off_the_loop_and_search(
    aengine: AsyncEngine, store: Any
) -> None:
    idx = SemanticIndex(store=store, embedder=Blocking())
    factory = async_sessionmaker(aengine, expire_on_commit=False)
    idx.install(factory)
    # creating a collection holds the GIL (qdrant-edge-py): an app does it at start-up
    await asyncio.to_thread(idx.verify)
    try:

        async def commit() -> None:
            async with factory() as s:
                s.add_all(
                    Article(title=f"t{i}", content=f"document {i} about rivers and lakes")
                    for i in range(50)
                )
                s.add(Article(title="code", content="the part number XR-7734 is special"))
                await s.commit()
            await idx.adrain(factory, timeout=30)  # the sync the commit started, awaited

        stall = await _longest_stall(commit)
        # the embedder blocks its thread 1 s per call, never the loop (a shared 2-core machine
        # can delay the loop's next tick a few hundred ms: the bound is half a call)
        assert stall < 0.5
        assert store.count(COLL) == 51
        async with factory() as s:
            hits = await Article.asemantic_search(s, "XR-7734", limit=1, mode="keyword")
            assert hits[0].obj.title == "code" and "XR-7734" in hits[0].chunk.text
            same = await asemantic_search(s, Article, "rivers and lakes", limit=3)
            assert len(same) == 3 and all("rivers" in h.text for h in same)
            several = await asemantic_search(
                s, [Article, Note], "XR-7734", limit=2, mode="keyword", column={Note: "body"}
            )
            assert several[0].model is Article and several[0].obj.title == "code"
            (row,) = (await s.scalars(select(Article).where(Article.title == "t3"))).all()
            await s.delete(row)
            await s.commit()
        await idx.adrain(factory, timeout=30)
        assert store.count(COLL) == 50
    finally:
        idx.uninstall(factory)


async def test_an_async_commit_syncs_the_text_it_wrote_without_reading_it_back(
    aengine: AsyncEngine, store: Any, db_url: Any
) -> None:
    """The sync task of an AsyncSession's commit takes the text the flush wrote: its jobs were
    born leased (aiosqlite; asyncpg in READ COMMITTED)."""
    idx = SemanticIndex(store=store, embedder=HashEmbedder())
    factory = async_sessionmaker(aengine, expire_on_commit=False)
    idx.install(factory)
    try:
        with reads_of(aengine.sync_engine, "article") as seen:
            async with factory() as s:
                rows = [Article(id=i, title="t", content=f"row {i} about rivers") for i in (1, 2)]
                s.add_all(rows)
                await s.commit()
                await idx.adrain(factory, timeout=30)  # else the next job waits behind its lease
                rows[0].content = "row 1 is about lakes now"
                await s.commit()
            await idx.adrain(factory, timeout=30)
    finally:
        idx.uninstall(factory)
    assert not seen
    engine = create_engine(db_url)
    try:
        assert assert_index_matches_database(engine, store) == 2
    finally:
        engine.dispose()


async def test_an_async_worker_tries_a_failed_pass_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass that fails as a whole (the database is down) is tried again after a doubling
    wait, also when the worker is to stop once idle: a failure says nothing of what is due."""
    from semantic_orm.testing import MemoryStore

    idx = SemanticIndex(store=MemoryStore(), embedder=HashEmbedder())
    calls: list[float] = []

    async def aprocess(bind: Any, *, limit: int = 256) -> processing.ProcessReport:
        calls.append(time.monotonic())
        if len(calls) <= 3:
            raise ConnectionError("database is down")
        return processing.ProcessReport()

    monkeypatch.setattr(idx, "aprocess", aprocess)
    worker = AsyncWorker(idx, None, poll_interval=0.02)
    await asyncio.wait_for(worker.run(stop_when_idle=True), 10)
    assert len(calls) == 4 and worker.failures == 0
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert gaps[0] >= 0.02 and gaps[1] >= 0.04 and gaps[2] >= 0.08


async def test_deferred_mode_with_an_async_worker(aengine: AsyncEngine, store: Any) -> None:
    idx = SemanticIndex(store=store, embedder=HashEmbedder(), mode="deferred")
    factory = async_sessionmaker(aengine)
    idx.install(factory)
    worker = AsyncWorker(idx, aengine, poll_interval=0.01)
    try:
        async with factory() as s:
            s.add_all(Article(title=f"t{i}", content=f"queued row {i}") for i in range(5))
            await s.commit()
        assert store.count(COLL) == 0  # deferred: the commit only queued
        worker.start()
        deadline = time.monotonic() + 20
        while worker.totals.done < 5 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert worker.totals.done == 5 and store.count(COLL) == 5
    finally:
        await worker.stop()
        idx.uninstall(factory)


async def test_one_async_session_and_async_scoped_sessions(
    aengine: AsyncEngine, store: Any
) -> None:
    idx = SemanticIndex(store=store, embedder=HashEmbedder())
    factory = async_sessionmaker(aengine, expire_on_commit=False)
    session = factory()
    idx.install(session)  # one AsyncSession
    session.add(Article(title="one", content="installed on this session only"))
    await session.commit()
    await idx.adrain(aengine, timeout=30)
    assert store.count(COLL) == 1
    async with factory() as other:  # another session of the factory is not synced
        other.add(Article(title="two", content="not installed here"))
        await other.commit()
    assert store.count(COLL) == 1
    idx.uninstall(session)
    await session.close()

    scoped = async_scoped_session(factory, scopefunc=asyncio.current_task)
    idx.install(scoped)
    try:
        scoped.add(Article(title="three", content="through an async scoped session"))
        await scoped.commit()
        await idx.adrain(scoped, timeout=30)
        hits = await Article.asemantic_search(scoped, "async scoped", limit=1, mode="keyword")
        assert hits[0].obj.title == "three"
        with pytest.raises(ConfigurationError, match=r"await Model\.asemantic_search"):
            Article.semantic_search(scoped, "async scoped", limit=1)  # (the blocking one)
    finally:
        await scoped.remove()
        idx.uninstall(scoped)


async def test_the_blocking_calls_given_an_async_session_or_engine_name_the_awaited_ones(
    aengine: AsyncEngine, store: Any
) -> None:
    """The blocking search given an AsyncSession failed on a coroutine's missing ``.all()``
    (or, with no hit, returned nothing); drain() and process() given an async engine raised
    SQLAlchemy's MissingGreenlet."""
    async with _installed(aengine, store) as (idx, factory):
        await _add(factory, 1, "owls hunt at night")
        await idx.adrain(factory, timeout=10)
        async with factory() as s:
            for query in ("owls", "nothing shares this"):
                with pytest.raises(ConfigurationError, match=r"await Model\.asemantic_search"):
                    Article.semantic_search(s, query, limit=1, mode="keyword")
                with pytest.raises(ConfigurationError, match="asemantic_search"):
                    semantic_search(s, Article, query, limit=1)
        for bind in (aengine, factory, None):  # (None: the one engine the index knows)
            with pytest.raises(ConfigurationError, match=r"await index\.adrain"):
                idx.drain(bind, timeout=5)
            with pytest.raises(ConfigurationError, match=r"await index\.aprocess"):
                idx.process(bind)
        assert (await idx.aprocess(aengine)).claimed == 0
        with pytest.raises(ConfigurationError, match="async engine"):  # (no awaited version)
            maintenance.status(idx, aengine)
        with pytest.raises(ConfigurationError, match="async engine"):
            maintenance.reconcile(idx, Article, aengine)


async def _soon(check: Any, timeout: float = 10.0) -> bool:
    """Whether ``check()`` (a value or an awaitable) comes true within ``timeout`` seconds
    (checked every 50 ms)."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if inspect.isawaitable(found):
            found = await found
        if found:
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)


async def _outbox_rows(aengine: AsyncEngine) -> int:
    async with aengine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(outbox.outbox))).scalar())


@contextlib.asynccontextmanager
async def _installed(
    aengine: AsyncEngine, store: Any, **settings: Any
) -> AsyncIterator[tuple[SemanticIndex, async_sessionmaker[Any]]]:
    """An index with the fake embedder installed on an async factory over ``aengine``
    (uninstalled at the end)."""
    idx = SemanticIndex(store=store, embedder=HashEmbedder(), **settings)
    factory = async_sessionmaker(aengine, expire_on_commit=False)
    idx.install(factory)
    try:
        yield idx, factory
    finally:
        idx.uninstall(factory)


async def _no_jobs(aengine: AsyncEngine) -> bool:
    return await _outbox_rows(aengine) == 0


async def _add(factory: async_sessionmaker[Any], pk: int, text: str) -> None:
    """Commit one new article."""
    async with factory() as s:
        s.add(Article(id=pk, title="t", content=text))
        await s.commit()


async def test_the_async_retrier_wakes_for_a_commit_that_leaves_it_a_row(
    aengine: AsyncEngine, store: Any
) -> None:
    """The async retrier asleep until a lease ends (another process's, up to 60 s) wakes when a
    commit's sync leaves it a row (that row stayed out of the index about 60 s), and adrain()
    does not wait for it (it took as long with nothing to do)."""
    now = outbox.utcnow()
    elsewhere = outbox.outbox.insert().values(
        table_name="article",
        column_name="content",
        row_pk="99",
        attempts=0,
        failures=0,
        dead=False,
        next_attempt_at=now + dt.timedelta(seconds=300),
        created_at=now,
        claimed_by="elsewhere:1:x",
    )
    async with _installed(aengine, FlakyStore(store), retry_base=0.1) as (idx, factory):
        await _add(factory, 1, "first row")
        await idx.adrain(factory, timeout=10)
        async with aengine.begin() as conn:
            await conn.execute(elsewhere)
        for pk in (2, 3):
            idx.store.down = True
            await _add(factory, pk, f"row {pk} about rivers")
            await asyncio.sleep(0.2)  # its sync failed: the retrier has it
            idx.store.down = False
            assert await _soon(lambda pk=pk: bool(points_of(idx, pk)))  # (row 3: 60 s before)
        async with aengine.begin() as conn:
            await conn.execute(delete(outbox.outbox).where(outbox.outbox.c.row_pk == "99"))
        started = time.monotonic()
        await idx.adrain(factory, timeout=30)
        assert time.monotonic() - started < 5 and await _outbox_rows(aengine) == 0


async def test_an_async_pass_whose_settle_failed_is_settled_by_the_next(
    aengine: AsyncEngine, store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An async pass whose settle the database refused (SQLite "database is locked" under
    load) leaves its jobs to the next pass, which settles them first, not leased to this
    process for the lease (300 s: adrain() timed out, later writes of the row waited)."""
    async with _installed(aengine, store, mode="deferred") as (idx, factory):
        await _add(factory, 1, "a row about rivers")
        tries = settle_fails_once(monkeypatch)
        with pytest.raises(sa.exc.OperationalError, match="locked"):
            await idx.aprocess(factory)
        assert await _outbox_rows(aengine) == 1 and points_of(idx, 1)  # synced, not settled
        started = time.monotonic()
        report = await idx.adrain(factory, timeout=30)
        assert tries == [1, 1] and report.claimed == 0 and await _no_jobs(aengine)
        assert time.monotonic() - started < 5


async def test_async_commits_settle_their_jobs_together(
    aengine: AsyncEngine, store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An AsyncSession's commit leaves its finished jobs to be deleted later, with others (on
    SQLite by the next commit's own transaction, else by one transaction on the loop a moment
    later), not in a write transaction of its own each (on SQLite each was one more writer for
    the application's to wait for: "database is locked" under load). One that fails is tried
    again; nothing waits for adrain()."""
    commits = [0]
    sa.event.listen(
        aengine.sync_engine, "commit", lambda conn: commits.__setitem__(0, commits[0] + 1)
    )
    tries = settle_fails_once(monkeypatch)  # (the passes' own settle: a commit does not use it)
    async with _installed(aengine, store) as (idx, factory):
        await _add(factory, 99, "warm")  # (the outbox made, the database looked at)
        assert await _soon(lambda: _no_jobs(aengine))
        commits[0] = 0
        await asyncio.gather(*(_add(factory, pk, f"row {pk} about rivers") for pk in range(8)))
        assert await _soon(lambda: _no_jobs(aengine), timeout=10)  # by the loop: no adrain
        assert commits[0] <= 8 + 2, commits  # (each settled in a transaction: 16)
        assert tries == [] and all(points_of(idx, pk) for pk in range(8))
        original = processing._settle_done
        failed: list[int] = []

        def refused(conn: Any, jobs: Any, token: str, watch: float) -> Any:
            failed.append(len(jobs))
            if len(failed) == 1:
                raise sa.exc.OperationalError("DELETE", {}, Exception("database is locked"))
            return original(conn, jobs, token, watch)

        monkeypatch.setattr(processing, "_settle_done", refused)
        monkeypatch.setattr(processing, "SETTLE_RETRY", 0.5)  # (5 s)
        await _add(factory, 100, "a row about lakes")
        assert await _soon(lambda: _no_jobs(aengine), timeout=10)  # tried again in 0.5 s
        assert failed[0] >= 1 and points_of(idx, 100)


async def test_jobs_an_earlier_run_left_are_synced_at_the_first_async_transaction(
    aengine: AsyncEngine, store: Any
) -> None:
    """The first transaction of an AsyncSession looks for jobs an earlier run left (a process
    killed before its sync): they were synced only by a worker, or never."""
    async with _installed(aengine, store, mode="deferred") as (_, factory):
        await _add(factory, 1, "the crash lost this sync")
    async with _installed(aengine, store) as (idx, factory):
        async with factory() as s:
            await s.execute(select(1))  # a read
        assert await _soon(lambda: bool(points_of(idx, 1)))
        assert await _soon(lambda: not idx._aretrying)  # then it ends
        assert await _outbox_rows(aengine) == 0


async def test_a_burst_of_first_async_commits_on_sqlite_creates_the_outbox(
    tmp_path: Any, store: Any
) -> None:
    """install() creates no outbox for an async engine (it cannot wait there): the first
    transactions of an application on a fresh SQLite database (a burst of requests, one per
    connection of the pool) each took a second connection to create it, and every one of them
    waited for the pool's timeout, then failed."""
    aengine = create_async_engine(
        f"sqlite+aiosqlite:///{tmp_path / 'app.sqlite3'}",
        pool_size=4,
        max_overflow=0,
        pool_timeout=3,
    )
    async with aengine.begin() as conn:
        await conn.run_sync(Article.metadata.create_all)
    try:
        async with _installed(aengine, store) as (idx, factory):

            async def commit(i: int) -> None:
                async with factory() as s:
                    s.add(Article(id=i, title="t", content=f"row {i} about rivers"))
                    await s.commit()

            results = await asyncio.gather(
                *(commit(i) for i in range(1, 5)), return_exceptions=True
            )
            assert results == [None] * 4  # (without a second connection: no pool timeout)
            await idx.adrain(factory, timeout=10)
            assert store.count(COLL) == 4 and await _no_jobs(aengine)
    finally:
        await aengine.dispose()


async def test_adrain_and_an_async_worker_on_a_database_without_an_outbox(
    aengine: AsyncEngine, store: Any
) -> None:
    """Before any commit made the outbox, adrain() has nothing to do (it raised "no such
    table") and an async worker waits for work (it logged that error, backing off)."""
    idx = SemanticIndex(store=store, embedder=HashEmbedder(), mode="deferred")
    assert (await idx.adrain(aengine, timeout=5)).claimed == 0
    worker = AsyncWorker(idx, aengine, poll_interval=0.01)
    await asyncio.wait_for(worker.run(stop_when_idle=True), 10)
    assert worker.failures == 0
    factory = async_sessionmaker(aengine, expire_on_commit=False)
    idx.install(factory)
    try:
        await _add(factory, 1, "a row about rivers")
        await asyncio.wait_for(worker.run(stop_when_idle=True), 10)
        assert worker.totals.done == 1 and points_of(idx, 1)
    finally:
        idx.uninstall(factory)


async def test_an_idle_query_batcher_holds_neither_its_loop_nor_its_embedder(
    aengine: AsyncEngine, store: Any
) -> None:
    """Each asyncio.run() of a job (a CLI, a task queue) left its loop and its embedders in the
    query batchers (37 MB per closed tenant index with MiniLM)."""
    from semantic_orm import search

    async with _installed(aengine, store) as (idx, factory):
        await _add(factory, 1, "a row about rivers")
        await idx.adrain(factory, timeout=10)
        async with factory() as s:
            hits = await asemantic_search(s, Article, "rivers", limit=1)
        assert [h.obj.id for h in hits] == [1]
        assert asyncio.get_running_loop() not in search._batchers


class SlowReader(HashEmbedder):
    """Measures a query's coverage slowly, as a model whose tokenizer another thread's encode
    holds does (transformers 4), and records the threads it measured queries on."""

    def __init__(self) -> None:
        super().__init__()
        self.measured: list[int] = []

    def coverage(self, text: str) -> float:
        if text == "rivers sea":  # (a commit's sync measures a sample of its chunks too)
            time.sleep(0.6)
            self.measured.append(threading.get_ident())
        return 0.9


async def test_a_hybrid_search_measures_its_querys_coverage_off_the_loop(
    aengine: AsyncEngine, store: Any
) -> None:
    """A fused search weighs its lists by how much of the query the model reads; an async one
    asked the model on the event loop, which waited there for the tokenizer."""
    embedder = SlowReader()
    idx = SemanticIndex(store=store, embedder=embedder)
    factory = async_sessionmaker(aengine, expire_on_commit=False)
    idx.install(factory)
    try:
        await _add(factory, 1, "rivers flow into the sea")
        await _add(factory, 2, "cooking pasta in water")
        await idx.adrain(factory, timeout=10)
        loop_thread = threading.get_ident()
        async with factory() as s:
            found: list[Any] = []

            async def search() -> None:
                found.append(await asemantic_search(s, Article, "rivers sea", limit=2))
                vector = embedder.encode(["rivers sea"])[0]
                found.append(
                    await asemantic_search(s, Article, "rivers sea", limit=2, query_vector=vector)
                )

            stall = await _longest_stall(search)
            assert stall < 0.3  # (each measure sleeps 0.6 s)
            assert len(embedder.measured) == 2 and loop_thread not in embedder.measured
            for hits in found:
                assert hits[0].obj.id == 1
            assert [h.score for h in found[0]] == [h.score for h in found[1]]
            await asemantic_search(s, Article, "rivers sea", limit=2, mode="dense")
            assert len(embedder.measured) == 2  # (a dense search fuses nothing)
    finally:
        idx.uninstall(factory)


async def test_stopping_the_async_worker_settles_what_commits_left_waiting(
    aengine: AsyncEngine, store: Any
) -> None:
    """A lifespan's shutdown (``await worker.stop()``) deletes the finished jobs of the last
    commits at once: none is left leased to a process that is going away (the next one would
    sync those rows again once the leases end)."""
    async with _installed(aengine, store) as (idx, factory):
        worker = AsyncWorker(idx, aengine, poll_interval=0.05)
        worker.start()
        await _add(factory, 1, "a row about rivers")
        assert await _soon(lambda: idx.processor.later.waiting(aengine.sync_engine), 5)
        waiting = idx.processor.later.waiting(aengine.sync_engine)  # synced, still leased
        assert [job.key.pk for job in waiting] == ["1"] and await _outbox_rows(aengine) == 1
        await worker.stop()  # at once, not a quarter of a second later
        assert await _no_jobs(aengine) and points_of(idx, 1)
        assert idx.processor.later.waiting(aengine.sync_engine) == []
