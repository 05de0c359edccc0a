"""The Alembic environment in ``migrations/`` upgrades, matches the example models, downgrades."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker
from sqlalchemy.orm import Session as OrmSession

from semantic_orm import (
    ConfigurationError,
    SemanticIndex,
    SemanticSearchMixin,
    SemanticText,
    alembic_helpers,
    outbox,
    semantic_search,
)
from semantic_orm.alembic_helpers import (
    CreateSemanticIndexOp,
    DropSemanticIndexOp,
    RenameSemanticIndexOp,
    compare_type,
    register_operations,
    render_item,
)
from semantic_orm.applying import Applier, ApplyReport
from semantic_orm.mapping import row_key, semantic_columns
from semantic_orm.stores import VectorStore
from semantic_orm.testing import HashEmbedder

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from examples.knowledge_base import Base  # noqa: E402

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
    assert MigrationContext.configure(connection).get_current_revision() == "0003"
    assert {"semantic_orm_outbox", "semantic_orm_checkpoint"} <= set(inspector.get_table_names())

    diff = compare_metadata(migration_context(connection), [Base.metadata, outbox.metadata])
    assert diff == []

    command.downgrade(cfg, "base")
    connection.commit()
    tables = set(sa.inspect(connection).get_table_names())
    assert not tables & {"knowledge_article", "semantic_orm_outbox", "semantic_orm_checkpoint"}


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


# ---------------------------------------------------------------- semantic migration operations

ANIMALS = [
    "aardvark", "badger", "capybara", "dolphin", "echidna", "flamingo", "gazelle", "hedgehog",
    "ibis", "jaguar", "kingfisher", "lemur", "marmot", "narwhal", "ocelot", "pangolin",
    "quokka", "raccoon", "salamander", "tapir",
]  # fmt: skip

SCRIPT_ENV = """
from alembic import context

from semantic_orm.alembic_helpers import register_operations

register_operations()
config = context.config
if context.is_offline_mode():
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        literal_binds=True,
        output_buffer=config.attributes["output"],
    )
else:
    context.configure(connection=config.attributes["connection"])
with context.begin_transaction():
    context.run_migrations()
"""

SCRIPT_A1 = f"""
import sqlalchemy as sa
from alembic import op

from semantic_orm import outbox

revision = "a1"
down_revision = None
branch_labels = None
depends_on = None


def upgrade():
    outbox.metadata.create_all(op.get_bind())
    memo = op.create_table(
        "memo",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("title", sa.String(100), nullable=False),
    )
    op.bulk_insert(memo, [{{"id": i, "title": t}} for i, t in enumerate({ANIMALS!r}, 1)])


def downgrade():
    op.drop_table("memo")
    outbox.metadata.drop_all(op.get_bind())
"""

SCRIPT_A2 = """
import sqlalchemy as sa
from alembic import op

import semantic_orm

revision = "a2"
down_revision = "a1"
branch_labels = None
depends_on = None


def upgrade():
    op.add_column(
        "memo",
        sa.Column("body", semantic_orm.SemanticText(chunk_size=200, overlap=40), nullable=True),
    )
    op.execute("UPDATE memo SET body = 'Field notes on the ' || title || ', seen at dawn.'")
    op.create_semantic_index("memo", "body")


def downgrade():
    op.drop_semantic_index("memo", "body")
    op.drop_column("memo", "body")
