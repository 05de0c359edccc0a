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
  engine. A database is told by what it says of itself, asked once per connection pool
  (:func:`database_of`: SQLite's file, an attached schema's own; PostgreSQL's cluster
  identifier and database name), so two URLs of one database (a host name and its address,
  two drivers) are one place; in-memory SQLite databases (one per engine or connection) are not
  told apart, nor are PostgreSQL clusters cloned from one data directory (they share their
  identifier) that hold databases of one name.
* **One place per table, per outbox** (for the whole process, :meth:`SchemaClaims.claim`):
  an outbox (declared without a schema) left where it is while a table moves is fine for one
  translation (a renamed schema), but two schemas or databases of one table writing to the
  same outbox (SQLite tenants attaching their own files under one schema name, the outbox left
  in the shared main file) would have each one's worker take the other's jobs and look for
  their keys in its own rows: the second is refused.

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
"""Per outbox (:func:`jobs_at`) and declared table, where its jobs' rows are (a
:class:`Place`), for the whole process."""


def jobs_at(conn: Connection, outbox: Table) -> Any:
    """Which outbox ``conn`` writes jobs to: the database (:func:`database_of`) and schema its
    engine puts the outbox in; ``None`` for an in-memory SQLite database (one per engine or
    connection, shared by nothing)."""
    schema = translated(outbox.schema, conn.engine.get_execution_options())
    found = database_of(conn, schema)
    assert found is not None  # (asked through the connection)
    return None if found[0] is None else (found[0], schema)


@dataclass(frozen=True, slots=True)
class _Identity:
    """What a database said it is (:func:`database_of`): a key and how to name it, and for
    SQLite those of each attached schema's file."""

    main: tuple[Hashable | None, str]
    attached: Mapping[str, tuple[Hashable | None, str]]


_identities: weakref.WeakKeyDictionary[Any, _Identity] = weakref.WeakKeyDictionary()
"""Per connection pool (an engine's ``execution_options`` copies share their engine's)."""
_PG_IDENTITY = (
    "SELECT current_database(), CASE WHEN to_regprocedure('pg_control_system()') IS NULL "
    "THEN false ELSE has_function_privilege('pg_control_system()', 'EXECUTE') END"
)
_IN_MEMORY = (None, "an in-memory SQLite database")


def database_of(
    bind: Engine | Connection, schema: str | None = None
) -> tuple[Hashable | None, str] | None:
    """Which database ``bind`` reaches a table in ``schema`` (as reached, after any
    translation) in, as it says itself, and how to name it; asked once per connection pool.

    SQLite: the file of the schema (an attached database) or of ``main`` (``None``: in
    memory). PostgreSQL: the cluster's identifier and the database's name (where the role may
    not read the identifier: the URL's host, port and database). Other databases: their URL.
    ``None`` for an async engine never asked through a connection: it cannot be asked outside
    one (:func:`identified`)."""
    engine = bind.engine
    found = _identities.get(engine.pool)
    if schema is not None and engine.dialect.name == "sqlite":
        schema = schema.lower()  # (SQLite's schema names know no case)
        if found is not None and schema not in found.attached and schema != "main":
            found = None  # (attached since it was asked?)
    if found is None:
        if isinstance(bind, Connection):
            found = _ask(bind)
        elif engine.dialect.is_async:
            return None
        else:
            with engine.connect() as conn:
                found = _ask(conn)
        _identities[engine.pool] = found
    return found.main if schema is None else found.attached.get(schema, found.main)


def identified(engine: Engine) -> bool:
    """Whether :func:`database_of` already asked ``engine``'s database what it is."""
    return engine.pool in _identities


def _ask(conn: Connection) -> _Identity:
    name = conn.dialect.name
    if name == "sqlite":
        files = {row[1].lower(): row[2] for row in conn.exec_driver_sql("PRAGMA database_list")}
        found = {schema: _sqlite_file(file) for schema, file in files.items()}
        return _Identity(found.pop("main", _IN_MEMORY), found)
    url = conn.engine.url
    if name == "postgresql":
        database, readable = conn.exec_driver_sql(_PG_IDENTITY).one()
        cluster: Any = (url.host, url.port, url.database)
        if readable:
            cluster = conn.exec_driver_sql("SELECT system_identifier FROM pg_control_system()")
            cluster = cluster.scalar_one()
        server = url.host or "the local socket"
        if url.port:
            server = f"{server}:{url.port}"
        shown = f"the PostgreSQL database {database!r} on {server}"
        return _Identity(((name, cluster, database), shown), {})
    key = (url.get_backend_name(), url.host, url.port, url.database)
    return _Identity((key, f"the database {url.render_as_string(hide_password=True)}"), {})


def _sqlite_file(file: str) -> tuple[Hashable | None, str]:
    if not file:
        return _IN_MEMORY
    path = os.path.realpath(file)
    return ("sqlite", path), f"the SQLite database {path}"


def _conflict(first: _Use, used: str | None, reached: str | None, what: str, where: str) -> str:
    return (
        f"{what} is used in {_shown(reached)} here, but {where} already used {first.what} in "
        f"{_shown(used)} (schema_translate_map)"
    )


def _at(place: Place) -> str:
    return f"{_shown(place.schema)} of {place.shown}" if place.shown else _shown(place.schema)


def _refusal(first: _Use, reached: Place, what: str) -> str:
    used: Place = first.value
    where = "this SemanticIndex"
    met_database = used.database != reached.database
    if not met_database:
        met = _conflict(first, used.schema, reached.schema, what, where)
    else:  # (SQLite: an attached schema is a database of its own)
        met = f"{what} is used in {_at(reached)} here, but {where} already used {first.what}"
        met = f"{met} in {_at(used)}"
    kind, fix = ("databases", _FIX_DATABASE) if met_database else ("schemas", _FIX)
    return (
        f"{met}: the rows of both {kind} would share its vector collection, overwriting each "
        f"other's points (the same primary keys) and answering each other's searches. {fix}"
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
                first = None if jobs is None else _outboxes.conflict((jobs, table), reached)
                if first is not None:
                    used: Place = first.value
                    if used.database == reached.database:
                        met = _conflict(first, used.schema, reached.schema, what, "this process")
                    else:
                        met = (
                            f"{what} is used in {_at(reached)} here, but this process already "
                            f"used {first.what} in {_at(used)}"
                        )
                    raise ConfigurationError(
                        f"{met}, and the jobs of both go to one outbox table (in "
                        f"{_shown(jobs[1])}): each one's sync would take the other's jobs and "
                        "look for their keys in its own rows. Put the outbox in each schema "
                        "with the table (schema_translate_map={None: <schema>, ...}; declare "
                        "the tables that stay shared with their schema), or keep one schema "
                        "and give the column tenant=..."
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
