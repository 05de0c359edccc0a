"""Durable, incremental sync: the outbox, workers, backfill, bulk statements, and faults.

Every test here breaks something on purpose and checks that nothing is lost: the database and
the index agree once the workers have drained. They run on SQLite and PostgreSQL (the
concurrency test on PostgreSQL only: SQLite has one writer), with the fake embedder.
"""

from __future__ import annotations

import datetime as dt
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import sessionmaker

from semantic_orm import (
    ConfigurationError,
    EdgeStore,
    EmbeddingError,
    SemanticIndex,
    outbox,
)
from semantic_orm.cli import main as cli_main
from semantic_orm.maintenance import reindex, status
from semantic_orm.mapping import row_key
from semantic_orm.testing import FlakyStore, HashEmbedder
from semantic_orm.worker import Worker

from .models import Article, Base
from .test_sync import jobs

ROOT = Path(__file__).resolve().parents[1]
COLL = "article__content"
CHUNKER = Article.__table__.c.content.type.make_chunker()  # Article.content's settings


def expected_points(text: str | None) -> list[tuple[int, int, int, int]]:
    """(index, start, end, total) of the chunks ``text`` must have in the index."""
    if not text:
        return []
    return [(c.index, c.start_offset, c.end_offset, c.total_chunks) for c in CHUNKER.chunk(text)]


def actual_points(store: Any, pk: Any) -> list[tuple[int, int, int, int]]:
    found = [dict(p.payload) for p in store.points(COLL, row_key((pk,)))]
    return sorted(
        (p["chunk_index"], p["start_offset"], p["end_offset"], p["total_chunks"]) for p in found
    )


def assert_index_matches_database(engine: Engine, store: Any) -> int:
    """Every row's points are exactly its current text's chunks; nothing else is indexed."""
    with engine.connect() as conn:
        rows = dict(conn.execute(select(Article.id, Article.content)).all())
    total = 0
    for pk, text in rows.items():
        assert actual_points(store, pk) == expected_points(text), pk
        total += len(expected_points(text))
    indexed = {p.payload["pk"] for p in store.points(COLL)}
    assert indexed <= {row_key((pk,)) for pk, text in rows.items() if text and text.strip()}
    assert store.count(COLL) == total
    return total


class PoisonEmbedder(HashEmbedder):
    """Fails, permanently, on any batch holding the word POISON."""

    def encode(self, texts: Any) -> Any:
        if any("POISON" in t for t in texts):
            raise EmbeddingError("this text poisons the model")
        return super().encode(texts)


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
    (col,) = status(idx, tables)
    assert (col.rows, col.indexed_rows, col.pending_jobs, col.dead_jobs) == (101, 100, 0, 1)
    with tables.begin() as conn:
        assert outbox.requeue_dead(conn) == 1
    (job,) = jobs(tables)
    assert not job["dead"] and job["attempts"] == 0


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


@pytest.mark.parametrize("seed", [1, 2])
def test_randomized_operations_converge(tables: Engine, store: Any, seed: int) -> None:
    """2,000+ random operations with outages and rollbacks; then the index equals the database."""
    rng = random.Random(seed)
    flaky = FlakyStore(store)
    idx = SemanticIndex(store=flaky, embedder=HashEmbedder(), retry_base=0)
    factory = sessionmaker(tables, expire_on_commit=False)
    idx.install(factory)
    words = "river lake sea rain cloud snow ice storm wind sun".split()

    def text() -> str | None:
        roll = rng.random()
        if roll < 0.1:
            return None
        if roll < 0.15:
            return ""
        paras = rng.randint(1, 4)
        return "\n\n".join(
            " ".join(rng.choice(words) for _ in range(rng.randint(3, 60))) + "."
            for _ in range(paras)
        )

    ops = 0
    s = factory()
    while ops < 2000:
        ops += 1
        roll = rng.random()
        ids = s.execute(select(Article.id)).scalars().all()
        if roll < 0.25 or not ids:
            s.add(Article(title="r", content=text()))
        elif roll < 0.5:
            art = s.get(Article, rng.choice(ids))
            if art is not None:
                art.content = text()
        elif roll < 0.6:
            art = s.get(Article, rng.choice(ids))
            if art is not None:
                s.delete(art)
        elif roll < 0.75:
            s.commit()
        elif roll < 0.82:
            s.rollback()
        elif roll < 0.87:
            try:
                with s.begin_nested():
                    s.add(Article(title="sp", content=text()))
                    if rng.random() < 0.5:
                        raise KeyError
            except KeyError:
                pass
        elif roll < 0.93:
            flaky.down = not flaky.down
        else:
            s.commit()
            if not flaky.down:
                idx.process(tables)
    s.commit()
    s.close()
    flaky.down = False
    idx.drain(tables, timeout=60)
    assert jobs(tables) == []
    assert assert_index_matches_database(tables, store) > 0


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
    assert jobs(engine) == []
    assert assert_index_matches_database(engine, store) > 0
    store.close()
    engine.dispose()


