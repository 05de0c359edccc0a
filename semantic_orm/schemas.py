"""Schema translation: which schema a connection's statements reach, and one per index.

SQLAlchemy's ``schema_translate_map`` execution option renders a table declared in one schema
in another (``engine.execution_options(schema_translate_map={None: "tenant_42"})``: the usual
way to give each tenant its own schema). A vector collection holds one column's points keyed by
primary key and knows nothing of schemas, so the rows of two schemas written through one index
would overwrite each other's points, and each schema's searches would rank the other's text.
The rules, enforced where rows are written, searched and processed:

* **The engine translates, not a connection, a session or a statement.** A commit's sync, the
  retrier and the workers read the rows and the outbox through the engine; a map set on a
  connection alone would have them read another schema (:func:`check_connection`).
* **The outbox moves with the table.** A table translated into a schema takes the outbox (whose
  table is declared without a schema) into the same one: an outbox shared by several schemas
  would have each schema's workers take the others' jobs and read their keys in the wrong rows.
* **One schema per declared schema, per index** (:class:`SchemaClaims`): an index that has
  written, searched or processed a table in one schema refuses another. Give each schema its
  own ``SemanticIndex`` (with its own ``collection_prefix``), installed on a sessionmaker bound
  to that schema's engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, Table

from .exc import ConfigurationError
from .forking import RenewedLock

__all__ = ["SchemaClaims", "check_connection", "translated"]

OPTION = "schema_translate_map"
_FIX = (
    "Give each schema its own SemanticIndex (collection_prefix=...) installed on a sessionmaker "
    "bound to that schema's engine, engine.execution_options(schema_translate_map=...)"
)


def translated(schema: str | None, options: Mapping[str, Any]) -> str | None:
    """The schema a table declared in ``schema`` reaches with execution ``options``."""
    found = options.get(OPTION) or {}
    return found[schema] if schema in found else schema


def _shown(schema: str | None) -> str:
    return "the default schema" if schema is None else f"schema {schema!r}"


def check_connection(
    conn: Connection,
    table: Table,
    outbox: Table,
    what: str,
    options: Mapping[str, Any] | None = None,
) -> str | None:
    """Refuse a write to ``table`` on ``conn`` that the index could not follow; return the
    schema it reaches.

    Args:
        conn: The connection of the write.
        table: The table with a semantic column it writes.
        outbox: The outbox table (its jobs go there).
        what: The column or table, for messages.
        options: The statement's own execution options, if any.

    Raises:
        ConfigurationError: A connection, session or statement translates the table or the
            outbox otherwise than its engine does, or the table is translated into a schema the
            outbox is not.
    """
    engine = conn.engine.get_execution_options()
    here: Mapping[str, Any] = conn.get_execution_options()
    if options and OPTION in options:
        here = {**here, OPTION: options[OPTION]}
    for declared in (table.schema, outbox.schema):
        reached, synced = translated(declared, here), translated(declared, engine)
        if reached != synced:
            raise ConfigurationError(
                f"{what}: this write reaches {_shown(reached)} through a schema_translate_map "
                f"set on the connection, the session or the statement, but its engine puts "
                f"{_shown(declared)} in {_shown(synced)}; the commit's sync and the workers read "
                "rows and jobs through the engine, so they would read another schema. Set the "
                "map on the engine (engine.execution_options(schema_translate_map=...)) and bind "
                "the session to that engine"
            )
    reached = translated(table.schema, engine)
    jobs = translated(outbox.schema, engine)
    if reached != table.schema and reached != jobs:
        raise ConfigurationError(
            f"{what}: schema_translate_map puts the table in {_shown(reached)} but leaves the "
            f"outbox table {outbox.name!r} in {_shown(jobs)}, where the jobs of every schema "
            "translated that way would meet (each schema's sync would take the others' jobs and "
            f"read their keys in its own rows). Translate the outbox's schema too: "
            f"schema_translate_map={{..., {outbox.schema!r}: {reached!r}}}"
        )
    return reached


class SchemaClaims:
    """The schema each table reached through one index (see the module docstring)."""

    def __init__(self) -> None:
        self._reached: dict[str, tuple[str | None, str]] = {}
        self._lock = RenewedLock()

    def claim(self, table: str, reached: str | None, what: str) -> None:
        """Note that ``table`` (its declared name; ``what`` describes it) is used in schema
        ``reached``.

        Raises:
            ConfigurationError: This index already used ``table`` in another schema.
        """
        first = self._reached.get(table)
        if first is None:
            with self._lock:
                first = self._reached.setdefault(table, (reached, what))
        if first[0] != reached:
            raise ConfigurationError(
                f"{what} is used in {_shown(reached)} here, but this SemanticIndex already "
                f"used {first[1]} in {_shown(first[0])} (schema_translate_map): the rows of both "
                "schemas would share its vector collection, overwriting each other's points "
                f"and answering each other's searches. {_FIX}"
            )
