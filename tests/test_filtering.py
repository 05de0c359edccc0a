"""Filter columns (``SemanticText(filter_by=...)``): payloads, ``where=`` inside the store.

The property test draws random ``where=`` expressions over the declared columns and checks that
the search returns exactly the rows SQL selects, in the order of the unfiltered ranking, on
both databases and both store adapters, and that the filter really ran in the store.
"""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import itertools
import logging
import random
import threading
import warnings
from collections.abc import Iterator
from typing import Any, Literal

import pytest
import sqlalchemy as sa
from sqlalchemy import (
    Boolean,
    DateTime,
    Engine,
    Integer,
    String,
    and_,
    func,
    not_,
    or_,
    select,
    update,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from semantic_orm import (
    ConfigurationError,
    EdgeStore,
    FilterFallbackWarning,
    SemanticIndex,
    SemanticText,
    semantic_search,
    signals,
)
from semantic_orm.filtering import compile_where, filter_fields
from semantic_orm.mapping import semantic_columns
from semantic_orm.testing import HashEmbedder

from .helpers import assert_index_matches_database

MODES: tuple[Literal["dense", "keyword"], ...] = ("dense", "keyword")
WORDS = "river mountain forest ocean desert city garden winter summer music".split()


class Base(DeclarativeBase):
    pass


class Post(Base):
    __tablename__ = "post"
    id: Mapped[int] = mapped_column(primary_key=True)
    tenant: Mapped[int] = mapped_column(Integer)
    lang: Mapped[str | None] = mapped_column(String(8))
    draft: Mapped[bool | None] = mapped_column(Boolean)
    published: Mapped[dt.datetime | None] = mapped_column(DateTime)
    other: Mapped[int | None] = mapped_column(Integer)
    body: Mapped[str | None] = mapped_column(
        SemanticText(
            chunk_size=60, overlap=0, filter_by=("lang", "draft", "published"), tenant="tenant"
        )
    )


def _body(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 25)))


@pytest.fixture
def posts(engine: Engine, store: Any) -> Iterator[sessionmaker[Any]]:
    embedder = HashEmbedder(dimension=32)
    idx = SemanticIndex(store=store, embedder=embedder, models=[Post])
    Base.metadata.create_all(engine)
    factory = sessionmaker(engine, expire_on_commit=False)
    idx.install(factory)
    rng = random.Random(7)
    start = dt.datetime(2024, 1, 1)
    with factory() as s:
        for i in range(1, 81):
            s.add(
                Post(
                    id=i,
                    tenant=rng.randint(1, 4),
                    lang=rng.choice(["en", "fr", "zh", None]),
                    draft=rng.choice([True, False, None]),
                    published=rng.choice([None, start + dt.timedelta(days=rng.randint(0, 60))]),
                    other=rng.randint(0, 3),
                    body=_body(rng),
                )
            )
        s.commit()
    yield factory
    idx.uninstall(factory)


def _atom(rng: random.Random) -> Any:
    day = dt.datetime(2024, 1, 1) + dt.timedelta(days=rng.randint(0, 60))
    langs = rng.sample(["en", "fr", "zh", "de"], rng.randint(1, 3))
    return rng.choice(
        [
            Post.tenant == rng.randint(1, 4),
            Post.tenant != rng.randint(1, 4),
            Post.tenant.in_([rng.randint(1, 4), rng.randint(1, 4)]),
            Post.tenant.not_in([rng.randint(1, 4)]),
            Post.tenant >= rng.randint(1, 4),
            Post.tenant < rng.randint(1, 4),
            Post.tenant.between(2, 3),
            Post.lang == rng.choice(["en", "fr", "zh"]),
            Post.lang != rng.choice(["en", "fr"]),
            Post.lang.in_(langs),
            Post.lang.not_in(langs),
            Post.lang.is_(None),
            Post.lang.is_not(None),
            Post.draft == rng.choice([True, False]),
            Post.draft.is_(None),
            Post.published > day,
            Post.published <= day,
            Post.published.between(day, day + dt.timedelta(days=15)),
            Post.published.is_(None),
        ]
    )


def _expr(rng: random.Random, depth: int = 0) -> Any:
    if depth >= 2 or rng.random() < 0.4:
        return _atom(rng)
    kind = rng.choice(["and", "or", "not"])
    if kind == "not":
        return not_(_expr(rng, depth + 1))
    parts = [_expr(rng, depth + 1) for _ in range(rng.randint(2, 3))]
    return and_(*parts) if kind == "and" else or_(*parts)


