"""Alembic support: autogenerate hooks and migration operations for ``SemanticText`` columns.

Needs Alembic (``pip install 'semantic-orm[alembic]'``). Nothing is registered on import; wire it
into your ``env.py``::

    from semantic_orm.alembic_helpers import compare_type, register_operations, render_item
    from semantic_orm.outbox import metadata as outbox_metadata

    register_operations()  # op.create_semantic_index, .reindex_semantic, .rename_semantic_index,
                           # .drop_semantic_index

    context.configure(
        connection=connection,
        target_metadata=[Base.metadata, outbox_metadata],
        render_item=render_item,    # autogenerate writes SemanticText(...) with its settings
        compare_type=compare_type,  # SemanticText and the TEXT the database reflects are equal
    )

Then, in a migration that adds a semantic column to a populated table::

    def upgrade() -> None:
        op.add_column("note", sa.Column("body", semantic_orm.SemanticText(), nullable=True))
        op.create_semantic_index("note", "body")  # one outbox job per existing row

    def downgrade() -> None:
        op.drop_semantic_index("note", "body")    # drop the column's pending jobs
        op.drop_column("note", "body")

A migration that renames a semantic column (or its table) moves its pending jobs along::

    op.alter_column("note", "body", new_column_name="text")
    op.rename_semantic_index("note", "body", new_column_name="text")

A migration run once per tenant schema through ``schema_translate_map`` passes no ``schema=``
to these operations: the index names each job's table as the model declares it (``schema=``
is for a table the model itself declares in a schema).

The operations only write outbox jobs, in the migration's transaction: nothing is embedded while
the migration runs. A worker (``semantic-orm worker``, or ``SemanticIndex.drain()``) embeds the
rows once the migration has committed. The outbox table (``semantic_orm_outbox``) must already
exist, created by an earlier migration.
"""

from __future__ import annotations

import threading
from typing import Any

import sqlalchemy as sa
from alembic.operations import MigrateOperation, Operations
from sqlalchemy import types as sqltypes

from . import outbox
from .column import SemanticText
from .exc import ConfigurationError
from .mapping import iter_keys
from .outbox import JobKey

__all__ = [
    "CreateSemanticIndexOp",
    "DropSemanticIndexOp",
    "ReindexSemanticOp",
    "RenameSemanticIndexOp",
    "compare_type",
    "register_operations",
    "render_item",
]

#: Primary keys read per query, and jobs written per ``INSERT``.
BATCH_SIZE = 1000

# -- autogenerate hooks ----------------------------------------------------------------------


def render_item(type_: str, obj: Any, autogen_context: Any) -> str | bool:
    """Render a ``SemanticText`` as ``semantic_orm.SemanticText(...)``, settings kept.

    Pass as ``context.configure(render_item=render_item)``. Adds ``import semantic_orm`` to the
    migration; returns ``False`` (Alembic's default rendering) for everything else.
    """
    if type_ == "type" and isinstance(obj, SemanticText):
        autogen_context.imports.add("import semantic_orm")
        return "semantic_orm." + repr(obj)
    return False


def compare_type(
    context: Any,
    inspected_column: Any,
    metadata_column: Any,
    inspected_type: sqltypes.TypeEngine[Any],
    metadata_type: sqltypes.TypeEngine[Any],
) -> bool | None:
    """Treat a ``SemanticText`` and the ``TEXT`` the database reflects as equal.

    Pass as ``context.configure(compare_type=compare_type)``.

    Returns:
        ``False`` (no change) for that pair, ``None`` (Alembic's default comparison) otherwise.
    """
    if isinstance(metadata_type, SemanticText) and isinstance(inspected_type, sqltypes.Text):
        return False
    return None


# -- operations ------------------------------------------------------------------------------


class _SemanticColumnOp(MigrateOperation):
    """An operation on the outbox jobs of one table's semantic column."""

    def __init__(self, table_name: str, column_name: str, *, schema: str | None = None) -> None:
        self.table_name = table_name
        self.column_name = column_name
        self.schema = schema

    @property
    def index_table(self) -> str:
        """The table as outbox jobs name it (``schema.table`` when a schema is set)."""
        return f"{self.schema}.{self.table_name}" if self.schema else self.table_name

    def __repr__(self) -> str:
        schema = f", schema={self.schema!r}" if self.schema else ""
        return f"{type(self).__name__}({self.table_name!r}, {self.column_name!r}{schema})"


