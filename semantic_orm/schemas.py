"""Where a table's rows are: which database and schema a connection reaches, and one per index.

Two ways to give each tenant its own rows meet the same hazard. **A database per tenant**: an
engine (or a session's bind) per tenant's database. **A schema per tenant**:
SQLAlchemy's ``schema_translate_map`` execution option, which renders a table declared in one
schema in another (``engine.execution_options(schema_translate_map={None: "tenant_42"})``). A
vector collection holds one column's points keyed by primary key and knows nothing of databases
or schemas, so the rows of two places written through one index would overwrite each other's
points, and each place's searches would rank the other's text. The rules, enforced where rows
are written, searched and processed:

* **The engine translates, not a connection, a session or a statement.** A commit's sync, the
  retrier and the workers read the rows and the outbox through the engine; a map set on a
  connection alone would have them read another schema (:func:`check_connection`).
* **One place per table, per index** (:class:`SchemaClaims`): an index that has written,
  searched or processed a table in one database and schema refuses another for the life of the
  index. Give each database or schema its own ``SemanticIndex`` (with its own
  ``collection_prefix``), installed on a sessionmaker bound to that database's or schema's
  engine. A database is told by what it says of itself (:func:`database_of`: SQLite's file,
  PostgreSQL's cluster identifier and database name), so two URLs of one database (a host name
  and its address, two drivers) are one place; in-memory SQLite databases (one per engine or
  connection) are not told apart.
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
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, Table

from .exc import ConfigurationError
from .forking import RenewedLock

__all__ = [
    "Claim",
    "Place",
    "SchemaClaims",
    "check_connection",
    "database_of",
    "identified",
    "jobs_at",
    "translated",
]

OPTION = "schema_translate_map"
_FIX = (
    "Give each schema its own SemanticIndex, with its own collection_prefix, installed on a "
    "sessionmaker bound to that schema's engine (engine.execution_options("
    "schema_translate_map=...))."
)
_FIX_DATABASE = (
    "Give each database its own SemanticIndex, with its own collection_prefix, installed on a "
    "sessionmaker bound to that database's engine."
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


@dataclass(frozen=True, slots=True)
class Place:
    """Where an operation reaches a table: its database (:func:`database_of`; ``None``: an
    in-memory SQLite database) and schema; ``shown`` names the database in messages."""

    database: Hashable | None
    schema: str | None
    shown: str = field(default="", compare=False)


Claim = tuple[str, Place, str, Any]
"""A declared table's name, where an operation reaches it, what to call it, and for a write
where its jobs go (:func:`jobs_at`; ``None``: not a write, or untracked)."""


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


_identities: weakref.WeakKeyDictionary[Engine, tuple[Hashable | None, str]] = (
    weakref.WeakKeyDictionary()
)
_PG_IDENTITY = (
    "SELECT current_database(), CASE WHEN to_regprocedure('pg_control_system()') IS NULL "
    "THEN false ELSE has_function_privilege('pg_control_system()', 'EXECUTE') END"
)


def database_of(bind: Engine | Connection) -> tuple[Hashable | None, str]:
    """Which database ``bind`` reaches, as it says itself (asked once per engine), and how to
    name it: SQLite's main file (``None`` for an in-memory one), PostgreSQL's cluster
    identifier (the URL's host and port where the role may not read it) and database name,
    for other databases the URL's host, port and database. An engine whose driver is async
    and that was never asked through a connection is told by its URL."""
    engine = bind.engine
    found = _identities.get(engine)
    if found is not None:
        return found
    if isinstance(bind, Connection):
        found = _ask(bind)
    elif not engine.dialect.is_async:
        with engine.connect() as conn:
            found = _ask(conn)
    else:  # (not cached: a connection may tell more later)
        return _from_url(engine)
    _identities[engine] = found
    return found


def identified(engine: Engine) -> bool:
    """Whether :func:`database_of` already asked ``engine``'s database what it is."""
    return engine in _identities


def _ask(conn: Connection) -> tuple[Hashable | None, str]:
    name = conn.dialect.name
    if name == "sqlite":
        rows = conn.exec_driver_sql("PRAGMA database_list").all()
        file = next((row[2] for row in rows if row[1] == "main"), "")
        if not file:
            return None, "an in-memory SQLite database"
        path = os.path.realpath(file)
        return (name, path), f"the SQLite database {path}"
    if name == "postgresql":
        database, readable = conn.exec_driver_sql(_PG_IDENTITY).one()
        url = conn.engine.url
        cluster: Any = (url.host, url.port)
        if readable:
            cluster = conn.exec_driver_sql("SELECT system_identifier FROM pg_control_system()")
            cluster = cluster.scalar_one()
        return (name, cluster, database), f"the PostgreSQL database {database!r}"
    return _from_url(conn.engine)


def _from_url(engine: Engine) -> tuple[Hashable | None, str]:
    url = engine.url
    key = _database(engine)
    return key, f"the database {url.render_as_string(hide_password=True)}"


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


def _conflict(first: _Use, used: str | None, reached: str | None, what: str, where: str) -> str:
    return (
        f"{what} is used in {_shown(reached)} here, but {where} already used {first.what} in "
        f"{_shown(used)} (schema_translate_map)"
    )


def _refusal(first: _Use, reached: Place, what: str) -> str:
    used: Place = first.value
    if used.database == reached.database:
        where = "this SemanticIndex"
        return (
            f"{_conflict(first, used.schema, reached.schema, what, where)}: the rows of both "
            "schemas would share its vector collection, overwriting each other's points and "
            f"answering each other's searches. {_FIX}"
        )
    return (
        f"{what} is used in {reached.shown} here, but this SemanticIndex already used "
        f"{first.what} in {used.shown}: the rows of both databases would share its vector "
        "collection, overwriting each other's points (the same primary keys) and answering "
        f"each other's searches. {_FIX_DATABASE}"
    )


class SchemaClaims:
    """The database and schema each table reached through one index (see the module
    docstring)."""

    def __init__(self) -> None:
        self._tables = _Ledger()

    def claim(self, claims: Sequence[Claim], owner: object | None = None) -> None:
        """Note where each table is, and where a write's jobs go (for the whole process): all
        of them, or none when one conflicts. A write's claims (``owner``: its transaction)
        hold while it is open and for good once it commits (:meth:`end`).

        Raises:
            ConfigurationError: This index already used a table in another database or schema,
                or that outbox already holds the jobs of the table in another schema.
        """
        with _lock:
            for table, reached, what, _ in claims:
                first = self._tables.conflict(table, reached)
                if first is not None:
                    raise ConfigurationError(_refusal(first, reached, what))
            for table, reached, what, jobs in claims:
                schema = reached.schema
                first = None if jobs is None else _outboxes.conflict((jobs, table), schema)
                if first is not None:
                    raise ConfigurationError(
                        f"{_conflict(first, first.value, schema, what, 'this process')}, and "
                        f"the jobs of both go to the outbox table in {_shown(jobs[1])}: each "
                        "schema's sync would take the other's jobs and look for their keys in "
                        "its own rows. Put the "
                        "outbox in each schema with the table (schema_translate_map={None: "
                        "<schema>, ...}; declare the tables that stay shared with their schema), "
                        "or keep one schema and give the column tenant=..."
                    )
            key = None if owner is None else id(owner)
            for table, reached, what, jobs in claims:
                self._tables.note(table, reached, what, key)
                if jobs is not None:
                    _outboxes.note((jobs, table), reached.schema, what, key)

    def end(self, owner: object, committed: bool) -> None:
        """The transaction ``owner`` of :meth:`claim` ended: its claims hold for good if it
        committed, else they go (unless another open transaction made them too)."""
        with _lock:
            self._tables.end(id(owner), committed)
            _outboxes.end(id(owner), committed)