def test_random_where_returns_what_sql_returns_in_ranking_order(
    posts: sessionmaker[Any],
) -> None:
    factory = posts
    fields = filter_fields(semantic_columns(Post.__mapper__)[0])
    rng = random.Random(11)
    with factory() as s:
        # dense and keyword scores are per point, so filtering keeps the order; hybrid fuses
        # ranks among the matching points, so it is checked as a set
        ranked = {
            mode: {
                h.obj.id: h.score
                for h in semantic_search(s, Post, "river city", limit=100, mode=mode)
            }
            for mode in MODES
        }
        assert len(ranked["dense"]) == 80
        for _ in range(60):
            where = _expr(rng)
            flt, why = compile_where(where, fields)
            assert flt is not None, why  # every drawn expression runs inside the store
            allowed = set(s.scalars(select(Post.id).where(where)))
            for mode, everything in ranked.items():
                got = semantic_search(s, Post, "river city", limit=100, where=where, mode=mode)
                want = [i for i in everything if i in allowed]
                assert {h.obj.id for h in got} == set(want), f"{mode} {where}"
                # the unfiltered order, up to float noise between equal scores (local mode
                # computes cosines in other batches when it filters)
                scores = [everything[h.obj.id] for h in got]
                assert all(a >= b - 1e-6 for a, b in itertools.pairwise(scores)), f"{mode} {where}"
                assert all(abs(h.score - everything[h.obj.id]) < 1e-6 for h in got)
            page = semantic_search(s, Post, "river city", limit=3, where=where)
            assert {h.obj.id for h in page} <= allowed
            assert len(page) == min(3, len(allowed))


def test_literals_a_payload_cannot_compare_as_sql_does_are_left_to_sql(
    posts: sessionmaker[Any],
) -> None:
    """A fractional number against an integer column (truncated, ``tenant < 2.5`` dropped the
    tenant-2 rows), a range bound past 2**53 (a double's) or NULL (a crash) is SQL's to read;
    an integral one still runs in the store."""
    fields = filter_fields(semantic_columns(Post.__mapper__)[0])
    day = dt.datetime(2024, 1, 20)
    in_sql = [
        Post.tenant < 2.5,
        Post.tenant > decimal.Decimal("1.5"),
        Post.tenant != 2.5,
        Post.tenant.not_in([1.5]),
        Post.tenant < float("inf"),
        Post.tenant.between(1, None),
        Post.published.between(day, None),
        Post.published > sa.bindparam("since", None),
        not_(Post.tenant.between(None, 2)),
    ]
    in_store = [Post.tenant == 2.0, Post.tenant < decimal.Decimal("3")]
    # (past what the column's SQL type holds: compiled only)
    assert compile_where(Post.tenant < 2**53 + 2, fields)[0] is None
    assert compile_where(Post.tenant == 2**64, fields)[0] is None
    assert compile_where(Post.tenant >= 2**53, fields)[0] is not None
    with posts() as s:
        ranked = {  # (a keyword search finds only the rows that share a word)
            mode: {h.obj.id for h in semantic_search(s, Post, "river city", limit=100, mode=mode)}
            for mode in MODES
        }
        for where in in_sql + in_store:
            flt, why = compile_where(where, fields)
            assert (flt is None) == any(where is w for w in in_sql), f"{where}: {why}"
            allowed = set(s.scalars(select(Post.id).where(where)))
            for mode in MODES:
                got = semantic_search(s, Post, "river city", limit=100, where=where, mode=mode)
                assert {h.obj.id for h in got} == allowed & ranked[mode], f"{mode} {where}"
        assert (
            set(s.scalars(select(Post.id).where(Post.tenant < 2.5)))
            == set(s.scalars(select(Post.id).where(Post.tenant <= 2)))
            != set(s.scalars(select(Post.id).where(Post.tenant < 2)))
        )  # (the rows differ)


