"""Staging: every write of an installed session becomes outbox jobs, in its own transaction.

Flushes (insert, update, delete, primary-key changes), ORM and Core statements through the
session, the legacy bulk methods and savepoints; rollbacks of any kind take the jobs with them.
Plumbing tests on SQLite and PostgreSQL and on both store adapters, with the fake embedder.
"""

from __future__ import annotations

import datetime as dt
import gc
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import (
    Engine,
    String,
    bindparam,
    delete,
    func,
    insert,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker
from sqlalchemy.orm import Session as OrmSession

from semantic_orm import (
    ConfigurationError,
    SemanticIndex,
    SemanticSearchMixin,
    SemanticText,
    SemanticTypeError,
    SemanticValueError,
)
from semantic_orm.testing import HashEmbedder

from .helpers import (
    COLL,
    LONG,
    assert_index_matches_database,
    jobs,
    payloads,
    points_of,
    reads_of,
    settled,
)
from .models import Article, Base, Note, Plain, Translation


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
    assert settled(engine) == []


def test_what_autocommit_wrote_is_synced_even_when_the_session_rolls_back(
    engine: Engine, store: Any
) -> None:
    """On an ``isolation_level="AUTOCOMMIT"`` engine each flush is durable at once: a session
    that rolls back, or closes without a commit, leaves its rows in SQL. Their jobs were born
    leased to the index and waited out the lease (5 minutes on SQLite) before any sync."""
    eager = sa.create_engine(engine.url, isolation_level="AUTOCOMMIT")  # (no BEGIN recipe)
    Base.metadata.create_all(eager)
    idx = SemanticIndex(store=store, embedder=HashEmbedder())
    factory = sessionmaker(eager)
    idx.install(factory)
    try:
        with factory() as s:
            s.add(Article(id=1, title="t", content="rivers, flushed then rolled back"))
            s.flush()
            s.rollback()
            s.add(Article(id=2, title="t", content="lakes, committed"))
            s.commit()
        with factory() as s:
            s.add(Article(id=3, title="t", content="seas, flushed, never committed"))
            s.flush()
        assert settled(eager) == []  # synced at once, none waits for a lease
        assert assert_index_matches_database(eager, store) == 3
    finally:
        idx.uninstall(factory)
        eager.dispose()


def test_exception_inside_begin_sends_nothing(
    Session: sessionmaker[OrmSession], index: SemanticIndex, engine: Any
) -> None:
    with pytest.raises(KeyError):
        with Session.begin() as s:
            s.add(Article(title="t", content=LONG))
            s.flush()
            raise KeyError("boom")
    assert index.store.count(COLL) == 0
    assert settled(engine) == []


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
    assert settled(engine) == []


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
    assert settled(engine) == []


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


def test_bulk_update_and_delete_statements_enqueue_jobs(installed: Any) -> None:
    idx, factory = installed()
    engine = factory.kw["bind"]
    with factory() as s:
        s.add_all(
            Article(id=i, title="t", lang="en", content=f"old text {i}") for i in range(101, 106)
        )
        s.commit()
        s.execute(update(Article).where(Article.id <= 102).values(content="bulk updated text"))
        s.execute(update(Article), [{"id": 103, "content": "updated by primary key"}])
        s.execute(delete(Article).where(Article.id == 105))
        s.commit()
        s.execute(insert(Article), [{"id": 109, "title": "x", "content": "inserted with pk"}])
        s.execute(insert(Article), [{"title": "x", "content": "no primary key: read back"}])
        s.commit()
        idx.settle()  # the finished jobs of the commits so far (they wait a moment)
        s.execute(update(Article).where(Article.id == 104).values(title="title only"))
        assert [j for j in jobs(engine) if j["row_pk"] == "104"] == []  # no semantic change
        s.commit()
    assert settled(engine) == []
    assert assert_index_matches_database(engine, idx.store) == 6


def test_bulk_update_that_changes_the_primary_key_moves_the_points(installed: Any) -> None:
    idx, factory = installed()
    with factory() as s:
        s.add_all(Article(id=i, title="t", content=f"text of row {i}") for i in (1, 3))
        s.commit()
        s.execute(update(Article).where(Article.id == 1).values(id=2))
        s.execute(update(Article).where(Article.id == 3).values(id=Article.id + 10))
        s.commit()
    assert settled(factory.kw["bind"]) == []
    assert payloads(idx.store, 1) == [] and payloads(idx.store, 3) == []
    assert [p["pk"] for p in payloads(idx.store, 2)] == ["2"]
    assert [p["pk"] for p in payloads(idx.store, 13)] == ["13"]
    assert_index_matches_database(factory.kw["bind"], idx.store)


def test_legacy_bulk_methods_are_synced(installed: Any) -> None:
    idx, factory = installed()
    with factory() as s:
        s.bulk_insert_mappings(Article, [{"title": "b", "content": "row without a key"}])
        s.bulk_insert_mappings(Article, [{"id": 101, "title": "a", "content": "first row"}])
        s.bulk_save_objects([Article(id=105, title="c", content="saved in bulk")])
        s.commit()
        s.bulk_update_mappings(Article, [{"id": 101, "content": "first row, updated"}])
        s.bulk_update_mappings(Article, [{"id": 105, "title": "title only"}])
        obj = s.get(Article, 105)
        assert obj is not None
        s.expunge(obj)
        obj.content = "saved in bulk, then changed"
        s.bulk_save_objects([obj])
        s.commit()
    engine = factory.kw["bind"]
    assert settled(engine) == []
    assert assert_index_matches_database(engine, idx.store) >= 3
    hit = Article.semantic_search(factory(), "changed", limit=1, mode="keyword", index=idx)
    assert hit[0].obj.id == 105


def test_core_statements_through_the_session_are_synced(installed: Any) -> None:
    idx, factory = installed()
    table = Article.__table__
    with factory() as s:
        s.execute(insert(table).values(title="t", content="core row without key"))
        s.execute(
            insert(table),
            [{"id": i, "title": "t", "content": f"core row {i}"} for i in (101, 2, 3)],
        )
        s.commit()
        s.execute(update(table).where(table.c.id == 2).values(content="core row two, changed"))
        s.execute(delete(table).where(table.c.id == 3))
        s.connection().execute(
            update(table).where(table.c.id == 101).values(content="via connection")
        )
        s.commit()
    engine = factory.kw["bind"]
    assert settled(engine) == []
    assert payloads(idx.store, 3) == []
    assert assert_index_matches_database(engine, idx.store) == 3


def test_insert_with_values_and_a_primary_key_is_accepted(installed: Any) -> None:
    idx, factory = installed()
    with factory() as s:
        s.execute(insert(Article).values(title="t", content="no key, read back"))
        s.execute(insert(Article).values(id=7, title="t", content="inserted with values"))
        bound = insert(Article).values(id=bindparam("pid"), title="t", content=bindparam("c"))
        s.execute(bound, {"pid": 8, "c": "a key bound by another name"})
        s.execute(bound, [{"pid": 9, "c": "bound, many"}, {"pid": 10, "c": "bound, many too"}])
        s.execute(
            insert(Article).values(
                [
                    {"id": 20, "title": "x", "content": "multi one"},
                    {"id": 21, "title": "y", "content": "multi two"},
                ]
            )
        )
        s.commit()
        with pytest.raises(ConfigurationError, match=r"returning\(\) of its own.* obj.id"):
            s.execute(insert(Article).values(title="t", content="x").returning(Article.title))
        s.rollback()
        with pytest.raises(ConfigurationError, match="from a SELECT"):
            s.execute(
                insert(Article).from_select(
                    ["title", "content"], select(Article.title, Article.content)
                )
            )
        s.rollback()
        with pytest.raises(SemanticValueError, match="NUL"):  # checked under its own name too
            s.execute(bound, {"pid": 11, "c": "a\x00b"})
        s.rollback()
    assert assert_index_matches_database(factory.kw["bind"], idx.store) == 7


def test_statements_after_a_refused_flush_are_still_synced(installed: Any) -> None:
    """A flush refused before it began (a value that cannot be indexed, an application's
    before_flush that raises) never reaches after_flush_postexec: the session took every later
    statement for the flush's own, and left their rows stale."""
    idx, factory = installed()
    with factory() as s:
        s.add(Article(id=1, title="t", content="the first text"))
        s.commit()
        bad = Article(id=2, title="t", content="a\x00b")
        s.add(bad)
        with pytest.raises(SemanticValueError):
            s.flush()
        s.expunge(bad)
        s.execute(update(Article).where(Article.id == 1).values(content="changed by a statement"))
        s.commit()
    assert [p["end_offset"] for p in points_of(idx, 1)] == [len("changed by a statement")]
    assert assert_index_matches_database(factory.kw["bind"], idx.store) == 1


def test_a_statement_naming_a_key_in_an_or_reaches_the_other_rows_too(installed: Any) -> None:
    """``WHERE id = :i OR title = :t`` pins no row by its key: the rows the other branch
    names were left stale (or their points kept, for a delete)."""
    idx, factory = installed()
    with factory() as s:
        s.add_all(Article(id=i, title=f"t{i}", content=f"row {i} about rivers") for i in (1, 2, 3))
        s.commit()
        by_key_or_title = or_(Article.id == bindparam("i"), Article.title == bindparam("t"))
        s.execute(
            update(Article).where(by_key_or_title).values(content="changed, about lakes"),
            {"i": 1, "t": "t2"},
        )
        s.execute(delete(Article).where(by_key_or_title), {"i": 9, "t": "t3"})
        s.commit()
    assert payloads(idx.store, 3) == []
    assert assert_index_matches_database(factory.kw["bind"], idx.store) == 2


def test_an_sql_expression_assigned_to_the_attribute_is_synced(installed: Any) -> None:
    """``obj.content = func.upper(...)`` (SQLAlchemy runs it in the flush's UPDATE) was refused
    as not a str; then, the flush expiring the attribute, it queued nothing."""
    idx, factory = installed()
    with factory() as s:
        one = Article(id=1, title="t", content="a text about rivers")
        s.add_all([one, Article(id=2, title="t", content=func.lower("A NEW ROW ABOUT LAKES"))])
        s.commit()
        one.content = Article.content + ", and about the sea"
        s.commit()
        assert one.content == "a text about rivers, and about the sea"
        # a flush that fails after the expression was noted leaves nothing behind for the
        # session's next flush (the object is gone by then)
        doomed = Article(id=3, title="t", content="a third row")
        s.add(doomed)
        s.commit()
        doomed.content = func.upper("replaced")
        s.add(Article(id=5, title=None, content="a row the database refuses"))
        with pytest.raises(IntegrityError):
            s.flush()
        s.rollback()
        s.expunge_all()
        del doomed
        gc.collect()
        s.add(Article(id=4, title="t", content="a fourth row"))
        s.commit()
    assert assert_index_matches_database(factory.kw["bind"], idx.store) == 4


def test_bad_values_in_statements_raise_library_errors(installed: Any) -> None:
    _idx, factory = installed()
    table = Article.__table__
    with factory() as s:
        with pytest.raises(SemanticTypeError, match="content"):
            s.execute(insert(Article).values(id=1, title="t", content=42))
        s.rollback()
        with pytest.raises(SemanticValueError, match="NUL"):
            s.execute(insert(table), [{"id": 2, "title": "t", "content": "a\x00b"}])
        s.rollback()
        s.add(Article(id=3, title="t", content="fine"))
        s.commit()
        with pytest.raises(SemanticTypeError, match="content"):
            s.execute(update(Article).where(Article.id == 3).values(content=b"bytes"))
        s.rollback()
    with factory.kw["bind"].begin() as conn, pytest.raises(SemanticValueError):  # no session
        conn.execute(insert(table).values(id=4, title="t", content="\ud800"))


class _Upserts(DeclarativeBase):
    pass


class Keyed(SemanticSearchMixin, _Upserts):
    """Rows an import job upserts by their natural key (``slug``), not their primary key."""

    __tablename__ = "upserted_doc"
    __table_args__ = (sa.UniqueConstraint("lang", "slug"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    slug: Mapped[str] = mapped_column(String(20), unique=True)
    lang: Mapped[str] = mapped_column(String(8), default="en")
    body: Mapped[str | None] = mapped_column(SemanticText())


def test_an_upsert_on_a_natural_key_syncs_the_row_it_updated(
    engine: Engine, store: Any, installed: Any
) -> None:
    """``INSERT ... ON CONFLICT (slug) DO UPDATE`` naming a new primary key updates the row
    that holds the slug: that row's key was never queued (its points kept the old text), the
    named one was. The rows holding the values of the conflict's columns are read first (a
    column left out takes its default), and a one-row upsert returns the keys it wrote."""
    dialect_insert = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}
    upsert = dialect_insert[engine.dialect.name]
    idx, factory = installed(metadata=_Upserts.metadata, expire_on_commit=True)

    def on_slug(stmt: Any) -> Any:
        return stmt.on_conflict_do_update(
            index_elements=["slug"], set_={"body": stmt.excluded.body}
        )

    with factory() as s:
        s.add_all(Keyed(id=i, slug=slug, body=f"{slug} about tides") for i, slug in enumerate("ab"))
        s.commit()
        by_key = upsert(Keyed).values(id=1, slug="b", body="b about fog")
        by_key = by_key.on_conflict_do_update(
            index_elements=["id"], set_={"body": by_key.excluded.body}
        )
        assert not s.execute(by_key).returns_rows  # on its primary key: sent as written
        s.execute(on_slug(upsert(Keyed).values(id=10, slug="a", body="a about volcanoes")))
        s.execute(
            on_slug(upsert(Keyed.__table__)),
            [
                {"id": 11, "slug": "b", "body": "b about snow"},
                {"id": 12, "slug": "c", "body": "c about deserts"},
            ],
        )
        s.commit()
        stmt = on_slug(upsert(Keyed).values(id=13, slug="c", body="c about forests"))
        assert s.scalar(stmt.returning(Keyed.id)) == 12  # the caller's RETURNING, untouched
        s.execute(  # an ORM bulk upsert
            on_slug(upsert(Keyed)), [{"id": 14, "slug": "a", "body": "a about glaciers"}]
        )
        s.execute(upsert(Keyed).values(id=15, slug="b", body="ignored").on_conflict_do_nothing())
        s.commit()
        lowered = upsert(Keyed).values(id=16, slug=func.lower("A"), body="a about nothing")
        with pytest.raises(ConfigurationError, match="cannot be told before it runs"):
            s.execute(on_slug(lowered).returning(Keyed.id))  # the rows it updates: unknown
        s.rollback()
        s.execute(on_slug(lowered))  # without returning(), the index's RETURNING tells
        s.commit()
        s.execute(  # two rows updating one: each its own statement, as without the index
            on_slug(upsert(Keyed)),
            [
                {"id": 20, "slug": "b", "body": "b about storms"},
                {"id": 21, "slug": "b", "body": "b about hail"},
            ],
        )
        moved = upsert(Keyed).values(id=30, slug="c", body="c about reefs")
        s.execute(  # the update moves the row to the key the insert named: 12 becomes 30
            moved.on_conflict_do_update(
                index_elements=["slug"], set_={"id": moved.excluded.id, "body": "c about reefs"}
            )
        )
        both = upsert(Keyed).values(id=40, slug="a", body="a about moss")  # lang: its default
        both = both.on_conflict_do_update(
            index_elements=["lang", "slug"], set_={"body": both.excluded.body}
        )
        assert s.scalar(both.returning(Keyed.id)) == 0
        s.commit()  # (row 0 then has no job in the transaction below but its conflict's)
        called = on_slug(
            upsert(Keyed.__table__).values(slug=bindparam("sl", callable_=lambda: "a"))
        )
        s.execute(
            called, [{"id": 60, "body": "a about gulls"}, {"id": 61, "body": "a about terns"}]
        )
        if engine.dialect.name == "postgresql":  # a constraint only the database names
            named = upsert(Keyed).values(id=50, slug="b", body="b about dew")
            named = named.on_conflict_do_update(
                constraint="upserted_doc_slug_key", set_={"body": named.excluded.body}
            )
            assert s.scalar(named.returning(Keyed.id)) == 1
        s.commit()
    idx.drain(engine, timeout=10)
    coll = "upserted_doc__body"
    assert assert_index_matches_database(engine, store, Keyed, "body", coll) == 3
    last = "dew" if engine.dialect.name == "postgresql" else "hail"
    with factory() as s:
        for query, key in (("terns", 0), (last, 1), ("reefs", 30)):
            assert [h.obj.id for h in Keyed.semantic_search(s, query, limit=1)] == [key]


class _Derived(DeclarativeBase):
    pass


class Summed(SemanticSearchMixin, _Derived):
    """A semantic column the database computes from two others."""

    __tablename__ = "computed_doc"
    id: Mapped[int] = mapped_column(primary_key=True)
    title: Mapped[str] = mapped_column(String(50))
    abstract: Mapped[str] = mapped_column(sa.Text())
    body: Mapped[str | None] = mapped_column(
        SemanticText(), sa.Computed("title || ': ' || abstract", persisted=True)
    )


def _about(ctx: Any) -> str:
    return "a text about " + ctx.get_current_parameters()["title"]


class Stamped(SemanticSearchMixin, _Derived):
    """A semantic column SQLAlchemy rewrites on every update of its row."""

    __tablename__ = "onupdate_doc"
    id: Mapped[int] = mapped_column(primary_key=True)
    title: Mapped[str] = mapped_column(String(50))
    body: Mapped[str | None] = mapped_column(SemanticText(), default=_about, onupdate=_about)


def test_a_column_computed_from_others_follows_their_writes(
    engine: Engine, store: Any, installed: Any
) -> None:
    """Writing only a column a ``Computed`` (or ``onupdate``) semantic column derives from
    changes the indexed text: such writes queued nothing, and the row stayed stale."""
    idx, factory = installed(metadata=_Derived.metadata, expire_on_commit=True)
    with factory() as s:
        s.add_all(Summed(id=i, title=f"t{i}", abstract=f"abstract {i}") for i in (1, 2))
        s.add_all(Stamped(id=i, title=f"t{i}") for i in (1, 2))
        s.commit()
        for model in (Summed, Stamped):
            row = s.get(model, 1)
            assert row is not None
            row.title = "retitled by the ORM"
            s.execute(update(model).where(model.id == 2).values(title="retitled by a statement"))
        s.commit()
    idx.drain(engine, timeout=10)
    for model, coll in ((Summed, "computed_doc__body"), (Stamped, "onupdate_doc__body")):
        assert assert_index_matches_database(engine, store, model, "body", coll) == 2


LATER = dt.datetime(2030, 1, 1)


class Flagged(SemanticSearchMixin, _Derived):
    """Values that travel with the vectors (``filter_by``), derived from the row's others."""

    __tablename__ = "flagged_doc"
    id: Mapped[int] = mapped_column(primary_key=True)
    title: Mapped[str] = mapped_column(String(50))
    priority: Mapped[int] = mapped_column(default=0)
    checked_at: Mapped[dt.datetime] = mapped_column(
        default=dt.datetime(2020, 1, 1), onupdate=lambda: LATER
    )
    urgent: Mapped[int] = mapped_column(
        sa.Integer, sa.Computed("CASE WHEN priority > 5 THEN 1 ELSE 0 END", persisted=True)
    )
    body: Mapped[str | None] = mapped_column(SemanticText(filter_by=("checked_at", "urgent")))


def test_filter_values_derived_from_others_follow_their_writes(
    engine: Engine, store: Any, installed: Any
) -> None:
    """A ``filter_by`` value the database computes (``Computed``) or SQLAlchemy rewrites
    (``onupdate``) changes with a write to another column: such writes queued nothing, and a
    where= on the new value missed the rows."""
    idx, factory = installed(metadata=_Derived.metadata)
    with factory() as s:
        s.add_all(Flagged(id=i, title=f"t{i}", body=f"release checklist {i}") for i in (1, 2))
        s.commit()
        row = s.get(Flagged, 1)
        assert row is not None
        row.priority = 9
        s.execute(update(Flagged).where(Flagged.id == 2).values(priority=9))
        s.commit()
    idx.drain(engine, timeout=10)
    for pk in (1, 2):
        (point,) = points_of(idx, pk, "flagged_doc__body")
        assert point["f"] == {"checked_at": "2030-01-01T00:00:00.000000Z", "urgent": 1}
    with factory() as s:
        for where in (Flagged.urgent == 1, Flagged.checked_at >= LATER):
            hits = Flagged.semantic_search(s, "release checklist", limit=5, where=where)
            assert sorted(h.obj.id for h in hits) == [1, 2]


@pytest.mark.parametrize("first", ["index", "application", "ahead"])
@pytest.mark.parametrize(
    "how",
    ["core", "orm", "insert", "by_key", "bulk_mappings", "text", "mapper_event", "mapper_text"],
)
def test_a_flush_listeners_writes_to_a_semantic_table_are_queued(
    engine: Engine, index: SemanticIndex, first: str, how: str
) -> None:
    """An application's flush listener that writes a semantic column (a summary kept up to
    date, say) runs its statements inside the flush: they are queued like any statement of
    the session (the bulk paths by primary key too, which run with the flush's own compiled
    cache), and the text the flush wrote to a row they may rewrite is not trusted (raw SQL
    too), whether the listener was registered before the index's, after it, or after it but
    ahead of it (``insert=True``). So are the writes of a mapper event's listener, which runs
    while the flush sends its statements."""
    Base.metadata.create_all(engine)
    factory = sessionmaker(engine, expire_on_commit=False)
    table = Article.__table__

    def rewrite(session: OrmSession, plain: list[Plain]) -> None:
        texts = {pk: f"row {pk} rewritten by the listener: volcanoes erupt lava" for pk in (1, 2)}
        if how == "orm":
            for pk, text_ in texts.items():
                session.execute(update(Article).where(Article.id == pk).values(content=text_))
        elif how == "by_key":  # an executemany by primary key
            session.execute(update(Article), [{"id": k, "content": t} for k, t in texts.items()])
        elif how == "bulk_mappings":
            session.bulk_update_mappings(
                Article,  # type: ignore[arg-type]
                [{"id": k, "content": t} for k, t in texts.items()],
            )
        elif how == "text":  # the flush's row only: raw SQL queues nothing, reconcile does
            session.execute(
                sa.text("UPDATE article SET content = :c WHERE id = 2"), {"c": texts[2]}
            )
        else:
            for pk, text_ in texts.items():
                session.connection().execute(
                    update(table).where(table.c.id == pk).values(content=text_)
                )
        if how == "insert":
            session.connection().execute(
                insert(table).values(id=10 + plain[0].id, title="t", content="a new row")
            )

    def after_flush(session: OrmSession, flush_context: Any) -> None:
        plain = [obj for obj in session.new if isinstance(obj, Plain)]
        if plain:
            rewrite(session, plain)

    def after_insert(mapper: Any, connection: Any, target: Plain) -> None:
        texts = {1: "row 1 rewritten by the listener: volcanoes", 2: "row 2: volcanoes"}
        if how == "mapper_text":  # the flush's row only, as for "text"
            connection.execute(
                sa.text("UPDATE article SET content = :c WHERE id = 2"), {"c": texts[2]}
            )
            return
        for pk, text_ in texts.items():
            connection.execute(update(table).where(table.c.id == pk).values(content=text_))

    def listen() -> None:
        if how.startswith("mapper_"):
            sa.event.listen(Plain, "after_insert", after_insert, insert=first == "ahead")
        else:
            sa.event.listen(factory, "after_flush", after_flush, insert=first == "ahead")

    if first == "application":
        listen()
    index.install(factory)
    if first != "application":
        listen()
    try:
        with factory() as s:
            s.add_all(Article(id=i, title=f"t{i}", content=f"cats purr {i}") for i in (1, 2))
            s.commit()
        with factory() as s:
            s.add(Plain(id=1, name="seed"))  # (rows 1 and 2 are not in this flush)
            s.commit()
        index.drain(engine, timeout=10)
        if not how.endswith("text"):  # (raw SQL on a row no flush wrote is reconcile's)
            assert_index_matches_database(engine, index.store)
        with factory() as s:
            row = s.get(Article, 2)
            assert row is not None
            row.content = "the flush writes this text, which the listener replaces"
            s.add(Plain(id=2, name="touch"))
            s.commit()
        index.drain(engine, timeout=10)
        with engine.connect() as conn:
            texts = dict(conn.execute(select(table.c.id, table.c.content)).all())
        assert "volcanoes" in texts[2] and ("volcanoes" in texts[1]) != how.endswith("text")
        assert sorted(texts) == ([1, 2, 11, 12] if how == "insert" else [1, 2])
        assert_index_matches_database(engine, index.store)  # row 2 read back, for "text"
        assert not jobs(engine)
    finally:
        index.uninstall(factory)
        if sa.event.contains(Plain, "after_insert", after_insert):
            sa.event.remove(Plain, "after_insert", after_insert)


class _Linked(DeclarativeBase):
    pass


class _SecondLink(_Linked):
    """An association row with a semantic note, also a plain many-to-many's ``secondary``."""

    __tablename__ = "second_link"
    id: Mapped[int] = mapped_column(primary_key=True)  # a surrogate key: the database's
    left_id: Mapped[int] = mapped_column(sa.ForeignKey("second_left.id"))
    right_id: Mapped[int] = mapped_column(sa.ForeignKey("second_right.id"))
    note: Mapped[str | None] = mapped_column(SemanticText(), default="a link about lakes")


class _SecondRight(_Linked):
    __tablename__ = "second_right"
    id: Mapped[int] = mapped_column(primary_key=True)


class _SecondLeft(_Linked):
    __tablename__ = "second_left"
    id: Mapped[int] = mapped_column(primary_key=True)
    rights = sa.orm.relationship(_SecondRight, secondary="second_link", overlaps="links")
    links = sa.orm.relationship(_SecondLink, overlaps="rights")


@pytest.mark.parametrize("returning", [True, False])
def test_a_semantic_secondary_tables_rows_written_by_the_flush(
    engine: Engine, index: SemanticIndex, returning: bool
) -> None:
    """A table with a semantic column used as a many-to-many ``secondary``: the flush writes
    its rows itself. A row it deletes leaves the index; one it inserts (with a default text) is
    indexed where its new key can be read back, and, without INSERT ... RETURNING, not refused
    either (indexed once a session writes its text)."""
    _Linked.metadata.create_all(engine)
    factory = sessionmaker(engine, expire_on_commit=False)
    index.install(factory)
    saved = engine.dialect.insert_returning
    engine.dialect.insert_returning = returning
    try:
        with factory() as s:
            s.add(_SecondLeft(id=1, rights=[_SecondRight(id=1), _SecondRight(id=2)]))
            s.commit()
        index.drain(engine, timeout=10)
        coll = "second_link__note"
        if returning:
            assert assert_index_matches_database(engine, index.store, _SecondLink, "note", coll)
        else:
            assert index.store.count(coll) == 0  # (no key to name them by: not refused)
        with factory() as s:
            for link in s.scalars(select(_SecondLink)):
                link.note = f"a note about link {link.id} and its rivers"
            s.commit()
        index.drain(engine, timeout=10)
        assert assert_index_matches_database(engine, index.store, _SecondLink, "note", coll) == 2
        with factory() as s:
            left = s.get(_SecondLeft, 1)
            assert left is not None
            left.rights.remove(s.get(_SecondRight, 1))  # the flush deletes its link row
            s.commit()
        index.drain(engine, timeout=10)
        assert assert_index_matches_database(engine, index.store, _SecondLink, "note", coll) == 1
        assert not jobs(engine)
    finally:
        engine.dialect.insert_returning = saved
        index.uninstall(factory)
        _Linked.metadata.drop_all(engine)


def test_statements_of_a_before_flush_listener_leave_the_flushs_texts_trusted(
    engine: Engine, index: SemanticIndex
) -> None:
    """A ``before_flush`` listener's statement (an audit row, say) runs before the flush
    writes anything: the texts the flush then writes are what its rows hold, and the commit
    does not read them back, whichever of the two listeners came first."""
    Base.metadata.create_all(engine)
    factory = sessionmaker(engine, expire_on_commit=False)
    index.install(factory)
    plain = Plain.__table__

    def audit(session: OrmSession, flush_context: Any, instances: Any) -> None:
        session.connection().execute(insert(plain).values(name="audit"))

    sa.event.listen(factory, "before_flush", audit)
    try:
        with reads_of(engine, "article") as seen, factory() as s:
            s.add(Article(id=1, title="t", content="a row about rivers"))
            s.commit()
        assert seen == []
        assert assert_index_matches_database(engine, index.store) == 1
    finally:
        index.uninstall(factory)