"""


class MemoBase(DeclarativeBase):
    pass


class Memo(SemanticSearchMixin, MemoBase):
    """The model as it is after revision a2."""

    __tablename__ = "memo"

    id: Mapped[int] = mapped_column(primary_key=True)
    title: Mapped[str] = mapped_column(sa.String(100))
    body: Mapped[str | None] = mapped_column(SemanticText(chunk_size=200, overlap=40))


def memo_scripts(tmp_path: Path) -> Config:
    """A throwaway Alembic environment: a1 creates ``memo`` (20 rows), a2 adds ``body``."""
    root = tmp_path / "memo_migrations"
    (root / "versions").mkdir(parents=True)
    (root / "env.py").write_text(SCRIPT_ENV)
    (root / "versions" / "a1_memo.py").write_text(SCRIPT_A1)
    (root / "versions" / "a2_memo_body.py").write_text(SCRIPT_A2)
    cfg = Config()
    cfg.set_main_option("script_location", str(root))
    return cfg


def memo_jobs(engine: Engine) -> list[tuple[str, str, str]]:
    """``(table, column, pk)`` of every outbox job, sorted."""
    with engine.connect() as conn:
        table = outbox.outbox
        rows = conn.execute(sa.select(table.c.table_name, table.c.column_name, table.c.row_pk))
        return sorted((t, c, pk) for t, c, pk in rows)


def operations_on(conn: Connection) -> Any:
    """Alembic's ``op`` on ``conn``, semantic operations registered (at run time: ``Any``)."""
    register_operations()
    return Operations(MigrationContext.configure(conn))


def make_memo_table(conn: Connection, *, with_outbox: bool = True) -> None:
    """``memo`` as revision a2 leaves it (20 rows with bodies), optionally with the outbox."""
    MemoBase.metadata.create_all(conn)
    conn.execute(
        sa.insert(Memo.__table__),
        [{"id": i, "title": a, "body": f"About the {a}."} for i, a in enumerate(ANIMALS, 1)],
    )
    if with_outbox:
        outbox.metadata.create_all(conn)


ALL_MEMO_JOBS = sorted(("memo", "body", row_key((i,))) for i in range(1, len(ANIMALS) + 1))


def test_register_operations_is_opt_in_and_repeat_safe() -> None:
    """Importing registers nothing (and ``import semantic_orm`` needs no Alembic)."""
    script = """
import sys
import semantic_orm
print("alembic" in sys.modules)
import semantic_orm.alembic_helpers as helpers
from alembic.operations import Operations
names = (
    "create_semantic_index", "reindex_semantic", "rename_semantic_index", "drop_semantic_index"
)
print([hasattr(Operations, n) for n in names])
helpers.register_operations()
helpers.register_operations()
from alembic import op
print([hasattr(Operations, n) and callable(getattr(op, n)) for n in names])
"""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == [
        "False",
        "[False, False, False, False]",
        "[True, True, True, True]",
    ]

    register_operations()
    method = Operations.create_semantic_index  # type: ignore[attr-defined]
    register_operations()
    assert Operations.create_semantic_index is method  # type: ignore[attr-defined]


def test_operations_reverse_each_other() -> None:
    create = CreateSemanticIndexOp("memo", "body", schema="app")
    drop = create.reverse()
    assert isinstance(drop, DropSemanticIndexOp)
    assert (drop.table_name, drop.column_name, drop.schema) == ("memo", "body", "app")
    back = drop.reverse()
    assert isinstance(back, CreateSemanticIndexOp)
    assert (back.table_name, back.column_name, back.schema) == ("memo", "body", "app")
    assert drop.index_table == "app.memo"
    rename = RenameSemanticIndexOp("memo", "body", new_column_name="text", schema="app")
    undo = rename.reverse()
    assert (undo.table_name, undo.column_name) == ("memo", "text")
    assert (undo.new_table_name, undo.new_column_name, undo.schema) == ("memo", "body", "app")