def test_editing_one_paragraph_embeds_only_its_chunks(tables: Engine, store: Any) -> None:
    embedder = HashEmbedder()
    idx = SemanticIndex(store=store, embedder=embedder)
    factory = sessionmaker(tables, expire_on_commit=False)
    idx.install(factory)
    paras = [f"Paragraph {i} says something about topic {i} and item {i}." for i in range(120)]
    with factory() as s:
        art = Article(title="long", content="\n\n".join(paras))
        s.add(art)
        s.commit()
        total = store.count(COLL)
        assert total >= 30
        first = embedder.texts_encoded
        paras[60] = "Paragraph 60 now says something entirely different."
        art.content = "\n\n".join(paras)
        s.commit()
        assert embedder.texts_encoded - first <= 3  # the chunk(s) touching it, with overlap
        before = embedder.texts_encoded
        art.content = "A new opening paragraph.\n\n" + art.content  # every chunk moves
        s.commit()
        moved = embedder.texts_encoded - before
        assert moved <= 3  # moved chunks keep their vectors: payload updates only
    assert_index_matches_database(tables, store)
    # the vectors of moved chunks are the ones their text would get
    hit = Article.semantic_search(factory(), "Paragraph 45 topic 45 item 45", limit=1, index=idx)
    assert "Paragraph 45" in hit[0].chunk.text
    # moved points are rewritten with keyword vectors recomputed from their text
    kw = Article.semantic_search(
        factory(), "entirely different", limit=1, group_by="chunk", mode="keyword", index=idx
    )
    assert "entirely different" in kw[0].chunk.text


def test_changed_chunking_re_embeds_everything(tables: Engine, store: Any) -> None:
    embedder = HashEmbedder()
    idx = SemanticIndex(store=store, embedder=embedder)
    factory = sessionmaker(tables, expire_on_commit=False)
    idx.install(factory)
    with factory() as s:
        art = Article(title="t", content="\n\n".join(f"Para {i} text." for i in range(30)))
        s.add(art)
        s.commit()
    n = store.count(COLL)
    col = idx.column_for("article", "content")
    assert col is not None
    idx._fingerprints[id(col.settings)] = "changed-config"  # as a new chunker or model would
    before = embedder.texts_encoded
    with factory() as s:
        s.get(Article, art.id).title = "renamed"  # type: ignore[union-attr]
        s.commit()
    assert embedder.texts_encoded == before  # other columns: nothing to do
    reindex(idx, Article, tables, all_rows=True)
    assert embedder.texts_encoded - before == n


def test_bulk_update_and_delete_statements_enqueue_jobs(tables: Engine, store: Any) -> None:
    idx = SemanticIndex(store=store, embedder=HashEmbedder())
    factory = sessionmaker(tables)
    idx.install(factory)
    with factory() as s:
        s.add_all(Article(id=i, title="t", lang="en", content=f"old text {i}") for i in range(1, 6))
        s.commit()
        s.execute(update(Article).where(Article.id <= 2).values(content="bulk updated text"))
        s.execute(update(Article), [{"id": 3, "content": "updated by primary key"}])
        s.execute(delete(Article).where(Article.id == 5))
        s.commit()
        s.execute(insert(Article), [{"id": 9, "title": "x", "content": "inserted with pk"}])
        s.commit()
        with pytest.raises(ConfigurationError, match="bulk insert into Article"):
            s.execute(insert(Article), [{"title": "x", "content": "no primary key"}])
        s.rollback()
    assert jobs(tables) == []
    assert assert_index_matches_database(tables, store) == 5


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
    assert "queue Article.content" in err and "/s" in err and "ETA" in err
    idx.drain(tables, timeout=30)
    (after,) = [c for c in status(idx, tables) if c.column == "Article.content"]
    assert (after.rows, after.indexed_rows, after.pending_jobs) == (25, 25, 0)
    assert_index_matches_database(tables, store)


def test_cli_status_reindex_and_worker(
    tables: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    import importlib
    import json

    monkeypatch.setenv("SEMANTIC_ORM_TEST_DB", tables.url.render_as_string(hide_password=False))
    monkeypatch.setenv("SEMANTIC_ORM_TEST_VECTORS", str(tmp_path / "cli-vectors"))
    sys.modules.pop("tests.cli_app", None)
    app = importlib.import_module("tests.cli_app")
    with app.Session() as s:
        s.add_all(Article(title=f"t{i}", content=f"row {i}") for i in range(4))
        s.commit()  # deferred: jobs wait for the worker
    assert cli_main(["status", "tests.cli_app:index", "--json"]) == 0
    (row,) = [r for r in json.loads(capsys.readouterr().out) if r["column"] == "Article.content"]
    assert row["column"] == "Article.content" and row["pending_jobs"] == 4
    assert row["indexed_rows"] == 0 and row["oldest_pending_age_s"] >= 0
    assert cli_main(["worker", "tests.cli_app:index", "--once", "--poll", "0.01"]) == 0
    assert "4 jobs done" in capsys.readouterr().err
    assert cli_main(["reindex", "tests.cli_app:index", "tests.models:Article", "--all"]) == 0
    assert "queued and processed 4 rows of Article" in capsys.readouterr().out
    assert cli_main(["status", "tests.cli_app:index"]) == 0
    table = capsys.readouterr().out
    assert "Article.content" in table and " 4 " in table
    assert cli_main(["status", "tests.cli_app"]) == 2  # not module:attribute
    assert "expected module:attribute" in capsys.readouterr().err
    assert cli_main(["status", "tests.cli_app:Session"]) == 2
    assert "not a SemanticIndex" in capsys.readouterr().err
    app.index.close()
    app.engine.dispose()