def test_a_tenants_scores_do_not_depend_on_the_words_of_other_tenants_rows(
    posts: sessionmaker[Any],
) -> None:
    """A keyword score is a share of the best score the query can reach, which was measured
    over the whole collection: a word only another tenant's rows hold lowered a tenant's
    scores, telling whether any other tenant wrote it."""
    with posts() as s:
        s.add(Post(id=101, tenant=7, body="alpha report on the quarter"))
        s.add_all(Post(id=i, tenant=8, body=f"zanzibar acquisition plan {i}") for i in (102, 103))
        s.commit()
        for mode in ("keyword", "hybrid"):
            hits = {
                query: semantic_search(
                    s,
                    Post,
                    query,
                    limit=5,
                    mode=mode,
                    where=Post.tenant == 7,  # type: ignore[arg-type]
                )
                for query in ("alpha zanzibar", "alpha")
            }
            assert [h.obj.id for h in hits["alpha zanzibar"]][:1] == [101]
            with_word, alone = (
                next(h for h in found if h.obj.id == 101) for found in hits.values()
            )
            assert with_word.scores["keyword"] == pytest.approx(alone.scores["keyword"])
            assert with_word.scores["keyword_share"] == pytest.approx(alone.scores["keyword_share"])
        theirs = semantic_search(
            s, Post, "alpha zanzibar", limit=5, mode="keyword", where=Post.tenant == 8
        )
        assert {h.obj.id for h in theirs} == {102, 103}  # (their own word still counts)
        assert all(0 < h.scores["keyword_share"] <= 1 for h in theirs)


def test_payload_only_updates_embed_nothing_and_move_the_row(
    posts: sessionmaker[Any],
) -> None:
    factory = posts
    embedded: list[int] = []

    def count(sender: Any, **kw: Any) -> None:
        embedded.append(kw["count"])

    signals.embedded.connect(count)
    try:
        with factory() as s:
            post = s.get(Post, 5)
            assert post is not None
            post.tenant, post.lang = 99, "de"
            s.commit()
            s.execute(update(Post).where(Post.id == 6).values(tenant=99))
            s.commit()
            hits = semantic_search(s, Post, "ocean", limit=10, where=Post.tenant == 99)
            assert sorted(h.obj.id for h in hits) == [5, 6]
            hits = semantic_search(s, Post, "ocean", limit=10, where=Post.lang == "de")
            assert [h.obj.id for h in hits] == [5]
            post.lang = func.upper(Post.lang)  # run by the flush: expired, no history after it
            s.commit()
            hits = semantic_search(s, Post, "ocean", limit=10, where=Post.lang == "DE")
            assert [h.obj.id for h in hits] == [5]
            post.other = 3  # not a filter column: no job at all
            s.commit()
    finally:
        signals.embedded.disconnect(count)
    assert embedded == []


