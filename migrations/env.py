"""Alembic environment for the semantic_orm example app (``examples/knowledge_base.py``).

Run from any directory: ``alembic -c migrations/alembic.ini upgrade head``. The database URL is
``$DATABASE_URL`` when set, else ``sqlalchemy.url`` from ``alembic.ini``. A caller (e.g. a
test) may pass an open connection as ``config.attributes["connection"]``.
"""

from __future__ import annotations

import os
import sys
from logging.config import fileConfig
from pathlib import Path
from typing import Any

from alembic import context
from sqlalchemy import engine_from_config, pool
from sqlalchemy.engine import Connection

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from examples.knowledge_base import Base  # noqa: E402
from migrations.render import compare_type, render_item  # noqa: E402
from semantic_orm.outbox import metadata as outbox_metadata  # noqa: E402

config = context.config

if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

if os.environ.get("DATABASE_URL"):
    # "%" is the ini interpolation character.
    config.set_main_option("sqlalchemy.url", os.environ["DATABASE_URL"].replace("%", "%%"))

# The app's tables and semantic_orm's own (the sync outbox): Alembic compares against both.
target_metadata = [Base.metadata, outbox_metadata]


def configure_options(dialect_name: str) -> dict[str, Any]:
    """Options for ``context.configure`` shared by offline and online modes (and the tests)."""
    return {
        "target_metadata": target_metadata,
        "render_as_batch": dialect_name == "sqlite",
        "render_item": render_item,
        "compare_type": compare_type,
    }


def run_migrations_offline() -> None:
    """Emit the migration SQL to stdout (``alembic upgrade head --sql``), no database needed."""
    url = config.get_main_option("sqlalchemy.url")
    assert url is not None, "set sqlalchemy.url in alembic.ini or $DATABASE_URL"
    context.configure(
        url=url,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        **configure_options(url.split(":", 1)[0].split("+", 1)[0]),
    )
    with context.begin_transaction():
        context.run_migrations()


def do_run_migrations(connection: Connection) -> None:
    context.configure(connection=connection, **configure_options(connection.dialect.name))
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run the migrations on a live connection (the caller's, or a new one from the URL)."""
    connection = config.attributes.get("connection")
    if connection is not None:
        do_run_migrations(connection)
        return
    connectable = engine_from_config(
        config.get_section(config.config_ini_section, {}),
        prefix="sqlalchemy.",
        poolclass=pool.NullPool,
    )
    with connectable.connect() as connection:
        do_run_migrations(connection)


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
