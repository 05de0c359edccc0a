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
* **One schema per table, per index** (:class:`SchemaClaims`): an index that has written,
  searched or processed a table in one schema refuses another for the life of the index. Give
  each schema its own ``SemanticIndex`` (with its own ``collection_prefix``), installed on a
  sessionmaker bound to that schema's engine.
* **One schema per table, per outbox** (for the whole process, :meth:`SchemaClaims.claim`):
  an outbox (declared without a schema) left where it is while a table moves is fine for one
  translation (a renamed schema), but two translations of one table writing to the same outbox
  would have each schema's worker take the other's jobs and look for their keys in its own rows:
  the second is refused.

A claim is made only when every table of the operation passes, so a refused operation pins
nothing. A write's claims hold while its session's root transaction is open, for good once it
commits, and go when it ends otherwise (a savepoint's write counts with its root; a session that
joined a transaction it does not own claims for good at once: it cannot tell that transaction's
fate); those of a search, a worker pass or a maintenance tool hold for good. For good means the
life of the index (of the process, for an outbox).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, Table

from .exc import ConfigurationError
from .forking import RenewedLock

__all__ = ["Claim", "SchemaClaims", "check_connection", "jobs_at", "translated"]

OPTION = "schema_translate_map"
_FIX = (
    "Give each schema its own SemanticIndex, with its own collection_prefix, installed on a "
    "sessionmaker bound to that schema's engine (engine.execution_options("
    "schema_translate_map=...))."
)


def translated(schema: str | None, options: Mapping[str, Any]) -> str | None:
    """The schema a table declared in ``schema`` reaches with execution ``options``."""
    found = options.get(OPTION) or {}
    return found[schema] if schema in found else schema


def _shown(schema: str | None) -> str:
    return "the default schema" if schema is None else f"schema {schema!r}"


def check_connection(
    conn: Connection, schemas: Iterable[str | None], what: str, options: Mapping[str, Any] | None
) -> None:
    """Refuse a connection (or a statement on it, with its own execution ``options``) that
    translates any of the declared ``schemas`` otherwise than its engine does.

    Raises:
        ConfigurationError: Naming ``what`` (the column or table), both schemas and the fix.
    """
    engine = conn.engine.get_execution_options()
    here: Mapping[str, Any] = conn.get_execution_options()
    if options and OPTION in options:
        here = {**here, OPTION: options[OPTION]}
    for declared in schemas:
        reached, synced = translated(declared, here), translated(declared, engine)
        if reached != synced:
            raise ConfigurationError(
                f"{what}: this reaches {_shown(reached)} through a schema_translate_map set on "
                f"the connection, the session or the statement, but its engine puts "
                f"{_shown(declared)} in {_shown(synced)}; the commit's sync and the workers read "
                "rows and jobs through the engine, so they would read another schema. Set the "
                "map on the engine (engine.execution_options(schema_translate_map=...)) and bind "
                "the session to that engine."
            )


Claim = tuple[str, str | None, str, Any]
"""A declared table's name, the schema an operation reaches it in, what to call it, and for a
write where its jobs go (:func:`jobs_at`; ``None``: not a write, or untracked)."""


@dataclass(slots=True)
class _Use:
    """The first use of a key: its value, what made it (for messages), and the open
    transactions that made it (``None``: kept for good)."""

    value: Any
    what: str
    owners: set[int] | None


class _Ledger:
    """The first use of each key: kept for good, or, while only transactions that have not
    ended made it, until the last of them rolls back."""

    def __init__(self) -> None:
        self._first: dict[Any, _Use] = {}
        self._owned: dict[int, list[Any]] = {}  # an open transaction: the keys it made

    def conflict(self, key: Any, value: Any) -> _Use | None:
        """The first use of ``key``, if it was with another value."""
        use = self._first.get(key)
        return use if use is not None and use.value != value else None

    def note(self, key: Any, value: Any, what: str, owner: int | None) -> None:
        """Note a use of ``key`` (by transaction ``owner``; ``None``: for good)."""
        use = self._first.get(key)
        if use is None:
            use = self._first[key] = _Use(value, what, None if owner is None else set())
        if use.owners is None:
            return
        if owner is None:
            use.owners = None
        elif owner not in use.owners:
            use.owners.add(owner)
            self._owned.setdefault(owner, []).append(key)

    def end(self, owner: int, kept: bool) -> None:
        """Transaction ``owner`` ended: keep its uses for good (``kept``: it committed), or
        forget those no other open transaction made."""
        for key in self._owned.pop(owner, ()):
            use = self._first.get(key)
            if use is None or use.owners is None:
                continue
            if kept:
                use.owners = None
                continue
            use.owners.discard(owner)
            if not use.owners:
                del self._first[key]


