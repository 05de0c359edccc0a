"""Maintenance: ``reindex`` (backfill), ``reconcile`` (writes no session saw) and ``status``.

SQLite and PostgreSQL, both store adapters, the fake embedder.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import sessionmaker

from semantic_orm import (
    SemanticIndex,
    outbox,
)
from semantic_orm.maintenance import reconcile, reindex, status
from semantic_orm.testing import FlakyStore, HashEmbedder, MemoryStore

from .helpers import (
    assert_index_matches_database,
    foreign_keys_on,
    jobs,
    pending,
)
from .models import Article, Base, Comment


@pytest.fixture
def tables(engine: Engine) -> Engine:
    Base.metadata.create_all(engine)
    return engine


def test_reindex_backfills_rows_saved_without_the_index(
    tables: Engine, store: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = sessionmaker(tables)
    with plain() as s:
        s.add_all(Article(title=f"t{i}", content=f"row {i} about lakes") for i in range(25))
        s.commit()
    idx = SemanticIndex(store=store, embedder=HashEmbedder(), models=Base)
    (before,) = [c for c in status(idx, tables) if c.column == "Article.content"]
    assert (before.rows, before.indexed_rows) == (25, 0)
    queued = reindex(idx, Article, tables, batch_size=10, process=False)  # "interrupted"
    assert queued == 25 and len(jobs(tables)) == 25
    idx.process(tables, limit=10)
    assert reindex(idx, Article, tables, batch_size=10, progress=True) == 15  # resumes
    err = capsys.readouterr().err
    assert "queue Article.content" in err and "row/s" in err
    idx.drain(tables, timeout=30)
    (after,) = [c for c in status(idx, tables) if c.column == "Article.content"]
    assert (after.rows, after.indexed_rows, after.pending_jobs) == (25, 25, 0)
    assert_index_matches_database(tables, store)


@pytest.fixture
def cascading(engine: Engine) -> Engine:
    return foreign_keys_on(engine)


def test_reconcile_converges_raw_sql_and_database_cascades(
    cascading: Engine, store: Any, hash_embedder: HashEmbedder
) -> None:
    Base.metadata.create_all(cascading)
    idx = SemanticIndex(store=store, embedder=hash_embedder)
    factory = sessionmaker(cascading)
    idx.install(factory)
    with factory() as s:
        s.add_all(Article(id=i, title="t", content=f"article {i} about lakes") for i in range(1, 7))
        s.add_all(Comment(id=i, article_id=i, body=f"comment {i} on rivers") for i in range(1, 7))
        s.commit()
    with cascading.begin() as conn:  # writes no session sees
        conn.execute(text("UPDATE article SET content = 'rewritten by raw sql' WHERE id = 1"))
        conn.execute(
            text("INSERT INTO article (id, title, lang, content) VALUES (9, 't', 'en', 'raw')")
        )
        conn.execute(text("DELETE FROM article WHERE id = 2"))  # cascades to comment 2
        conn.execute(text("UPDATE article SET content = NULL WHERE id = 3"))
    reports = {r.column: r for r in reconcile(idx, None, cascading)}
    art, com = reports["Article.content"], reports["Comment.body"]
    assert (art.changed, art.missing, art.emptied, art.orphans) == (1, 1, 1, 1)
    assert com.orphans == 1 and com.in_sync == 5
    assert_index_matches_database(cascading, store)
    assert_index_matches_database(cascading, store, Comment, "body", "comment__body")
    again = {r.column: r for r in reconcile(idx, Article, cascading)}
    assert again["Article.content"].queued == 0 and not again["Article.content"].resumed
    idx.uninstall(factory)


class _FailsAfter(FlakyStore):
    """Scrolling fails after ``budget`` pages: a reconcile interrupted half-way."""

    def __init__(self, inner: Any, budget: int) -> None:
        super().__init__(inner)
        self.budget = budget

    def scroll(self, *args: Any, **kwargs: Any) -> Any:
        self.budget -= 1
        if self.budget < 0:
            raise RuntimeError("interrupted")
        return super().scroll(*args, **kwargs)


def test_reconcile_resumes_after_an_interruption(
    engine: Engine, hash_embedder: HashEmbedder
) -> None:
    Base.metadata.create_all(engine)
    inner = MemoryStore()
    idx = SemanticIndex(store=inner, embedder=hash_embedder)
    factory = sessionmaker(engine)
    idx.install(factory)
    with factory() as s:
        s.add_all(Article(id=i, title="t", content=f"row {i}") for i in range(1, 41))
        s.commit()
    with engine.begin() as conn:
        conn.execute(text("UPDATE article SET content = content || ' edited'"))
    idx.uninstall(factory)
    flaky = _FailsAfter(inner, budget=2)
    broken = SemanticIndex(store=flaky, embedder=hash_embedder, models=Article)
    with pytest.raises(RuntimeError, match="interrupted"):
        reconcile(broken, Article, engine, batch_size=10, process=False)
    queued_before = len(pending(engine))
    assert 0 < queued_before < 40
    (report,) = reconcile(
        broken.__class__(store=inner, embedder=hash_embedder, models=Article),
        Article,
        engine,
        batch_size=10,
    )
    assert report.resumed and report.changed + queued_before >= 40
    assert pending(engine) == []
    assert_index_matches_database(engine, inner)


def test_reconcile_waits_for_the_jobs_another_processor_holds(
    engine: Engine, installed: Any, hash_embedder: HashEmbedder
) -> None:
    idx, factory = installed()
    worker = SemanticIndex(store=idx.store, embedder=hash_embedder, models=Article)
    with factory() as s:
        s.add_all(Article(id=i, title="t", content=f"row {i}") for i in range(1, 4))
        s.commit()
    with engine.begin() as conn:
        conn.execute(text("UPDATE article SET content = content || ' edited'"))
    reconcile(idx, Article, engine, process=False)
    with engine.begin() as conn:  # a worker leases them, and syncs them a moment later
        held = outbox.claim(conn, token=worker.processor.token, lease=30, limit=10)
    assert len(held) == 3

    def finish() -> None:
        time.sleep(0.3)
        worker.processor.process(engine, claimed=held)

    thread = threading.Thread(target=finish)
    thread.start()
    # the rows are still out of sync, so reconcile queues them again: the new jobs wait for
    # the worker's lease, and reconcile waits for both
    (report,) = reconcile(idx, Article, engine)
    thread.join()
    assert report.queued == 3
    assert pending(engine) == []
    assert_index_matches_database(engine, idx.store)


class _OlderAnalysis:
    """The keyword analysis of the release before (version 2: a document's runs yielded no
    single characters), for a deployment that wrote its points before an upgrade."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from semantic_orm import keywords

        current = keywords._run_terms

        def older_run_terms(run: str, grams: list[str], singles: list[str] | None) -> None:
            current(run, grams, None)  # bigrams only

        monkeypatch.setattr(keywords, "KEYWORDS_VERSION", 2)
        monkeypatch.setattr(keywords, "_run_terms", older_run_terms)