def test_rename_semantic_index_moves_the_columns_pending_jobs(
    engine: Engine, store: VectorStore, hash_embedder: HashEmbedder
) -> None:
    """Jobs committed before a migration renamed their column named the old one: no model
    mapped it afterwards, they stayed pending for good, and the rows' last writes never
    reached the index (with the collection's name pinned, nothing said so)."""
    with engine.connect() as conn:
        make_memo_table(conn)
        ops = operations_on(conn)
        ops.create_semantic_index("memo", "body")
        outbox.enqueue(conn, [("memo", "title", "1"), ("other", "body", "1")])
        conn.commit()
        ops.alter_column("memo", "body", new_column_name="text")
        ops.rename_semantic_index("memo", "body", new_column_name="text")
        conn.commit()
    moved = [("memo", "text", pk) for _, _, pk in ALL_MEMO_JOBS]
    assert memo_jobs(engine) == sorted([*moved, ("memo", "title", "1"), ("other", "body", "1")])

    class Renamed(DeclarativeBase):
        pass

    class Memo2(Renamed):
        __tablename__ = "memo"
        id: Mapped[int] = mapped_column(primary_key=True)
        title: Mapped[str] = mapped_column(sa.String(50))
        text: Mapped[str | None] = mapped_column(SemanticText(collection="memo__body"))

    with engine.begin() as conn:  # (the jobs no model maps: not this test's)
        conn.execute(sa.delete(outbox.outbox).where(outbox.outbox.c.column_name != "text"))
    idx = SemanticIndex(store=store, embedder=hash_embedder, mode="deferred", models=[Memo2])
    factory = sessionmaker(engine)
    idx.install(factory)
    try:
        assert idx.drain(engine, timeout=30).done == len(ANIMALS)
        with factory() as session:
            for animal in ANIMALS:
                hits = semantic_search(session, Memo2, animal, limit=1, mode="keyword")
                assert [h.obj.title for h in hits] == [animal]
    finally:
        idx.uninstall(factory)
    with engine.connect() as conn:  # and back
        operations_on(conn).rename_semantic_index("memo", "text", new_column_name="body")
        conn.commit()


def test_adding_semantic_column_to_populated_table_then_draining_makes_rows_searchable(
    engine: Engine, store: VectorStore, hash_embedder: HashEmbedder, tmp_path: Path
) -> None:
    """Add a column, upgrade, drain the worker: every row is searchable."""
    cfg = memo_scripts(tmp_path)
    with engine.connect() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "a1")
        conn.commit()
        assert memo_jobs(engine) == []  # nothing queued before the column exists
        command.upgrade(cfg, "a2")
        conn.commit()
        assert MigrationContext.configure(conn).get_current_revision() == "a2"

    assert memo_jobs(engine) == ALL_MEMO_JOBS  # one job per existing row
    collection = semantic_columns(sa.inspect(Memo))[0].collection()
    assert collection == "memo__body"
    assert store.count(collection) == 0  # nothing was embedded during the migration
    assert hash_embedder.calls == 0

    idx = SemanticIndex(
        store=store, embedder=hash_embedder, mode="deferred", models=[Memo], create_outbox=False
    )
    factory = sessionmaker(engine)
    idx.install(factory)
    try:
        report = idx.drain(engine, timeout=60)
        assert report.done == len(ANIMALS) and report.dead == 0
        assert memo_jobs(engine) == []
        assert store.count(collection) == len(ANIMALS)  # one short chunk per row
        with factory() as session:
            for i, animal in enumerate(ANIMALS, 1):
                for mode in ("keyword", "hybrid"):
                    hits = Memo.semantic_search(session, animal, limit=1, mode=mode)
                    assert [(h.obj.id, h.obj.title) for h in hits] == [(i, animal)], mode
    finally:
        idx.uninstall(factory)


def test_downgrade_drops_the_columns_jobs_and_the_column(engine: Engine, tmp_path: Path) -> None:
    cfg = memo_scripts(tmp_path)
    with engine.connect() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "a2")
        outbox.enqueue(conn, [("memo", "title", "1"), ("other", "body", "1")])
        table = outbox.outbox
        conn.execute(sa.update(table).where(table.c.row_pk == row_key((3,))).values(dead=True))
        conn.commit()
        assert len(memo_jobs(engine)) == len(ANIMALS) + 2

        command.downgrade(cfg, "a1")
        conn.commit()
        assert MigrationContext.configure(conn).get_current_revision() == "a1"
        assert {c["name"] for c in sa.inspect(conn).get_columns("memo")} == {"id", "title"}
        # the dead job went too; other columns' jobs stay
        assert memo_jobs(engine) == [("memo", "title", "1"), ("other", "body", "1")]

        command.upgrade(cfg, "a2")  # and up again
        conn.commit()
    assert len(memo_jobs(engine)) == len(ANIMALS) + 2


