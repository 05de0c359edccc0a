"""Forked processes: the locks a child inherits from a parent whose threads were busy."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import sessionmaker

from semantic_orm import QdrantClientStore, SemanticIndex
from semantic_orm.forking import RenewedLock
from semantic_orm.testing import HashEmbedder

from .helpers import in_a_forked_child
from .models import Article, Base

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


@contextmanager
def held_by_a_thread(*locks: Any) -> Iterator[None]:
    """``locks`` taken by another thread for as long as the block runs (as the retrier or the
    settle timer may hold them, in the middle of a write, when a server forks a worker)."""
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        for lock in locks:
            lock.acquire()
        taken.set()
        done.wait()
        for lock in reversed(locks):
            lock.release()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert taken.wait(10)
    try:
        yield
    finally:
        done.set()
        thread.join(10)


def test_a_lock_another_thread_held_at_the_fork_is_free_in_the_child() -> None:
    plain, renewed, reentrant = threading.Lock(), RenewedLock(), RenewedLock(reentrant=True)

    def take_them() -> list[bool]:
        return [lock.acquire(timeout=0.5) for lock in (plain, renewed, reentrant)]

    with held_by_a_thread(plain, renewed, reentrant):
        _, took = in_a_forked_child(take_them)
    assert took == [False, True, True]  # a plain lock stays held in the child for good
    with renewed, reentrant, reentrant:  # and in the parent they work as before
        assert not renewed.acquire(blocking=False)


def test_a_lock_the_forking_thread_holds_stays_its_own_in_the_child() -> None:
    """A fork made inside ``with lock:`` (a model loading under its lock): the child's thread
    is the one that took it, and releases it on leaving the block."""
    renewed, reentrant = RenewedLock(), RenewedLock(reentrant=True)

    def leave_the_blocks() -> list[bool]:
        renewed.release()
        reentrant.release()
        return [renewed.acquire(timeout=0.5), reentrant.acquire(timeout=0.5)]

    with renewed, reentrant:
        _, took = in_a_forked_child(leave_the_blocks)
    assert took == [True, True]


def test_a_forked_worker_commits_and_searches_while_its_parents_threads_held_the_locks(
    engine: Engine,
) -> None:
    """gunicorn --preload: the app commits before the fork; when the master forks a worker
    later its own threads may hold the locks the index takes (the column bindings', the
    store's). The worker uses them at once: with the parent's locks it would hang for good (the
    helper kills it and fails the test). The library's other locks are :class:`RenewedLock`
    objects too (the test above)."""
    Base.metadata.create_all(engine)
    store = QdrantClientStore(location=":memory:")
    idx = SemanticIndex(store=store, embedder=HashEmbedder(dimension=32))
    factory = sessionmaker(engine, expire_on_commit=False)
    idx.install(factory)
    try:
        with factory() as s:
            s.add(Article(id=1, title="parent", content="a text about rivers and lakes"))
            s.commit()
        # the parent's own background work, done before the fork: a thread inside the SQLite
        # library at the fork leaves its mutex held in the child (no lock of ours can renew it)
        idx.settle()
        idx._retry.stop()
        if idx._retry._thread is not None:
            idx._retry._thread.join(10)
        locks = (idx.bindings._lock, store._serial)  # what a commit and a search take

        def work_in_the_worker() -> list[str]:
            engine.dispose(close=False)  # the parent's connections stay the parent's
            with factory() as s:
                s.add(Article(id=2, title="worker", content="a text about mountains"))
                s.commit()
                hits = Article.semantic_search(s, "a text about mountains", limit=2)
                return [hit.obj.title for hit in hits]

        with held_by_a_thread(*locks):
            _, found = in_a_forked_child(work_in_the_worker, timeout=30)
        assert found[0] == "worker"
        with factory() as s:  # the parent goes on with its own copy of the points
            assert [h.obj.title for h in Article.semantic_search(s, "rivers", limit=1)] == [
                "parent"
            ]
    finally:
        idx.uninstall(factory)
        store.close()


def test_a_worker_forked_after_install_never_uses_the_parents_connection(engine: Engine) -> None:
    """gunicorn --preload with a careful app (nothing connected before the fork but the
    index's install, which looks at the outbox): each forked worker connects on its own. With
    the connection install left in the pool, every worker talked through the same driver
    connection (one PostgreSQL backend, one SQLite handle), reading each other's results."""
    from sqlalchemy import text

    Base.metadata.create_all(engine)
    engine.dispose()
    postgres = engine.dialect.name == "postgresql"
    idx = SemanticIndex(
        store=QdrantClientStore(location=":memory:"),
        embedder=HashEmbedder(dimension=32),
        mode="deferred",
    )
    factory = sessionmaker(engine, expire_on_commit=False)
    idx.install(factory)  # (its connection goes back to the pool)
    try:
        pooled = [engine.connect() for _ in range(engine.pool.checkedin())]
        assert pooled  # those very connections: mark them
        parents = set()
        for conn in pooled:
            if postgres:
                parents.add(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
            else:
                conn.exec_driver_sql("CREATE TEMP TABLE parents_own (x INTEGER)")
                conn.commit()
                parents.add(1)
            conn.close()

        def in_the_worker() -> list[int]:
            with engine.connect() as conn:
                if postgres:
                    mine = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
                else:
                    mine = conn.exec_driver_sql(
                        "SELECT count(*) FROM temp.sqlite_master WHERE name = 'parents_own'"
                    ).scalar_one()
            with factory() as s:  # and the worker's own commit queues its job
                s.add(Article(id=7, title="worker", content="a text about mountains"))
                s.commit()
            return [mine]

        _, (found,) = in_a_forked_child(in_the_worker, timeout=30)
        assert found not in parents
        with engine.connect() as conn:  # the parent's connections are still its own, and work
            if postgres:
                assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() in parents
            else:
                assert conn.exec_driver_sql("SELECT count(*) FROM parents_own").scalar() == 0
            assert conn.exec_driver_sql("SELECT count(*) FROM article").scalar() == 1
    finally:
        idx.uninstall(factory)
        idx.close()