_CJK_TEXTS = ["我喜欢猫和狗", "猫在睡觉", "今天天气很好"]


def _written_by_the_older_release(tables: Engine, store: Any, factory: sessionmaker[Any]) -> None:
    """Rows 1-3 (:data:`_CJK_TEXTS`) saved and synced by the release before."""
    with pytest.MonkeyPatch.context() as old_release:
        _OlderAnalysis(old_release)
        old = SemanticIndex(store=store, embedder=HashEmbedder(), models=Base)
        old.install(factory)
        with factory() as s:
            s.add_all(Article(id=i, title="t", content=t) for i, t in enumerate(_CJK_TEXTS, 1))
            s.commit()
        old.drain(tables, timeout=30)
        old.uninstall(factory)


def _cats(factory: sessionmaker[Any]) -> list[int]:
    """The rows a keyword search for one character (猫) finds."""
    with factory() as s:
        return sorted(h.obj.id for h in Article.semantic_search(s, "猫", limit=10, mode="keyword"))


def _embedded_during(work: Any) -> list[int]:
    from semantic_orm import signals

    embedded: list[int] = []

    def count(sender: Any, **kw: Any) -> None:
        embedded.append(kw["count"])

    signals.embedded.connect(count)
    try:
        work()
    finally:
        signals.embedded.disconnect(count)
    return embedded


def test_a_new_keyword_analysis_keeps_writes_going_and_a_full_pass_rewrites_keywords_only(
    tables: Engine, store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A release whose keyword analyser changed must not stop writes until a rebuild: the dense
    vectors still fit. New rows get the new analysis at once; ``reindex --all`` or ``reconcile``
    rewrites the older points' keyword vectors without embedding, and the new analyser is
    recorded once every row has it (not while a row's rewrite failed)."""
    from semantic_orm import keywords

    factory = sessionmaker(tables)
    _written_by_the_older_release(tables, store, factory)

    flaky = FlakyStore(store)
    new = SemanticIndex(store=flaky, embedder=HashEmbedder(), models=Base)
    new.install(factory)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="semantic_orm"):
        assert _cats(factory) == []  # the older points hold no single characters
        with factory() as s:  # writes go on: no drift, no rebuild
            s.add(Article(id=9, title="t", content="一只黑猫"))
            s.commit()
        new.drain(tables, timeout=30)
        assert _cats(factory) == [9]
    assert any("hold keyword vectors of analyser '2'" in r.getMessage() for r in caplog.records)
    version = str(keywords.KEYWORDS_VERSION)
    (state,) = [c for c in status(new, tables) if c.column == "Article.content"]
    assert state.drift == {} and state.pending_jobs == 0
    assert state.stale_keywords == ("2", version)
    (found,) = reconcile(new, Article, tables, process=False)
    assert found.changed == 3 and found.in_sync == 1  # the older points, by their analyser

    flaky.reject = True  # every rewrite fails: nothing may be recorded
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="semantic_orm"):
        assert _embedded_during(lambda: reindex(new, Article, tables, all_rows=True)) == []
    assert any(
        "still has points of the earlier keyword analysis" in r.getMessage() for r in caplog.records
    )
    (state,) = [c for c in status(new, tables) if c.column == "Article.content"]
    assert state.stale_keywords == ("2", version) and state.retrying_jobs + state.dead_jobs
    flaky.reject = False
    (found,) = _reconcile_reports(new, tables)
    assert found.changed == 3  # reconcile rewrote them, embedding nothing
    assert _cats(factory) == [1, 2, 9]
    (state,) = [c for c in status(new, tables) if c.column == "Article.content"]
    assert state.stale_keywords is None
    recorded = store.collection_info(state.collection)
    assert recorded is not None and recorded["keywords"] == version
    new.uninstall(factory)


