"""Tests of the test infrastructure itself: the database fixtures and the PostgreSQL helper."""

from __future__ import annotations

import os

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine

from pg_cluster import ENV_URL, PostgresCluster, PostgresServer, port_is_open


def test_offline_env_is_set() -> None:
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    assert os.environ["TRANSFORMERS_OFFLINE"] == "1"
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"


def test_engine_roundtrip(engine: Engine) -> None:
    meta = sa.MetaData()
    notes = sa.Table(
        "notes",
        meta,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("body", sa.Text, nullable=False),
    )
    meta.create_all(engine)
    text = "naïve café — 東京 🚀"
    with engine.begin() as conn:
        conn.execute(notes.insert(), [{"id": 1, "body": text}])
    with engine.connect() as conn:
        assert conn.execute(sa.select(notes.c.body).where(notes.c.id == 1)).scalar_one() == text


def test_db_url_is_fresh_per_test(engine: Engine) -> None:
    """``test_engine_roundtrip`` created a table; this test's database must not have it."""
    assert sa.inspect(engine).get_table_names() == []


@pytest.mark.postgres
def test_postgresql_server(pg_url: URL) -> None:
    eng = sa.create_engine(pg_url)
    try:
        with eng.connect() as conn:
            encoding = conn.execute(sa.text("SHOW server_encoding")).scalar_one()
            assert conn.execute(sa.text("SELECT current_database()")).scalar_one() == (
                pg_url.database
            )
        assert eng.dialect.driver == "psycopg"
        assert eng.dialect.server_version_info is not None
        major = int(eng.dialect.server_version_info[0])
        if os.environ.get(ENV_URL):
            assert major >= 13  # an external server: only what DROP ... WITH (FORCE) needs
        else:
            assert major == 15  # the cluster started from /usr/lib/postgresql/15
            assert encoding == "UTF8"
    finally:
        eng.dispose()


@pytest.mark.postgres
def test_postgresql_databases_are_isolated(pg_server: PostgresServer) -> None:
    first, second = pg_server.create_database(), pg_server.create_database()
    try:
        assert first.database != second.database
        eng = sa.create_engine(first)
        try:
            with eng.begin() as conn:
                conn.execute(sa.text("CREATE TABLE t (x int)"))
        finally:
            eng.dispose()
        eng = sa.create_engine(second)
        try:
            assert sa.inspect(eng).get_table_names() == []
            # A leaked connection must not stop the drop (WITH (FORCE)).
            leaked = eng.connect()
            leaked.execute(sa.text("SELECT 1"))
            assert second.database is not None
            pg_server.drop_database(second.database)
            # Close it explicitly: a connection finalized by the GC at a random moment can
            # trip CPython 3.11.7's "AST constructor recursion depth mismatch" bug.
            leaked.invalidate()
            leaked.close()
        finally:
            eng.dispose()
    finally:
        for url in (first, second):
            assert url.database is not None
            pg_server.drop_database(url.database)


@pytest.mark.postgres
@pytest.mark.skipif(bool(os.environ.get(ENV_URL)), reason=f"{ENV_URL} set: no local cluster")
def test_cluster_start_stop() -> None:
    """An independent second cluster starts, serves queries, and leaves nothing after stop."""
    with PostgresCluster(database="other") as cluster:
        port, root = cluster.port, cluster.root
        assert port is not None and root is not None
        assert port_is_open(port)
        eng = sa.create_engine(cluster.url)
        try:
            with eng.connect() as conn:
                assert conn.execute(sa.text("SELECT current_database()")).scalar_one() == "other"
        finally:
            eng.dispose()
    assert not cluster.running
    assert not port_is_open(port)
    assert not root.exists()
    cluster.stop()  # idempotent