class CreateSemanticIndexOp(_SemanticColumnOp):
    """``op.create_semantic_index``: queue every existing row of a new semantic column."""

    @classmethod
    def create_semantic_index(
        cls,
        operations: Operations,
        table_name: str,
        column_name: str,
        *,
        schema: str | None = None,
    ) -> int:
        """Queue one outbox job per existing row of ``table_name``, for ``column_name``.

        Call it after adding a ``SemanticText`` column to a populated table (or declaring an
        existing text column semantic). The jobs are written in the migration's transaction;
        the rows are embedded after the migration commits, by a worker (``semantic-orm worker``)
        or ``SemanticIndex.drain()``, never during the migration.

        Args:
            operations: Alembic's operations object (given by ``op``).
            table_name: The table, without schema.
            column_name: The ``SemanticText`` column's name in the database.
            schema: The table's schema, if not the default one.

        Returns:
            The number of jobs queued.

        Raises:
            ConfigurationError: In offline (``--sql``) mode, or if the table lacks the column or
                the database has no ``semantic_orm_outbox`` table.
        """
        return int(operations.invoke(cls(table_name, column_name, schema=schema)))

    def reverse(self) -> DropSemanticIndexOp:
        """The operation that undoes this one."""
        return DropSemanticIndexOp(self.table_name, self.column_name, schema=self.schema)


class ReindexSemanticOp(_SemanticColumnOp):
    """``op.reindex_semantic``: re-embed every row of a semantic column after the migration."""

    @classmethod
    def reindex_semantic(
        cls,
        operations: Operations,
        table_name: str,
        column_name: str,
        *,
        schema: str | None = None,
    ) -> int:
        """Queue every row of ``column_name`` to be re-embedded after the migration.

        Use it after a migration changed the column's text with SQL (``op.execute("UPDATE
        ...")`` bypasses the ORM, so no sync job is written). Chunks that come out unchanged keep
        their vectors. A changed model or chunk setting is not re-embedded in place: that is
        ``semantic-orm reindex ... --rebuild`` (a new collection, then a switch). Same queueing as
        ``create_semantic_index``.

        Args:
            operations: Alembic's operations object (given by ``op``).
            table_name: The table, without schema.
            column_name: The ``SemanticText`` column's name in the database.
            schema: The table's schema, if not the default one.

        Returns:
            The number of jobs queued.

        Raises:
            ConfigurationError: In offline (``--sql``) mode, or if the table lacks the column or
                the database has no ``semantic_orm_outbox`` table.
        """
        return int(operations.invoke(cls(table_name, column_name, schema=schema)))


class RenameSemanticIndexOp(_SemanticColumnOp):
    """``op.rename_semantic_index``: move a renamed semantic column's pending jobs along."""

    def __init__(
        self,
        table_name: str,
        column_name: str,
        *,
        new_table_name: str | None = None,
        new_column_name: str | None = None,
        schema: str | None = None,
    ) -> None:
        super().__init__(table_name, column_name, schema=schema)
        self.new_table_name = new_table_name or table_name
        self.new_column_name = new_column_name or column_name

    @property
    def new_index_table(self) -> str:
        """The renamed table as outbox jobs name it."""
        return f"{self.schema}.{self.new_table_name}" if self.schema else self.new_table_name

    @classmethod
    def rename_semantic_index(
        cls,
        operations: Operations,
        table_name: str,
        column_name: str,
        *,
        new_table_name: str | None = None,
        new_column_name: str | None = None,
        schema: str | None = None,
    ) -> None:
        """Rename the table and/or column the outbox jobs of ``column_name`` name.

        Call it beside ``op.rename_table`` or ``op.alter_column(..., new_column_name=...)``:
        jobs committed before the rename name the old table or column, which no model maps
        afterwards; they stayed pending for good and the rows' last changes never reached the
        index. In offline (``--sql``) mode this emits the ``UPDATE``; does nothing if the
        database has no outbox table.

        Args:
            operations: Alembic's operations object (given by ``op``).
            table_name: The table's old name, without schema.
            column_name: The column's old name in the database.
            new_table_name: The table's new name (default: unchanged).
            new_column_name: The column's new name (default: unchanged).
            schema: The table's schema, if not the default one.
        """
        operations.invoke(
            cls(
                table_name,
                column_name,
                new_table_name=new_table_name,
                new_column_name=new_column_name,
                schema=schema,
            )
        )

    def reverse(self) -> RenameSemanticIndexOp:
        """The operation that undoes this one."""
        return RenameSemanticIndexOp(
            self.new_table_name,
            self.new_column_name,
            new_table_name=self.table_name,
            new_column_name=self.column_name,
            schema=self.schema,
        )