def test_reindex_semantic_queues_every_row(engine: Engine) -> None:
    with engine.connect() as conn:
        make_memo_table(conn)
        outbox.enqueue(conn, [("memo", "body", row_key((1,)))])  # already pending: still queued
        queued = operations_on(conn).reindex_semantic("memo", "body")
        conn.commit()
    assert queued == len(ANIMALS)
    assert memo_jobs(engine) == sorted([*ALL_MEMO_JOBS, ("memo", "body", row_key((1,)))])


def test_drop_semantic_index_removes_only_that_columns_jobs(engine: Engine) -> None:
    with engine.connect() as conn:
        make_memo_table(conn)
        ops = operations_on(conn)
        ops.create_semantic_index("memo", "body")
        outbox.enqueue(conn, [("memo", "title", "1"), ("other", "body", "1")])
        table = outbox.outbox
        conn.execute(sa.update(table).where(table.c.row_pk == row_key((5,))).values(dead=True))
        ops.drop_semantic_index("memo", "body")
        conn.commit()
    assert memo_jobs(engine) == [("memo", "title", "1"), ("other", "body", "1")]


def test_drop_semantic_index_without_outbox_does_nothing(engine: Engine) -> None:
    with engine.connect() as conn:
        make_memo_table(conn, with_outbox=False)
        operations_on(conn).drop_semantic_index("memo", "body")
        assert not sa.inspect(conn).has_table(outbox.OUTBOX_TABLE)


def test_create_semantic_index_needs_the_outbox_and_the_column(engine: Engine) -> None:
    with engine.connect() as conn:
        make_memo_table(conn, with_outbox=False)
        ops = operations_on(conn)
        with pytest.raises(ConfigurationError, match="no semantic_orm_outbox table"):
            ops.create_semantic_index("memo", "body")
        outbox.metadata.create_all(conn)
        with pytest.raises(ConfigurationError, match="'memo' has no column 'summary'"):
            ops.create_semantic_index("memo", "summary")
        assert conn.execute(sa.select(outbox.outbox.c.id)).all() == []


class PassageBase(DeclarativeBase):
    pass


class Passage(PassageBase):
    """A composite key declared in another order than the columns."""

    __tablename__ = "passage"
    __table_args__ = (sa.PrimaryKeyConstraint("lang", "doc_id"),)

    doc_id: Mapped[int] = mapped_column()
    lang: Mapped[str] = mapped_column(sa.String(8))
    body: Mapped[str | None] = mapped_column(SemanticText())


