"""Schema translation (``schema_translate_map``) and a database per tenant: one index per
schema or database, and refusals.

A schema-per-tenant application puts each tenant's tables in its own schema through an engine
that translates the declared one. A vector collection knows nothing of schemas, so one index
serving two schemas would mix their rows' points (the same primary keys overwrite each other):
it refuses the second schema instead, and an index per schema (with its own collection prefix)
keeps them apart. Each test runs on SQLite (schemas are attached databases) and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import sqlalchemy.dialects.postgresql
import sqlalchemy.dialects.sqlite
from sqlalchemy import String, insert, select, text
from sqlalchemy.engine import URL, Engine
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from semantic_orm import (
    ConfigurationError,
    SemanticIndex,
    SemanticSearchMixin,
    SemanticText,
    outbox,
)
from semantic_orm.maintenance import reconcile
from semantic_orm.mapping import semantic_columns
from semantic_orm.schemas import database_of
from semantic_orm.testing import HashEmbedder, MemoryStore

from .helpers import COLL, assert_index_matches_database, async_url, expected_points
from .models import Article, Base, Note

TENANTS = ("t1", "t2")


@pytest.fixture
def tenants(engine: Engine, tmp_path: Path) -> Callable[[str], Engine]:
    """Schemas ``t1`` and ``t2`` on ``engine``'s database (SQLite: attached databases); returns
    the engine of one, which translates the default schema into it, with the tables made."""
    if engine.dialect.name == "sqlite":

        @sa.event.listens_for(engine, "connect")
        def _attach(dbapi_conn: Any, record: Any) -> None:
            for name in TENANTS:
                dbapi_conn.execute(f"ATTACH DATABASE '{tmp_path / name}.sqlite3' AS {name}")

    else:
        with engine.begin() as conn:
            for name in TENANTS:
                conn.execute(text(f"CREATE SCHEMA {name}"))
    made: dict[str, Engine] = {}

    def tenant(name: str) -> Engine:
        if name not in made:
            made[name] = engine.execution_options(schema_translate_map={None: name})
            Base.metadata.create_all(made[name])
        return made[name]

    return tenant


def test_an_upsert_reads_the_unique_keys_of_its_translated_schema(
    tenants: Callable[[str], Engine], store: Any
) -> None:
    """An upsert whose conflict target the Table does not name (PostgreSQL's ``article_pkey``,
    a bare SQLite ``ON CONFLICT``) has its unique keys read from the database: from the schema
    its statement really writes (the default schema has no such table here)."""
    engine = tenants("t1")
    idx = SemanticIndex(store=store, embedder=HashEmbedder(dimension=64))
    factory = sessionmaker(engine)
    idx.install(factory)
    _write(factory, (1, RIVER))
    dialect = engine.dialect.name
    upsert = (sa.dialects.postgresql if dialect == "postgresql" else sa.dialects.sqlite).insert
    stmt = upsert(Article)
    target = {"constraint": "article_pkey"} if dialect == "postgresql" else {}
    stmt = stmt.on_conflict_do_update(**target, set_={"content": stmt.excluded.content})
    rows = [{"id": 1, "title": "a1", "content": MOUNTAIN}, {"id": 2, "title": "a2", "content": "x"}]
    for _ in range(2):  # (the second updates the rows the first wrote)
        with factory() as s:
            s.execute(stmt, rows)
            s.commit()
    idx.settle()
    assert assert_index_matches_database(engine, store) > 0
    idx.uninstall(factory)


def _write(factory: sessionmaker[Session], *rows: tuple[int, str]) -> None:
    with factory() as s:
        for key, body in rows:
            s.merge(Article(id=key, title=f"a{key}", content=body))
        s.commit()


RIVER = "The river floods the delta every spring. " * 4
MOUNTAIN = "Snow stays on the mountain until the summer. " * 4


def test_an_index_per_schema_keeps_each_schemas_rows_apart(
    tenants: Callable[[str], Engine], store: Any
) -> None:
    indexes, factories = {}, {}
    for name in TENANTS:
        # the library creates each schema's outbox itself (create_outbox defaults to True)
        indexes[name] = SemanticIndex(
            store=store, embedder=HashEmbedder(dimension=64), collection_prefix=f"{name}_"
        )
        factories[name] = sessionmaker(tenants(name), expire_on_commit=False)
        indexes[name].install(factories[name])
    # the same primary keys in both schemas, with other texts
    _write(factories["t1"], (1, RIVER), (2, "Rain on the lake. " * 3))
    _write(factories["t2"], (1, MOUNTAIN), (2, "Wind over the ice field. " * 3))
    _write(factories["t1"], (2, "Clouds gather over the marsh. " * 3))
    with factories["t2"]() as s:
        s.delete(s.get(Article, 2))
        s.commit()
    for name in TENANTS:
        indexes[name].settle()
        with tenants(name).connect() as conn:
            assert outbox.pending(conn) == []
            assert sa.inspect(conn).has_table(outbox.OUTBOX_TABLE, schema=name)
        points = assert_index_matches_database(tenants(name), store, collection=f"{name}_{COLL}")
        assert points > 0
    for name, query, own in (("t1", "river delta flood", RIVER), ("t2", "mountain snow", MOUNTAIN)):
        with factories[name]() as s:
            hits = Article.semantic_search(s, query, limit=5)
            assert hits and hits[0].obj.content == own
            assert all(h.text in h.obj.content for h in hits)
    with factories["t2"]() as s:
        assert [h.obj.id for h in Article.semantic_search(s, "clouds marsh", limit=5)] == [1]


@pytest.fixture
def index() -> Iterator[SemanticIndex]:
    idx = SemanticIndex(store=MemoryStore(), embedder=HashEmbedder(dimension=64))
    yield idx
    idx.close()


def test_one_index_refuses_a_second_schema(
    tenants: Callable[[str], Engine], index: SemanticIndex
) -> None:
    first = sessionmaker(tenants("t1"), expire_on_commit=False)
    index.install(first)
    _write(first, (1, RIVER), (2, "Rain on the lake. " * 3))
    with first(bind=tenants("t2")) as s:  # a session of the same factory, bound to t2
        s.add(Article(id=1, title="a1", content=MOUNTAIN))
        with pytest.raises(ConfigurationError, match=r"Article\.content.*schema 't2'.*schema 't1'"):
            s.commit()
    with first(bind=tenants("t2")) as s:  # a refused flush claims none of its tables
        s.add(Note(slug="n", summary=RIVER))
        s.add(Article(id=3, title="a3", content=RIVER))
        with pytest.raises(ConfigurationError, match="schema 't2'"):
            s.commit()
    with first() as s:  # Note still free to be used in t1
        s.add(Note(slug="n", summary=RIVER))
        s.commit()
    second = sessionmaker(tenants("t2"), expire_on_commit=False)
    index.install(second)
    with second() as s:
        s.add(Article(id=1, title="a1", content=MOUNTAIN))
        with pytest.raises(ConfigurationError, match="collection_prefix"):
            s.commit()
    with tenants("t2").connect() as conn:  # nothing committed there, and no job
        assert conn.execute(select(Article.id)).all() == []
    assert_index_matches_database(tenants("t1"), index.store)  # t1's points untouched
    with second() as s, pytest.raises(ConfigurationError, match="schema 't2'"):
        Article.semantic_search(s, "mountain")
    # a worker pass through the other schema: its jobs would sync t2's rows into t1's points
    with tenants("t2").begin() as conn:
        outbox.create_tables(conn)
        outbox.enqueue(conn, [("article", "content", "1")])
        conn.execute(insert(Article).values(id=1, title="a1", content=MOUNTAIN))
    with pytest.raises(ConfigurationError, match="schema 't2'"):
        index.process(bind=tenants("t2"))
    with tenants("t2").connect() as conn:  # the job stays, unclaimed, for that schema's index
        assert [(j["row_pk"], j["claimed_by"]) for j in outbox.pending(conn)] == [("1", None)]
    # reconcile through the other schema would take t1's row 2 for gone: refused
    with pytest.raises(ConfigurationError, match="schema 't2'"):
        reconcile(index, Article, bind=tenants("t2"), process=False)
    assert_index_matches_database(tenants("t1"), index.store)


def test_a_write_holds_its_schema_until_it_commits_and_not_after_a_rollback(
    tenants: Callable[[str], Engine], index: SemanticIndex
) -> None:
    factory = sessionmaker(tenants("t1"), expire_on_commit=False)
    index.install(factory)
    with factory(bind=tenants("t2")) as s:  # flushed in t2, then rolled back: claims nothing
        s.add(Article(id=1, title="a1", content=MOUNTAIN))
        s.flush()
        s.rollback()
    with factory() as first, factory(bind=tenants("t2")) as second:
        first.add(Article(id=1, title="a1", content=RIVER))
        first.flush()  # t1, still open: t2 is refused meanwhile
        second.add(Article(id=1, title="a1", content=MOUNTAIN))
        with pytest.raises(ConfigurationError, match="schema 't2'"):
            second.commit()
        first.commit()  # and now for good
    with factory(bind=tenants("t2")) as s:
        s.add(Article(id=1, title="a1", content=MOUNTAIN))
        with pytest.raises(ConfigurationError, match="schema 't2'"):
            s.commit()
    index.drain(factory)
    assert_index_matches_database(tenants("t1"), index.store)


def test_a_session_in_an_outer_transaction_claims_for_good(
    tenants: Callable[[str], Engine], index: SemanticIndex
) -> None:
    factory = sessionmaker(expire_on_commit=False)
    index.install(factory)
    with tenants("t1").connect() as conn:
        conn.begin()
        with factory(bind=conn) as s:  # joins the connection's transaction, which it does not own
            s.add(Article(id=1, title="a1", content=RIVER))
            s.flush()
        conn.commit()  # the row and its job commit with it, after the session ended
        assert conn.execute(select(outbox.outbox.c.row_pk)).scalars().all() == ["1"]
    with factory(bind=tenants("t2")) as s:
        s.add(Article(id=1, title="a1", content=MOUNTAIN))
        with pytest.raises(ConfigurationError, match="schema 't2'"):
            s.commit()


def test_a_translation_on_the_connection_alone_is_refused(
    tenants: Callable[[str], Engine], engine: Engine, index: SemanticIndex
) -> None:
    tenants("t1")  # its tables
    Base.metadata.create_all(engine)
    factory = sessionmaker(engine, expire_on_commit=False)
    index.install(factory)
    translate = {"schema_translate_map": {None: "t1"}}
    with factory() as s:
        s.connection(execution_options=translate)
        s.add(Article(id=1, title="a1", content=RIVER))
        with pytest.raises(ConfigurationError, match="Set the map on the engine"):
            s.commit()
    with factory() as s:  # a statement's own options: refused before it runs
        stmt = insert(Article).values(id=2, title="a2", content=RIVER)
        with pytest.raises(ConfigurationError, match="engine"):
            s.execute(stmt, execution_options=translate)
    for bind in (engine, tenants("t1")):
        with bind.connect() as conn:
            assert conn.execute(select(Article.id)).all() == []
    _write(factory, (3, RIVER))  # the engine's own schema still works
    with factory() as s:  # a search whose session reads through a translating connection
        s.connection(execution_options=translate)
        with pytest.raises(ConfigurationError, match="Set the map on the engine"):
            Article.semantic_search(s, "river")
    assert assert_index_matches_database(engine, index.store) > 0


class _AppBase(DeclarativeBase):
    pass


class Entry(SemanticSearchMixin, _AppBase):
    """A table declared in a schema of its own (``books``)."""

    __tablename__ = "entry"
    __table_args__ = {"schema": "books"}  # noqa: RUF012
    id: Mapped[int] = mapped_column(primary_key=True)
    title: Mapped[str] = mapped_column(String(50))
    body: Mapped[str | None] = mapped_column(SemanticText(chunk_size=200, overlap=0))


def test_one_outbox_holds_the_jobs_of_one_schema_per_table(
    tenants: Callable[[str], Engine], engine: Engine
) -> None:
    tenants("t1")  # the schemas
    tenants("t2")

    def through(translate: dict[str | None, str | None]) -> tuple[SemanticIndex, Any]:
        # (the same keys in every map: SQLAlchemy's compiled statements require it)
        bound = engine.execution_options(schema_translate_map=translate)
        _AppBase.metadata.create_all(bound)
        idx = SemanticIndex(
            store=MemoryStore(), embedder=HashEmbedder(dimension=64), collection_prefix="x_"
        )
        idx.install(factory := sessionmaker(bound, expire_on_commit=False))
        return idx, factory

    def entries(idx: SemanticIndex) -> int:
        (column,) = semantic_columns(sa.inspect(Entry))
        return len(idx.store.points(idx.binding_for(column).collection))

    # a write of another translation into the default outbox, rolled back, claims nothing
    _, factory = through({"books": "t2", None: None})
    with factory() as s:
        s.add(Entry(id=1, title="m", body=MOUNTAIN))
        s.flush()
        s.rollback()
    # one translation of the table, the outbox left in the default schema: a renamed schema
    first, factory = through({"books": "t1", None: None})
    with factory() as s:
        s.add(Entry(id=1, title="m", body=RIVER))
        s.commit()
    first.drain(factory)
    assert entries(first) == 1
    # a second translation writing its jobs to that outbox: refused, even through another index
    _, factory = through({"books": "t2", None: None})
    with factory() as s:
        s.add(Entry(id=1, title="m", body=MOUNTAIN))
        with pytest.raises(ConfigurationError, match=r"outbox table \(in the default schema\)"):
            s.commit()
    with engine.connect() as conn:  # nothing queued for the first one's worker to take
        assert outbox.pending(conn) == []
    # each schema with its own outbox: both sync
    for name in ("t1", "t2"):
        idx, factory = through({"books": name, None: name})
        with factory() as s:
            s.add(Entry(id=2, title="m", body=MOUNTAIN))
            s.commit()
        idx.drain(factory)
        assert entries(idx) == 1


async def _river_synced(factory: async_sessionmaker[Any], idx: SemanticIndex) -> None:
    """Commit article 1 (:data:`RIVER`) through ``factory`` and wait for its sync."""
    async with factory() as s:
        s.add(Article(id=1, title="a1", content=RIVER))
        await s.commit()
    await idx.adrain(factory, timeout=30)


@pytest.mark.asyncio
async def test_async_sessions_follow_the_same_rules(aengine: AsyncEngine, tmp_path: Path) -> None:
    sync = aengine.sync_engine
    if sync.dialect.name == "sqlite":

        @sa.event.listens_for(sync, "connect")
        def _attach(dbapi_conn: Any, record: Any) -> None:
            cursor = dbapi_conn.cursor()
            for name in TENANTS:
                cursor.execute(f"ATTACH DATABASE '{tmp_path / name}.sqlite3' AS {name}")
            cursor.close()

        await aengine.dispose()  # the fixture's connection was made before the attachments
    else:
        async with aengine.begin() as conn:
            for name in TENANTS:
                await conn.execute(text(f"CREATE SCHEMA {name}"))
    engines = {n: aengine.execution_options(schema_translate_map={None: n}) for n in TENANTS}
    for made in engines.values():
        async with made.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
    idx = SemanticIndex(store=MemoryStore(), embedder=HashEmbedder(dimension=64))
    factory = async_sessionmaker(engines["t1"], expire_on_commit=False)
    idx.install(factory)
    try:
        await _river_synced(factory, idx)
        async with factory() as s:
            hits = await Article.asemantic_search(s, "river delta", limit=3)
            assert [h.obj.content for h in hits] == [RIVER]
        async with factory(bind=engines["t2"]) as s:
            s.add(Article(id=1, title="a1", content=MOUNTAIN))
            with pytest.raises(ConfigurationError, match="schema 't2'"):
                await s.commit()
        async with factory(bind=engines["t2"]) as s:
            with pytest.raises(ConfigurationError, match="schema 't2'"):
                await Article.asemantic_search(s, "mountain")
            assert (await s.scalars(select(Article.id))).all() == []
        got = sorted(
            (p.payload["chunk_index"], p.payload["start_offset"], p.payload["end_offset"])
            for p in idx.store.points(COLL)
            if p.payload["pk"] == "1"
        )  # t1's text, all of it, and nothing else
        assert got == [c[:3] for c in expected_points(Article, "content", RIVER)]
        assert len(idx.store.points(COLL)) == len(got)
    finally:
        idx.uninstall(factory)


# -- a database per tenant -------------------------------------------------------------------
# The same hazard with a database (an engine, or a session's bind) per tenant: one index would
# put both databases' rows in one collection. The database is told by what it says of itself,
# so two URLs of one database are one place.


@pytest.fixture
def databases(db_url: URL, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[URL]]:
    """Three URLs: two fresh databases of ``db_url``'s kind (``db_url`` and another), then a
    second URL of the first (a symbolic link to its file; the host's name for its address)."""
    if db_url.get_backend_name() == "sqlite":
        other = db_url.set(database=str(tmp_path / "other.sqlite3"))
        assert db_url.database is not None
        link = tmp_path / "alias.sqlite3"
        link.symlink_to(db_url.database)
        yield [db_url, other, db_url.set(database=str(link))]
        return
    server = request.getfixturevalue("pg_server")
    other = server.create_database()
    try:
        assert db_url.host == "127.0.0.1"
        yield [db_url, other, db_url.set(host="localhost")]
    finally:
        server.drop_database(other.database)


@pytest.fixture
def engines(databases: list[URL]) -> Iterator[list[Engine]]:
    """An engine on each of :func:`databases`, the tables made in the two databases."""
    made = [sa.create_engine(url) for url in databases]
    for engine in made[:2]:
        Base.metadata.create_all(engine)
    yield made
    for engine in made:
        engine.dispose()


def test_one_index_refuses_a_second_database(engines: list[Engine], index: SemanticIndex) -> None:
    first, second, _ = engines
    factory = sessionmaker(first, expire_on_commit=False)
    index.install(factory)
    _write(factory, (1, RIVER), (2, "Rain on the lake. " * 3))
    with factory(bind=second) as s:  # a session of the same factory, bound to the other
        s.add(Article(id=1, title="a1", content=MOUNTAIN))
        with pytest.raises(ConfigurationError, match=r"Article\.content.*database.*database"):
            s.commit()
    with second.connect() as conn:  # nothing committed there, and no job
        assert conn.execute(select(Article.id)).all() == []
    assert_index_matches_database(first, index.store)  # the first one's points untouched
    with factory(bind=second) as s, pytest.raises(ConfigurationError, match="collection_prefix"):
        Article.semantic_search(s, "mountain")
    # a worker pass through the other: its jobs would sync its rows into the first one's points
    with second.begin() as conn:
        outbox.create_tables(conn)
        outbox.enqueue(conn, [("article", "content", "1")])
        conn.execute(insert(Article).values(id=1, title="a1", content=MOUNTAIN))
    with pytest.raises(ConfigurationError, match="each database its own SemanticIndex"):
        index.process(bind=second)
    with second.connect() as conn:  # the job stays, unclaimed, for that database's index
        assert [(j["row_pk"], j["claimed_by"]) for j in outbox.pending(conn)] == [("1", None)]
    # reconcile through the other would take the first one's row 2 for gone: refused
    with pytest.raises(ConfigurationError, match="each database its own SemanticIndex"):
        reconcile(index, Article, bind=second, process=False)
    assert_index_matches_database(first, index.store)


def test_an_index_per_database_keeps_each_databases_rows_apart(
    engines: list[Engine], store: Any
) -> None:
    factories, indexes = [], []
    for n, engine in enumerate(engines[:2]):
        made = SemanticIndex(
            store=store, embedder=HashEmbedder(dimension=64), collection_prefix=f"d{n}_"
        )
        factories.append(sessionmaker(engine, expire_on_commit=False))
        made.install(factories[-1])
        indexes.append(made)
    try:  # the same primary keys in both databases, with other texts
        _write(factories[0], (1, RIVER), (2, "Rain on the lake. " * 3))
        _write(factories[1], (1, MOUNTAIN), (2, "Wind over the ice field. " * 3))
        for n, (query, own) in enumerate((("river delta flood", RIVER), ("mountain", MOUNTAIN))):
            indexes[n].settle()
            assert assert_index_matches_database(engines[n], store, collection=f"d{n}_{COLL}")
            with factories[n]() as s:
                hits = Article.semantic_search(s, query, limit=5)
                assert hits and hits[0].obj.content == own
    finally:
        for n, made in enumerate(indexes):
            made.uninstall(factories[n])


def test_two_urls_of_one_database_are_one_place(
    engines: list[Engine], index: SemanticIndex
) -> None:
    first, _, alias = engines
    assert first.url != alias.url
    factory = sessionmaker(first, expire_on_commit=False)
    index.install(factory)
    _write(factory, (1, RIVER))
    with factory(bind=alias) as s:  # the same database through its other URL: allowed
        s.add(Article(id=2, title="a2", content=MOUNTAIN))
        s.commit()
        assert [h.obj.id for h in Article.semantic_search(s, "mountain snow", limit=1)] == [2]
    index.drain(factory)
    assert_index_matches_database(first, index.store)


@pytest.mark.asyncio
async def test_an_async_search_is_refused_a_second_database_before_any_write(
    databases: list[URL], engines: list[Engine], index: SemanticIndex
) -> None:
    made = [create_async_engine(async_url(url)) for url in databases]
    factory = async_sessionmaker(made[0], expire_on_commit=False)
    index.install(factory)
    try:
        await _river_synced(factory, index)
        # the first use of these engines: each is asked what it is through the session
        async with factory(bind=made[2]) as s:
            hits = await Article.asemantic_search(s, "river delta", limit=3)
            assert [h.obj.content for h in hits] == [RIVER]
        async with factory(bind=made[1]) as s:
            with pytest.raises(ConfigurationError, match="each database its own SemanticIndex"):
                await Article.asemantic_search(s, "mountain")
    finally:
        index.uninstall(factory)
        for engine in made:
            await engine.dispose()
    assert_index_matches_database(engines[0], index.store)


@pytest.mark.postgres
def test_a_role_that_cannot_read_the_cluster_identifier_is_told_by_its_url(
    postgresql_url: URL,
) -> None:
    admin = sa.create_engine(postgresql_url)
    role = f"plain_{postgresql_url.database}"[:60]
    with admin.begin() as conn:
        conn.execute(text(f"CREATE ROLE {role} LOGIN PASSWORD 'x'"))
        conn.execute(text("REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC"))
    plain = sa.create_engine(postgresql_url.set(username=role, password="x"))
    try:
        with plain.connect() as conn:
            answer = database_of(conn)
            assert conn.in_transaction() and conn.exec_driver_sql("SELECT 1").scalar() == 1
        url = plain.url
        assert answer == (
            ("postgresql", (url.host, url.port, url.database), url.database),
            f"the PostgreSQL database {url.database!r} on {url.host}:{url.port}",
        )
        with admin.connect() as conn:  # a superuser reads it: the cluster's own identifier
            told = database_of(conn)
            assert told is not None and told[0] != answer[0]
    finally:
        plain.dispose()
        with admin.begin() as conn:
            conn.execute(text("GRANT EXECUTE ON FUNCTION pg_control_system() TO PUBLIC"))
            conn.execute(text(f"DROP ROLE {role}"))
        admin.dispose()


@pytest.mark.asyncio
async def test_an_async_engine_used_before_it_was_asked_is_not_refused_later(
    aengine: AsyncEngine, index: SemanticIndex
) -> None:
    """A sync search run inside an AsyncSession's ``run_sync`` before any write reaches the
    index through an engine that cannot be asked what it is there: it claims nothing, and the
    first write (asked through its connection) is not refused as another database."""
    factory = async_sessionmaker(aengine, expire_on_commit=False)
    index.install(factory)
    try:
        async with factory() as s:
            found = await s.run_sync(lambda sync: Article.semantic_search(sync, "river"))
            assert found == []
        await _river_synced(factory, index)
        async with factory() as s:
            hits = await Article.asemantic_search(s, "river delta", limit=3)
            assert [h.obj.content for h in hits] == [RIVER]
    finally:
        index.uninstall(factory)


def test_an_engines_copies_ask_their_database_once(engine: Engine, index: SemanticIndex) -> None:
    """A copy of the engine per request (``execution_options``) shares its pool, and the
    database's answer: writes and searches through fresh copies ask nothing more."""
    Base.metadata.create_all(engine)
    asked: list[str] = []

    @sa.event.listens_for(engine, "before_cursor_execute")
    def _seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "database_list" in statement or "current_database()" in statement:
            asked.append(statement)

    index.install(factory := sessionmaker(engine, expire_on_commit=False))
    try:
        for key in range(1, 4):
            copy = engine.execution_options(logging_token=f"request {key}")
            with factory(bind=copy) as s:
                s.add(Article(id=key, title=f"a{key}", content=RIVER))
                s.commit()
                assert Article.semantic_search(s, "river delta", limit=1)
        assert len(asked) == 1, asked
    finally:
        index.uninstall(factory)
        sa.event.remove(engine, "before_cursor_execute", _seen)


def test_tenants_attached_under_one_schema_name_are_two_databases(
    tmp_path: Path, store: Any
) -> None:
    """SQLite tenants that share a main file and each attach their own under the same schema
    name (the tables and the outbox translated into it) are two databases: one index refuses
    the second, an index per tenant keeps their rows apart. With the outbox left in the
    shared main file, each tenant's worker would take the other's jobs: refused."""
    made: list[Engine] = []

    def tenant(name: str, translate: dict[str | None, str | None]) -> Engine:
        engine = sa.create_engine(f"sqlite:///{tmp_path / 'main.sqlite3'}")

        @sa.event.listens_for(engine, "connect")
        def _attach(dbapi_conn: Any, record: Any) -> None:
            dbapi_conn.execute(f"ATTACH DATABASE '{tmp_path / name}.sqlite3' AS tenant")

        made.append(engine)
        bound = engine.execution_options(schema_translate_map=translate)
        (_AppBase if "books" in translate else Base).metadata.create_all(bound)
        return bound

    kept = {"books": "tenant", None: None}  # the outbox in the main file
    for n, name in enumerate(("one", "two")):
        bound = tenant(name, kept)
        alone = SemanticIndex(
            store=MemoryStore(), embedder=HashEmbedder(dimension=64), collection_prefix=name
        )
        alone.install(factory := sessionmaker(bound))
        try:
            with factory() as s:
                s.add(Entry(id=1, title="m", body=RIVER))
                if n == 0:
                    s.commit()
                    continue
                with pytest.raises(ConfigurationError, match=r"outbox table \(in the default"):
                    s.commit()
        finally:
            alone.uninstall(factory)
    engines = [tenant("one", {None: "tenant"}), tenant("two", {None: "tenant"})]
    shared = SemanticIndex(store=store, embedder=HashEmbedder(dimension=64))
    shared.install(factory := sessionmaker(engines[0], expire_on_commit=False))
    try:
        _write(factory, (1, RIVER))
        with factory(bind=engines[1]) as s:
            s.add(Article(id=1, title="a1", content=MOUNTAIN))
            with pytest.raises(ConfigurationError, match=r"two\.sqlite3.*one\.sqlite3"):
                s.commit()
    finally:
        shared.uninstall(factory)
    apart = [
        SemanticIndex(store=store, embedder=HashEmbedder(dimension=64), collection_prefix=p)
        for p in ("one_", "two_")
    ]
    factories = [sessionmaker(e, expire_on_commit=False) for e in engines]
    for each, each_factory in zip(apart, factories, strict=True):
        each.install(each_factory)
    try:
        _write(factories[0], (2, RIVER))
        _write(factories[1], (2, MOUNTAIN))
        for n, (query, own) in enumerate((("river delta", RIVER), ("mountain snow", MOUNTAIN))):
            apart[n].drain(factories[n])
            with factories[n]() as s:
                hits = Article.semantic_search(s, query, limit=5)
                assert [h.obj.content for h in hits] == [own], n
    finally:
        for each, each_factory in zip(apart, factories, strict=True):
            each.uninstall(each_factory)
        for engine in made:
            engine.dispose()


def test_an_attached_schema_is_told_by_its_file_whatever_its_case(tmp_path: Path) -> None:
    """SQLite's schema names know no case, and a database attached after the engine was asked
    is seen (a connection of a pool that attaches on connect, the first one asked before)."""
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'main.sqlite3'}")
    try:
        with engine.connect() as conn:
            main = database_of(conn, "tenant")
            conn.exec_driver_sql(f"ATTACH DATABASE '{tmp_path / 'one.sqlite3'}' AS Tenant")
            for name in ("tenant", "TENANT", "Tenant"):
                found = database_of(conn, name)
                assert found is not None and found != main
                assert found[1].endswith("one.sqlite3"), found
            assert database_of(conn, "main") == database_of(conn) == main
    finally:
        engine.dispose()
