"""The Alembic environment in ``migrations/`` upgrades, matches the example models, downgrades."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Connection, Engine

from semantic_orm import SemanticText, outbox

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from examples.knowledge_base import Base  # noqa: E402
from migrations.render import compare_type, render_item  # noqa: E402

ALEMBIC_INI = REPO_ROOT / "migrations" / "alembic.ini"


def make_config(connection: Connection) -> Config:
    """An Alembic config for ``migrations/`` that runs on ``connection`` (env.py uses it)."""
    cfg = Config(str(ALEMBIC_INI))
    cfg.attributes["connection"] = connection
    cfg.attributes["configure_logger"] = False  # leave pytest's logging alone
    return cfg


def migration_context(connection: Connection) -> MigrationContext:
    """A MigrationContext configured like env.py's."""
    return MigrationContext.configure(
        connection,
        opts={
            "target_metadata": [Base.metadata, outbox.metadata],
            "render_as_batch": connection.dialect.name == "sqlite",
            "render_item": render_item,
            "compare_type": compare_type,
        },
    )


@pytest.fixture
def connection(engine: Engine) -> Iterator[Connection]:
    with engine.connect() as conn:
        yield conn


def test_upgrade_matches_models_and_downgrade(connection: Connection) -> None:
    cfg = make_config(connection)

    command.upgrade(cfg, "head")
    connection.commit()
    inspector = sa.inspect(connection)
    assert "knowledge_article" in inspector.get_table_names()
    columns = {c["name"]: c for c in inspector.get_columns("knowledge_article")}
    assert set(columns) == {"id", "title", "content"}
    assert isinstance(columns["content"]["type"], sa.Text)
    assert columns["content"]["nullable"] is True
    assert columns["title"]["nullable"] is False
    assert inspector.get_pk_constraint("knowledge_article")["constrained_columns"] == ["id"]
    assert MigrationContext.configure(connection).get_current_revision() == "0002"
    assert "semantic_orm_outbox" in inspector.get_table_names()

    diff = compare_metadata(migration_context(connection), [Base.metadata, outbox.metadata])
    assert diff == []

    command.downgrade(cfg, "base")
    connection.commit()
    tables = sa.inspect(connection).get_table_names()
    assert "knowledge_article" not in tables and "semantic_orm_outbox" not in tables


def test_render_item_keeps_semantic_text_settings() -> None:
    autogen_context = SimpleNamespace(imports=set())
    rendered = render_item("type", SemanticText(chunk_size=300, overlap=60), autogen_context)
    assert rendered == "semantic_orm.SemanticText(chunk_size=300, overlap=60)"
    assert autogen_context.imports == {"import semantic_orm"}

    other_context = SimpleNamespace(imports=set())
    assert render_item("type", sa.String(200), other_context) is False
    assert render_item("column", sa.Column("x", sa.Text), other_context) is False
    assert other_context.imports == set()


def test_autogenerate_renders_semantic_text(tmp_path: Path) -> None:
    """``alembic revision --autogenerate`` through env.py writes the column with its settings."""
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'empty.sqlite3'}")
    versions = tmp_path / "versions"
    versions.mkdir()
    try:
        with engine.connect() as conn:
            cfg = make_config(conn)
            cfg.set_main_option("version_locations", str(versions))  # not migrations/versions
            command.revision(cfg, message="everything", autogenerate=True, rev_id="x1")
    finally:
        engine.dispose()
    (script,) = versions.glob("x1_*.py")
    code = script.read_text()
    assert "\nimport semantic_orm\n" in code
    assert "semantic_orm.SemanticText(chunk_size=300, overlap=60)" in code
    assert "op.create_table('knowledge_article'" in code