def test_create_semantic_index_keys_rows_like_the_mapper(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Composite keys follow the primary key's order; pages of keys cover every row once."""
    monkeypatch.setattr(alembic_helpers, "BATCH_SIZE", 5)
    rows = [
        {"doc_id": d, "lang": lang, "body": "x"}
        for d in (1, 2, 3, 10)
        for lang in ("de", "en", "fr")
    ]
    with engine.connect() as conn:
        PassageBase.metadata.create_all(conn)
        outbox.metadata.create_all(conn)
        conn.execute(sa.insert(Passage.__table__), rows)
        queued = operations_on(conn).create_semantic_index("passage", "body")
        conn.commit()
    with OrmSession(engine) as session:  # the keys the mapper gives the same rows
        expected = sorted(
            ("passage", "body", row_key(sa.inspect(obj).identity))
            for obj in session.scalars(sa.select(Passage))
        )
    assert ("passage", "body", '["de", 1]') in expected  # (lang, doc_id): the key's order
    assert queued == len(rows)
    assert memo_jobs(engine) == expected


class Ticket(PassageBase):
    """A ``Uuid`` key, which SQLite stores (and a migration reflects) as 32 hex digits."""

    __tablename__ = "ticket"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    body: Mapped[str | None] = mapped_column(SemanticText())


def _all_failed(ops: Any, error: BaseException) -> ApplyReport:
    report = ApplyReport()
    report.failed.append((list(ops), error))
    return report


def test_rows_a_migration_queued_by_a_key_the_mapper_writes_otherwise_are_synced(
    engine: Engine, store: VectorStore, hash_embedder: HashEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The jobs of a ``Uuid`` key reflected as hex digits (SQLite) named their rows in a way
    the worker's reading of them did not: each row was read as gone, its job settled, the row
    never indexed (reconcile alone found it). Its points take the key the mapper writes, which
    an ORM update of the row uses too."""
    ids = sorted(uuid.UUID(int=i * 7919) for i in range(1, 4))
    with engine.connect() as conn:
        PassageBase.metadata.create_all(conn)
        outbox.metadata.create_all(conn)
        conn.execute(
            sa.insert(Ticket.__table__), [{"id": u, "body": f"printer jam {u}"} for u in ids]
        )
        assert operations_on(conn).create_semantic_index("ticket", "body") == 3
        conn.commit()
    idx = SemanticIndex(
        store=store, embedder=hash_embedder, mode="deferred", models=[Ticket], retry_base=0.05
    )
    factory = sessionmaker(engine)
    idx.install(factory)
    keys = {row_key((u,)) for u in ids}
    try:
        with monkeypatch.context() as failing:  # a pass whose sync fails: its jobs stay queued,
            # stored by the key the model writes (a commit's job for the row sees them)
            failing.setattr(
                Applier, "apply", lambda self, ops, inline=False: _all_failed(ops, OSError("down"))
            )
            assert idx.process(engine).retried == 3
        assert {pk for _, _, pk in memo_jobs(engine)} == keys
        assert idx.drain(engine, timeout=30).done == 3
        assert {p.payload["pk"] for p in store.points("ticket__body")} == keys
        with factory() as session:
            hits = semantic_search(session, Ticket, "printer jam", limit=5, mode="keyword")
            assert sorted(h.obj.id for h in hits) == ids
            ticket = session.get(Ticket, ids[0])
            assert ticket is not None
            ticket.body = "paper tray empty"
            session.commit()
        idx.drain(engine, timeout=30)
        assert {p.payload["pk"] for p in store.points("ticket__body")} == keys  # no second key
    finally:
        idx.uninstall(factory)


def test_offline_mode(tmp_path: Path) -> None:
    """``--sql``: queueing rows needs a database, so it refuses; the drop emits its DELETE."""
    cfg = memo_scripts(tmp_path)
    cfg.set_main_option("sqlalchemy.url", "sqlite://")
    cfg.attributes["output"] = io.StringIO()
    with pytest.raises(ConfigurationError, match="offline"):
        command.upgrade(cfg, "a1:a2", sql=True)

    cfg.attributes["output"] = out = io.StringIO()
    command.downgrade(cfg, "a2:a1", sql=True)
    sql = " ".join(out.getvalue().split())
    assert (
        "DELETE FROM semantic_orm_outbox WHERE semantic_orm_outbox.table_name = 'memo' "
        "AND semantic_orm_outbox.column_name = 'body'"
    ) in sql
    assert sql.index("DELETE FROM semantic_orm_outbox") < sql.index("DROP COLUMN body")


class AppMemoBase(DeclarativeBase):
    metadata = sa.MetaData(schema="app")


class AppMemo(AppMemoBase):
    __tablename__ = "memo"

    id: Mapped[int] = mapped_column(primary_key=True)
    body: Mapped[str | None] = mapped_column(SemanticText())


@pytest.mark.postgres
def test_schema_qualified_table(postgresql_url: sa.URL) -> None:
    """Jobs name a table in a schema as the index does: ``schema.table``."""
    engine = sa.create_engine(postgresql_url)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("CREATE SCHEMA app"))
            AppMemoBase.metadata.create_all(conn)
            outbox.metadata.create_all(conn)
            conn.execute(
                sa.insert(AppMemo.__table__), [{"id": 1, "body": "a"}, {"id": 2, "body": None}]
            )
            ops = operations_on(conn)
            ops.create_semantic_index("memo", "body", schema="app")
            conn.commit()
            table = semantic_columns(sa.inspect(AppMemo))[0].table
            assert table == "app.memo"
            assert memo_jobs(engine) == [(table, "body", "1"), (table, "body", "2")]
            ops.drop_semantic_index("memo", "body", schema="app")
            conn.commit()
        assert memo_jobs(engine) == []
    finally:
        engine.dispose()