def _reconcile_reports(idx: SemanticIndex, bind: Engine) -> list[Any]:
    reports: list[Any] = []
    work = lambda: reports.extend(reconcile(idx, Article, bind, restart=True))  # noqa: E731
    assert _embedded_during(work) == []
    return reports


def test_a_build_left_by_the_release_before_is_finished_not_embedded_again(
    tables: Engine, store: Any
) -> None:
    """``--rebuild --no-switch`` before a deployment, ``--rebuild`` after it: when the new
    release's keyword analysis differs, the build it finds still holds every dense vector; it
    is finished (keyword vectors rewritten, the analyser recorded), not thrown away."""
    from semantic_orm import keywords
    from semantic_orm.maintenance import rebuild

    factory = sessionmaker(tables)
    with factory() as s:
        s.add_all(Article(id=i, title="t", content=t) for i, t in enumerate(_CJK_TEXTS, 1))
        s.commit()
    with pytest.MonkeyPatch.context() as old_release:
        _OlderAnalysis(old_release)
        old = SemanticIndex(store=store, embedder=HashEmbedder(), models=Base)
        (first,) = rebuild(old, Article, tables, switch=False)
        assert first.embedded == 3
    new = SemanticIndex(store=store, embedder=HashEmbedder(), models=Base)
    new.install(factory)
    (second,) = rebuild(new, Article, tables)
    assert second.built_in == first.built_in and second.embedded == 0 and second.switched
    recorded = store.collection_info(second.collection)
    assert recorded is not None and recorded["keywords"] == str(keywords.KEYWORDS_VERSION)
    assert _cats(factory) == [1, 2]
    new.uninstall(factory)


def test_a_collection_that_recorded_no_keyword_analysis_gets_it_from_a_full_pass(
    tables: Engine,
) -> None:
    """Collections of a few earlier releases recorded no analyser: every later change of the
    analysis went unseen. A full pass records it."""
    from semantic_orm import keywords

    store = MemoryStore()
    idx = SemanticIndex(store=store, embedder=HashEmbedder(), models=Base)
    factory = sessionmaker(tables)
    idx.install(factory)
    with factory() as s:
        s.add_all(Article(id=i, title="t", content=t) for i, t in enumerate(_CJK_TEXTS, 1))
        s.commit()
    idx.drain(tables, timeout=30)
    (state,) = [c for c in status(idx, tables) if c.column == "Article.content"]
    store._get(state.collection).meta.pop("keywords")
    reindex(idx, Article, tables, all_rows=True)
    recorded = store.collection_info(state.collection)
    assert recorded is not None and recorded["keywords"] == str(keywords.KEYWORDS_VERSION)
    idx.uninstall(factory)


def test_status_loads_no_model_for_a_column_not_synced_yet(tables: Engine) -> None:
    """``status`` is what an operator runs when the model does not load (a name the machine
    does not have): for a column with no collection yet it compared the declared settings,
    which loaded the model, and failed instead of reporting."""
    from semantic_orm import EmbeddingError

    class Unloadable(HashEmbedder):
        @property
        def dimension(self) -> int:
            raise EmbeddingError("could not load embedding model 'no/such-model'")

    factory = sessionmaker(tables)
    with factory() as s:
        s.add(Article(id=1, title="t", content="a row saved before the index"))
        s.commit()
    idx = SemanticIndex(store=MemoryStore(), embedder=Unloadable(), models=Base)
    (state,) = [c for c in status(idx, tables) if c.column == "Article.content"]
    assert (state.rows, state.indexed_rows, state.drift, state.stale_keywords) == (1, 0, {}, None)


def test_points_of_rows_deleted_by_raw_sql_do_not_keep_the_analysis_unrecorded(
    tables: Engine, store: Any
) -> None:
    """A row deleted by SQL no session saw leaves its points until ``reconcile``: they must
    not keep ``reindex --all`` from recording the new analysis (it never could: each pass
    asked for another)."""
    from semantic_orm import keywords

    factory = sessionmaker(tables)
    _written_by_the_older_release(tables, store, factory)
    with tables.begin() as conn:
        conn.execute(text("DELETE FROM article WHERE id = 3"))  # its points stay
    new = SemanticIndex(store=store, embedder=HashEmbedder(), models=Base)
    reindex(new, Article, tables, all_rows=True)
    (state,) = [c for c in status(new, tables) if c.column == "Article.content"]
    assert state.stale_keywords is None and state.indexed_rows == 3  # (the orphan's too)
    recorded = store.collection_info(state.collection)
    assert recorded is not None and recorded["keywords"] == str(keywords.KEYWORDS_VERSION)