_lock = RenewedLock()
_outboxes = _Ledger()
"""Per outbox (:func:`jobs_at`) and declared table, the schema its jobs came from, for the
whole process."""
_databases: weakref.WeakKeyDictionary[Engine, Any] = weakref.WeakKeyDictionary()
_UNKNOWN: Any = object()


def jobs_at(engine: Engine, outbox: Table) -> Any:
    """Which outbox ``engine`` writes jobs to: its database (as far as the URL tells) and the
    schema the outbox is translated into; ``None`` for an in-memory SQLite database (one per
    engine or connection, shared by nothing)."""
    database = _database(engine)
    if database is None:
        return None
    return (database, translated(outbox.schema, engine.get_execution_options()))


def _database(engine: Engine) -> Any:
    """Which database ``engine`` reaches, as far as its URL tells (``None``: an in-memory
    SQLite database, one per engine or connection)."""
    found = _databases.get(engine, _UNKNOWN)
    if found is _UNKNOWN:
        url = engine.url
        backend, name = url.get_backend_name(), url.database
        if backend == "sqlite":
            if not name or name == ":memory:" or name.startswith("file::memory:"):
                found = None
            else:
                found = (backend, os.path.abspath(name))
        else:
            found = (backend, url.host, url.port, name)
        _databases[engine] = found
    return found


def _conflict(first: _Use, reached: str | None, what: str, where: str) -> str:
    return (
        f"{what} is used in {_shown(reached)} here, but {where} already used {first.what} in "
        f"{_shown(first.value)} (schema_translate_map)"
    )


class SchemaClaims:
    """The schema each table reached through one index (see the module docstring)."""

    def __init__(self) -> None:
        self._tables = _Ledger()

    def claim(self, claims: Sequence[Claim], owner: object | None = None) -> None:
        """Note each table's schema, and where a write's jobs go (for the whole process): all
        of them, or none when one conflicts. A write's claims (``owner``: its transaction)
        hold while it is open and for good once it commits (:meth:`end`).

        Raises:
            ConfigurationError: This index already used a table in another schema, or that
                outbox already holds the jobs of the table in another schema.
        """
        with _lock:
            for table, reached, what, _ in claims:
                first = self._tables.conflict(table, reached)
                if first is not None:
                    raise ConfigurationError(
                        f"{_conflict(first, reached, what, 'this SemanticIndex')}: the rows of "
                        "both schemas would share its vector collection, overwriting each "
                        f"other's points and answering each other's searches. {_FIX}"
                    )
            for table, reached, what, jobs in claims:
                first = None if jobs is None else _outboxes.conflict((jobs, table), reached)
                if first is not None:
                    raise ConfigurationError(
                        f"{_conflict(first, reached, what, 'this process')}, and the jobs of both "
                        f"go to the outbox table in {_shown(jobs[1])}: each schema's sync would "
                        "take the other's jobs and look for their keys in its own rows. Put the "
                        "outbox in each schema with the table (schema_translate_map={None: "
                        "<schema>, ...}; declare the tables that stay shared with their schema), "
                        "or keep one schema and give the column tenant=..."
                    )
            key = None if owner is None else id(owner)
            for table, reached, what, jobs in claims:
                self._tables.note(table, reached, what, key)
                if jobs is not None:
                    _outboxes.note((jobs, table), reached, what, key)

    def end(self, owner: object, committed: bool) -> None:
        """The transaction ``owner`` of :meth:`claim` ended: its claims hold for good if it
        committed, else they go (unless another open transaction made them too)."""
        with _lock:
            self._tables.end(id(owner), committed)
            _outboxes.end(id(owner), committed)