def test_where_outside_filter_by_falls_back_to_sql_and_says_so(
    posts: sessionmaker[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    factory = posts
    fields = filter_fields(semantic_columns(Post.__mapper__)[0])
    flt, why = compile_where(Post.other == 1, fields)
    assert flt is None and "other" in why and "filter_by" in why
    # a function of a column is named, on either side (the log said "BindParameter")
    for where in (func.length(Post.body) > 30, 30 < func.length(Post.body)):
        flt, why = compile_where(where, fields)
        assert flt is None and "the SQL function length()" in why, why
    for where in (Post.tenant == func.abs(-3), func.abs(-3) == Post.tenant):
        flt, why = compile_where(where, fields)
        assert flt is None and "the SQL function abs()" in why, why
    monkeypatch.setattr("semantic_orm.search.SCAN_WARNING_ROWS", 10)
    with factory() as s:
        rare = s.scalars(select(Post.id).where(Post.other == 1, Post.id < 5)).all()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            hits = semantic_search(
                s, Post, "desert", limit=10, where=and_(Post.other == 1, Post.id < 5)
            )
        assert sorted(h.obj.id for h in hits) == sorted(rare)
        assert any(issubclass(w.category, FilterFallbackWarning) for w in caught)
        assert "other" in str(
            next(w for w in caught if w.category is FilterFallbackWarning).message
        )


class Stage(enum.Enum):
    DRAFT = "draft"
    LIVE = "live"
    GONE = "gone"


class Mood(enum.StrEnum):
    """Members that are strings themselves."""

    CALM = "calm"
    STORMY = "stormy"


class _Enums(DeclarativeBase):
    pass


class Ticket(_Enums):
    """Two enum filter columns: one stores members' names (SQLAlchemy's default), the other
    their values (``values_callable``)."""

    __tablename__ = "enum_ticket"
    id: Mapped[int] = mapped_column(primary_key=True)
    by_name: Mapped[Stage] = mapped_column(sa.Enum(Stage, name="stage_name"))
    by_value: Mapped[Stage] = mapped_column(
        sa.Enum(Stage, name="stage_value", values_callable=lambda e: [m.value for m in e])
    )
    mood: Mapped[Mood] = mapped_column(sa.Enum(Mood, name="ticket_mood"))
    body: Mapped[str | None] = mapped_column(
        SemanticText(filter_by=("by_name", "by_value", "mood"))
    )


def test_enum_filters_match_what_sql_matches_for_members_and_strings(
    engine: Engine, store: Any
) -> None:
    """``where=Ticket.by_value == "draft"`` is the string the column stores: SQL matched its
    rows, the store (its payload holds members' names) matched none. A string no member stores
    is left to SQL (no row on SQLite, an error for PostgreSQL's native enum)."""
    _Enums.metadata.create_all(engine)
    idx = SemanticIndex(store=store, embedder=HashEmbedder(dimension=32), models=[Ticket])
    factory = sessionmaker(engine)
    idx.install(factory)
    fields = filter_fields(semantic_columns(Ticket.__mapper__)[0])
    stages = list(Stage)
    with factory() as s:
        s.add_all(
            Ticket(
                id=i,
                by_name=stages[i % 3],
                by_value=stages[i % 3],
                mood=list(Mood)[i % 2],
                body=f"ticket {i} river",
            )
            for i in range(1, 13)
        )
        s.commit()
        for where, in_store in (
            (Ticket.by_name == Stage.DRAFT, True),
            (Ticket.by_name == "DRAFT", True),
            (Ticket.by_value == Stage.DRAFT, True),
            (Ticket.by_value == "draft", True),
            (Ticket.by_value != "live", True),
            (Ticket.by_value.in_(["draft", "gone"]), True),
            (Ticket.by_value.not_in(["gone"]), True),
            (Ticket.mood == Mood.CALM, True),  # a member that is a string too
            (Ticket.mood.in_([Mood.STORMY]), True),
            (Ticket.mood == "calm", True),  # SQLAlchemy reads it as the member
            (Ticket.by_value == "DRAFT", False),  # no member stores it: SQL says no row
            (Ticket.by_name == "draft", False),
        ):
            flt, why = compile_where(where, fields)
            assert (flt is not None) is in_store, why
            if not in_store and engine.dialect.name == "postgresql":  # a native enum: refused
                for run in (
                    lambda w=where: s.scalars(select(Ticket.id).where(w)).all(),
                    lambda w=where: semantic_search(s, Ticket, "river", where=w, mode="dense"),
                ):
                    with pytest.raises(sa.exc.DataError, match="invalid input value for enum"):
                        run()
                    s.rollback()
                continue
            want = set(s.scalars(select(Ticket.id).where(where)))
            got = semantic_search(s, Ticket, "river", limit=20, where=where, mode="dense")
            assert {h.obj.id for h in got} == want, str(where)
            assert bool(want) is in_store  # each store-side form matches rows
    idx.uninstall(factory)


def test_filter_by_misdeclared_is_refused_naming_the_column() -> None:
    class B(DeclarativeBase):
        pass

    class Bad(B):
        __tablename__ = "bad"
        id: Mapped[int] = mapped_column(primary_key=True)
        body: Mapped[str] = mapped_column(SemanticText(filter_by=("nope",)))

    with pytest.raises(ConfigurationError, match=r"Bad\.body.*'nope'"):
        filter_fields(semantic_columns(Bad.__mapper__)[0])
    with pytest.raises(ConfigurationError, match="filter_by"):
        SemanticText(filter_by=(1,))  # type: ignore[arg-type]
    assert "filter_by=('lang', 'draft', 'published', 'tenant')" in repr(Post.__table__.c.body.type)


def test_optimiser_running_with_writes_and_searches_loses_nothing(
    engine: Engine, tmp_path: Any
) -> None:
    # tiny segments: index them all the same (the threshold is in KB of vectors)
    store = EdgeStore(
        tmp_path / "vectors", optimize_after=150, optimizers={"indexing_threshold": 1}
    )
    idx = SemanticIndex(store=store, embedder=HashEmbedder(dimension=32), models=[Post])
    Base.metadata.create_all(engine)
    factory = sessionmaker(engine, expire_on_commit=False)
    idx.install(factory)
    rng = random.Random(3)
    failures: list[BaseException] = []
    stop = threading.Event()

    def search() -> None:
        try:
            while not stop.is_set():
                with factory() as s:  # a session per search: no read lock held across commits
                    for h in semantic_search(s, Post, "forest", limit=5, where=Post.tenant == 2):
                        assert h.obj.tenant == 2
                stop.wait(0.02)
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)

    reader = threading.Thread(target=search)
    reader.start()
    try:
        for batch in range(6):
            with factory() as s:
                for i in range(batch * 40, batch * 40 + 40):
                    s.add(Post(id=i + 1, tenant=rng.randint(1, 3), body=_body(rng) * 3))
                s.commit()
            with factory() as s:
                for post in s.scalars(select(Post).where(Post.id % 7 == batch)):
                    post.body = _body(rng)
                s.commit()
    finally:
        stop.set()
        reader.join()
        idx.uninstall(factory)
    assert not failures, failures
    col = semantic_columns(Post.__mapper__)[0]
    name = col.collection()
    for thread in threading.enumerate():
        if thread.name.startswith("semantic-orm-optimize-"):
            thread.join()
    assert store.index_state(name)["indexed"] > 0  # built in the background, unasked
    store.optimize(name)
    state = store.index_state(name)
    assert state["points"] == store.count(name) and state["indexed"] > 0
    assert_index_matches_database(engine, store, Post, "body", name)
    idx.close()


def test_reconcile_catches_filter_values_changed_by_raw_sql(posts: sessionmaker[Any]) -> None:
    from semantic_orm import index_for
    from semantic_orm.maintenance import reconcile

    engine = posts.kw["bind"]
    with engine.begin() as conn:  # no session sees this
        conn.exec_driver_sql("UPDATE post SET tenant = 77 WHERE id IN (9, 10)")
    with posts() as s:
        assert semantic_search(s, Post, "river", where=Post.tenant == 77) == []
        idx = index_for(s)
        assert idx is not None
        (report,) = reconcile(idx, Post, engine)
        assert report.changed == 2
        hits = semantic_search(s, Post, "river", limit=10, where=Post.tenant == 77)
        assert sorted(h.obj.id for h in hits) == [9, 10]


def test_filter_by_added_later_filters_in_sql_until_reindex_all(
    engine: Engine, store: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from semantic_orm import binding as bindings_module
    from semantic_orm.maintenance import reindex, status
    from semantic_orm.search import _store_filter

    class Old(DeclarativeBase):
        pass

    class V1(Old):
        __tablename__ = "evolving"
        id: Mapped[int] = mapped_column(primary_key=True)
        tenant: Mapped[int] = mapped_column(Integer)
        body: Mapped[str] = mapped_column(SemanticText(chunk_size=80, overlap=0))

    class New(DeclarativeBase):
        pass

    class V2(New):
        __tablename__ = "evolving"
        id: Mapped[int] = mapped_column(primary_key=True)
        tenant: Mapped[int] = mapped_column(Integer)
        body: Mapped[str] = mapped_column(
            SemanticText(chunk_size=80, overlap=0, filter_by=("tenant",))
        )

    Old.metadata.create_all(engine)
    first = SemanticIndex(store=store, embedder=HashEmbedder(dimension=32), models=[V1])
    factory = sessionmaker(engine)
    first.install(factory)
    with factory() as s:
        s.add_all(
            V1(id=i, tenant=i % 3, body=f"{WORDS[i % 10]} {WORDS[(i * 3) % 10]}") for i in range(30)
        )
        s.commit()
    first.uninstall(factory)

    second = SemanticIndex(store=store, embedder=HashEmbedder(dimension=32), models=[V2])
    second.install(factory)
    binding = second.binding_for(semantic_columns(V2.__mapper__)[0])
    with factory() as s:
        hits = semantic_search(s, V2, "river", limit=30, where=V2.tenant == 1)
        assert sorted(h.obj.id for h in hits) == [i for i in range(30) if i % 3 == 1]
    assert second.bindings.untrusted(binding) == {"tenant"}
    assert _store_filter(binding, V2.tenant == 1, second.bindings.untrusted(binding))[0] is None
    monkeypatch.setattr(bindings_module, "RECHECK", 0.0)  # each search looks again: it warned
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="semantic_orm"), factory() as s:  # each time
        for _ in range(3):
            semantic_search(s, V2, "river", limit=3, where=V2.tenant == 1)
    assert not [r for r in caplog.records if "do not all carry yet" in r.getMessage()]
    (state,) = status(second, engine)
    assert state.unfilled_filters == ["tenant"]

    embedded: list[int] = []

    def count(sender: Any, **kw: Any) -> None:
        embedded.append(kw["count"])

    signals.embedded.connect(count)
    try:
        reindex(second, V2, engine, all_rows=True)
    finally:
        signals.embedded.disconnect(count)
    assert embedded == []  # payloads refreshed, nothing embedded
    assert second.bindings.untrusted(binding) == frozenset()
    assert _store_filter(binding, V2.tenant == 1, frozenset())[0] is not None
    with factory() as s:
        hits = semantic_search(s, V2, "river", limit=30, where=V2.tenant == 1)
        assert sorted(h.obj.id for h in hits) == [i for i in range(30) if i % 3 == 1]
    second.uninstall(factory)