class DropSemanticIndexOp(_SemanticColumnOp):
    """``op.drop_semantic_index``: forget the pending jobs of a semantic column."""

    @classmethod
    def drop_semantic_index(
        cls,
        operations: Operations,
        table_name: str,
        column_name: str,
        *,
        schema: str | None = None,
    ) -> None:
        """Delete the pending and dead outbox jobs of ``column_name`` (before dropping it).

        Once the column is gone they could never be processed. The vectors themselves stay in
        the vector store until ``semantic-orm gc`` removes collections no model declares. In
        offline (``--sql``) mode this emits the ``DELETE``. Does nothing if the database has no
        outbox table.

        Args:
            operations: Alembic's operations object (given by ``op``).
            table_name: The table, without schema.
            column_name: The column's name in the database.
            schema: The table's schema, if not the default one.
        """
        operations.invoke(cls(table_name, column_name, schema=schema))

    def reverse(self) -> CreateSemanticIndexOp:
        """The operation that undoes this one."""
        return CreateSemanticIndexOp(self.table_name, self.column_name, schema=self.schema)


def _queue_rows(operations: Operations, operation: _SemanticColumnOp) -> int:
    """Write one outbox job per row of the operation's table, on the migration's connection."""
    name = type(operation).__name__
    if operations.get_context().as_sql:
        raise ConfigurationError(
            f"{name} reads the table's rows, so it cannot run in offline (--sql) mode; run the "
            "migration online, or queue the rows afterwards with `semantic-orm reindex`"
        )
    bind = operations.get_bind()
    if not outbox.exists(bind):
        raise ConfigurationError(
            f"{name}: the database has no {outbox.OUTBOX_TABLE} table; run the migration that "
            "creates it first (autogenerate with semantic_orm.outbox.metadata in target_metadata; "
            "see semantic_orm's migrations/versions/0002_semantic_orm_outbox.py)"
        )
    table = sa.Table(
        operation.table_name, sa.MetaData(), schema=operation.schema, autoload_with=bind
    )
    if operation.column_name not in table.c:
        raise ConfigurationError(
            f"{name}: table {operation.index_table!r} has no column {operation.column_name!r}; "
            "add the column first"
        )
    if not list(table.primary_key.columns):
        raise ConfigurationError(f"{name}: table {operation.index_table!r} has no primary key")
    queued = 0
    for keys in iter_keys(bind, table, batch_size=BATCH_SIZE):
        jobs = [JobKey(operation.index_table, operation.column_name, key) for key in keys]
        queued += len(outbox.enqueue(bind, jobs))
    return queued


def _create_semantic_index(operations: Operations, operation: CreateSemanticIndexOp) -> int:
    return _queue_rows(operations, operation)


def _reindex_semantic(operations: Operations, operation: ReindexSemanticOp) -> int:
    return _queue_rows(operations, operation)


def _drop_semantic_index(operations: Operations, operation: DropSemanticIndexOp) -> None:
    if _without_outbox(operations):
        return
    jobs = outbox.outbox
    operations.execute(
        sa.delete(jobs).where(
            jobs.c.table_name == operation.index_table,
            jobs.c.column_name == operation.column_name,
        )
    )


def _rename_semantic_index(operations: Operations, operation: RenameSemanticIndexOp) -> None:
    if _without_outbox(operations):
        return
    jobs = outbox.outbox
    operations.execute(
        sa.update(jobs)
        .where(
            jobs.c.table_name == operation.index_table,
            jobs.c.column_name == operation.column_name,
        )
        .values(table_name=operation.new_index_table, column_name=operation.new_column_name)
    )


def _without_outbox(operations: Operations) -> bool:
    """Whether the database has no outbox (online; offline the statement is emitted)."""
    return not operations.get_context().as_sql and not outbox.exists(operations.get_bind())


_registered = False
_register_lock = threading.Lock()


def register_operations() -> None:
    """Add ``op.create_semantic_index``, ``op.reindex_semantic``, ``op.rename_semantic_index``
    and ``op.drop_semantic_index``.

    Call it once in ``env.py``, before the migrations run. Calling it again does nothing.
    """
    global _registered
    with _register_lock:
        if _registered:
            return
        for op_cls, name, impl in (
            (CreateSemanticIndexOp, "create_semantic_index", _create_semantic_index),
            (ReindexSemanticOp, "reindex_semantic", _reindex_semantic),
            (RenameSemanticIndexOp, "rename_semantic_index", _rename_semantic_index),
            (DropSemanticIndexOp, "drop_semantic_index", _drop_semantic_index),
        ):
            Operations.register_operation(name)(op_cls)
            Operations.implementation_for(op_cls)(impl)
        _registered = True
