"""Sync on commit: staging in flush, applying after commit, nothing on rollback.

Plumbing tests: they run on SQLite and PostgreSQL, on both store adapters, with the fake
embedder (search quality is tested with the real model in test_integration.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session as OrmSession
from sqlalchemy.orm import sessionmaker

from semantic_orm import (
    EdgeStore,
    SemanticIndex,
    SemanticTypeError,
    SemanticValueError,
    outbox,
    signals,
)
from semantic_orm.mapping import row_key
from semantic_orm.testing import HashEmbedder

from .models import Article, Note, Plain, Translation

COLL = "article__content"

LONG = "\n\n".join(
    f"Paragraph {i} talks about topic number {i}. It has a second sentence about item {i}."
    for i in range(12)
)


def jobs(engine: Any) -> list[dict[str, Any]]:
    """The outbox rows, oldest first (empty if the table was never created)."""
    from sqlalchemy import inspect as sa_inspect
    from sqlalchemy import select

    if not sa_inspect(engine).has_table(outbox.OUTBOX_TABLE):
        return []
    with engine.connect() as conn:
        rows = conn.execute(select(outbox.outbox).order_by(outbox.outbox.c.id))
        return [dict(r._mapping) for r in rows]


def points_of(index: SemanticIndex, pk: Any, collection: str = COLL) -> list[dict[str, Any]]:
    key = row_key(pk if isinstance(pk, tuple) else (pk,))
    found = index.store.points(collection, key)
    return sorted((dict(p.payload) for p in found), key=lambda p: p["chunk_index"])


def test_insert_syncs_chunks_with_exact_offsets(
    Session: sessionmaker[OrmSession], index: SemanticIndex
) -> None:
    with Session() as s:
        art = Article(title="t", content=LONG)
        s.add(art)
        s.commit()
        pts = points_of(index, art.id)
    assert len(pts) > 3
    assert [p["chunk_index"] for p in pts] == list(range(len(pts)))
    for p in pts:
        assert p["table"] == "article" and p["column"] == "content" and p["pk"] == str(art.id)
        assert p["total_chunks"] == len(pts)
        assert 0 < p["end_offset"] - p["start_offset"] <= 200
    assert pts[0]["start_offset"] == 0
    assert pts[-1]["end_offset"] == len(LONG.rstrip())


def test_nothing_reaches_the_store_before_commit(
    Session: sessionmaker[OrmSession], index: SemanticIndex
) -> None:
    with Session() as s:
        art = Article(title="t", content=LONG)
        s.add(art)
        s.flush()
        assert index.store.count(COLL) == 0
        s.commit()
    assert index.store.count(COLL) > 0


def test_saving_twice_leaves_one_set_of_points(
    Session: sessionmaker[OrmSession], index: SemanticIndex
) -> None:
    with Session() as s:
        art = Article(title="t", content=LONG)
        s.add(art)
        s.commit()
        first = index.store.count(COLL)
        art.content = LONG + " "  # same chunks after trailing whitespace is skipped
        s.commit()
        art.content = LONG
        s.commit()
    assert index.store.count(COLL) == first


def test_update_replaces_chunks_without_stale_points(
    Session: sessionmaker[OrmSession], index: SemanticIndex
) -> None:
    with Session() as s:
        art = Article(title="t", content=LONG)
        other = Article(title="o", content=LONG)
        s.add_all([art, other])
        s.commit()
        before_other = points_of(index, other.id)
        art.content = "A single short sentence now."
        s.commit()
        pts = points_of(index, art.id)
    assert len(pts) == 1
    assert pts[0]["total_chunks"] == 1 and pts[0]["end_offset"] == len(
        "A single short sentence now."
    )
    assert points_of(index, other.id) == before_other


def test_delete_removes_points(Session: sessionmaker[OrmSession], index: SemanticIndex) -> None:
    with Session() as s:
        keep, gone = Article(title="k", content=LONG), Article(title="g", content=LONG)
        s.add_all([keep, gone])
        s.commit()
        s.delete(gone)
        s.commit()
        assert points_of(index, gone.id) == []
        assert len(points_of(index, keep.id)) > 0


def test_setting_none_or_empty_removes_points_and_raises_nothing(
    Session: sessionmaker[OrmSession], index: SemanticIndex
) -> None:
    with Session() as s:
        a, b, c = (
            Article(title="a", content=LONG),
            Article(title="b", content=LONG),
            Article(title="c"),
        )
        s.add_all([a, b, c, Article(title="d", content=""), Article(title="e", content="   \n ")])
        s.commit()
        a.content = None
        b.content = ""
        s.commit()
        assert points_of(index, a.id) == [] and points_of(index, b.id) == []
        assert index.store.count(COLL) == 0


def test_other_columns_embed_nothing(
    Session: sessionmaker[OrmSession], index: SemanticIndex, hash_embedder: HashEmbedder
) -> None:
    with Session() as s:
        art = Article(title="t", content=LONG)
        s.add_all([art, Plain(name="p")])
        s.commit()
        encoded = hash_embedder.texts_encoded
        assert encoded > 0
        art.title = "renamed"
        art.lang = "fr"
        s.add(Plain(name="q"))
        s.commit()
    assert hash_embedder.texts_encoded == encoded


def test_rollback_sends_nothing(
    Session: sessionmaker[OrmSession], index: SemanticIndex, engine: Any
) -> None:
    with Session() as s:
        s.add(Article(title="t", content=LONG))
        s.flush()
        s.rollback()
        s.commit()
    assert index.store.count(COLL) == 0
    assert jobs(engine) == []


def test_exception_inside_begin_sends_nothing(
    Session: sessionmaker[OrmSession], index: SemanticIndex, engine: Any
) -> None:
    with pytest.raises(KeyError):
        with Session.begin() as s:
            s.add(Article(title="t", content=LONG))
            s.flush()
            raise KeyError("boom")
    assert index.store.count(COLL) == 0
    assert jobs(engine) == []


def test_savepoint_rollback_drops_only_its_own_changes(
    Session: sessionmaker[OrmSession], index: SemanticIndex, engine: Any
) -> None:
    with Session() as s:
        kept = Article(title="kept", content="kept text about rivers")
        s.add(kept)
        s.flush()
        with pytest.raises(ValueError):
            with s.begin_nested():
                lost = Article(title="lost", content="lost text about mountains")
                s.add(lost)
                kept.content = "changed inside the savepoint"
                s.flush()
                raise ValueError
        with s.begin_nested():
            released = Article(title="released", content="released text about lakes")
            s.add(released)
        s.commit()
        assert sorted(a.title for a in s.query(Article)) == ["kept", "released"]
    pks = {x.payload["pk"] for x in index.store.points(COLL)}
    assert pks == {str(kept.id), str(released.id)}
    (only,) = points_of(index, kept.id)
    assert only["end_offset"] == len("kept text about rivers")
    (only,) = points_of(index, released.id)
    assert only["end_offset"] == len("released text about lakes")
    assert jobs(engine) == []


def test_released_savepoint_then_root_rollback_sends_nothing(
    Session: sessionmaker[OrmSession], index: SemanticIndex, engine: Any
) -> None:
    with Session() as s:
        with s.begin_nested():
            s.add(Article(title="t", content=LONG))
            with s.begin_nested():
                s.add(Article(title="u", content=LONG))
        s.rollback()
        assert s.query(Article).count() == 0
    assert index.store.count(COLL) == 0
    assert jobs(engine) == []


def test_non_string_value_fails_at_flush_naming_model_and_column(
    Session: sessionmaker[OrmSession], index: SemanticIndex
) -> None:
    with Session() as s:
        s.add(Article(title="t", content=12345))  # type: ignore[arg-type]
        with pytest.raises(SemanticTypeError, match=r"Article\.content.*int"):
            s.flush()


@pytest.mark.parametrize(
    ("value", "pattern"),
    [
        ("bad\x00text", r"Article\.content.*NUL.*index 3"),
        ("bad\ud800x", r"Article\.content.*surrogate"),
    ],
)
def test_unindexable_text_is_refused_clearly(
    Session: sessionmaker[OrmSession], index: SemanticIndex, value: str, pattern: str
) -> None:
    with Session() as s:
        s.add(Article(title="t", content=value))
        with pytest.raises(SemanticValueError, match=pattern):
            s.commit()
        s.rollback()
        assert s.query(Article).count() == 0
    assert index.store.count(COLL) == 0


def test_ten_megabyte_text(Session: sessionmaker[OrmSession], index: SemanticIndex) -> None:
    if not isinstance(index.store, EdgeStore):
        pytest.skip("qdrant-client's local mode is a brute-force test double; Edge is the engine")
    big = ("Une phrase en français, avec des accents: été, où, Noël. " * 40 + "\n\n") * 4400
    assert len(big) > 10_000_000
    with Session() as s:
        art = Article(title="big", content=big)
        s.add(art)
        s.commit()
        total = index.store.count(COLL)
        assert total > len(big) // 200
        sample = points_of(index, art.id)[1234]
        assert big[sample["start_offset"] : sample["end_offset"]].strip() != ""


def test_string_and_composite_primary_keys(
    Session: sessionmaker[OrmSession], index: SemanticIndex
) -> None:
    with Session() as s:
        art = Article(title="t", content="base article")
        s.add(art)
        s.flush()
        s.add(Note(slug="n-1", summary="short summary", body=LONG))
        s.add(Translation(article_id=art.id, lang="fr", text="texte traduit en français"))
        s.commit()
        assert len(points_of(index, "n-1", "note__summary")) == 1
        assert len(points_of(index, "n-1", "note__body")) > 1
        assert len(points_of(index, (art.id, "fr"), "translation__text")) == 1
        s.delete(s.get(Note, "n-1"))
        s.commit()
    assert index.store.count("note__summary") == 0 and index.store.count("note__body") == 0


def test_primary_key_change_moves_points(
    Session: sessionmaker[OrmSession], index: SemanticIndex
) -> None:
    with Session() as s:
        note = Note(slug="old", summary="a summary")
        s.add(note)
        s.commit()
        note.slug = "new"
        s.commit()
    with Session() as s:  # expired attributes: the semantic value is not loaded
        s.get(Note, "new").slug = "newer"  # type: ignore[union-attr]
        s.commit()
    assert points_of(index, "old", "note__summary") == []
    assert points_of(index, "new", "note__summary") == []
    (point,) = points_of(index, "newer", "note__summary")
    assert point["end_offset"] == len("a summary")


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
        assert job["row_pk"] == str(art.id) and job["attempts"] == 1 and not job["dead"]
        assert "unreachable" in job["last_error"]
        assert failures and failures[0]["sender"] is Article
        assert failures[0]["pks"] == [str(art.id)]
        flaky.down = False
        idx.drain(engine, timeout=10)
    assert jobs(engine) == []
    assert len(points_of(idx, art.id)) > 1
    with factory() as s:
        (hit,) = Article.semantic_search(s, "topic number 7", limit=1)
        assert hit.obj.id == art.id


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
    assert jobs(engine) == []
    (only,) = points_of(idx, art.id)
    assert only["end_offset"] == len("newest content")


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
    from semantic_orm import ConfigurationError

    factory = sessionmaker(engine)
    index.install(factory)
    with pytest.raises(ConfigurationError, match="already installed"):
        SemanticIndex(store=store, embedder=HashEmbedder()).install(factory)
    index.uninstall(factory)


def test_signals_carry_model_and_payload(
    Session: sessionmaker[OrmSession], index: SemanticIndex
) -> None:
    seen: dict[str, list[dict[str, Any]]] = {
        "chunked": [],
        "embedded": [],
        "synced": [],
        "searched": [],
    }

    def recorder(name: str) -> Any:
        def receive(sender: Any, **kw: Any) -> None:
            seen[name].append({"sender": sender, **kw})

        return receive

    receivers = {name: recorder(name) for name in seen}
    for name, fn in receivers.items():
        getattr(signals, name).connect(fn)
    try:
        with Session() as s:
            art = Article(title="t", content=LONG)
            s.add(art)
            s.commit()
            hits = Article.semantic_search(s, "topic number 3", limit=1)
            s.delete(art)
            s.commit()
    finally:
        for name, fn in receivers.items():
            getattr(signals, name).disconnect(fn)
    (chunked,) = seen["chunked"]
    assert chunked["sender"] is Article and chunked["column"] == "content"
    assert chunked["pk"] == str(art.id) and len(chunked["chunks"]) > 1
    (embedded,) = seen["embedded"]
    assert embedded["count"] == len(chunked["chunks"]) and embedded["model"] == "hash-embedder"
    assert [s["upserted"] for s in seen["synced"]] == [[str(art.id)], []]
    assert seen["synced"][1]["deleted"] == [str(art.id)]
    (searched,) = seen["searched"]
    assert searched["sender"] is Article and searched["query"] == "topic number 3"
    assert searched["hits"] == hits


def test_raw_sql_changes_are_not_seen_but_do_not_break(
    Session: sessionmaker[OrmSession], index: SemanticIndex
) -> None:
    """Core statements bypass the ORM flush; search still never returns a row gone from SQL."""
    with Session() as s:
        art = Article(title="t", content="rivers and lakes")
        s.add(art)
        s.commit()
        s.execute(text("DELETE FROM article"))
        s.commit()
        assert index.store.count(COLL) == 1
        assert Article.semantic_search(s, "rivers", limit=5) == []
