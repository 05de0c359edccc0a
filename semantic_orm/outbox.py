"""The transactional outbox: sync jobs written in the same transaction as the change.

When a flush (or a bulk statement) changes a ``SemanticText`` value, the session also inserts one
row into ``semantic_orm_outbox`` naming the table, the column and the row's primary key: a
:class:`JobKey`. The job commits or rolls back with the change itself, so a committed change
always has a job and a rolled-back one never does. A job carries no text: whoever processes it
reads the row's *current* committed value, so the index converges to the database whatever
order jobs run in.

Processing follows a lease protocol, so that no database transaction stays open while text is
embedded (SQLite has one writer: a long transaction would block the application):

1. **claim** (a short transaction): due jobs are leased, ``claimed_by`` a processor's token and
   ``next_attempt_at`` pushed to the end of the lease. A key (row and column) that another
   processor holds a live lease on is skipped, so two processors never sync the same row at
   once. On PostgreSQL the candidates are locked ``FOR UPDATE SKIP LOCKED`` and each key takes
   a transaction-level advisory lock (in the same query) while the leases are checked and
   written (one ``UPDATE`` that leases the jobs no live lease holds back, and returns them).
2. the processor reads the rows (a commit's own few in the claim's transaction), embeds and
   writes the vector store, outside any transaction;
3. **settle** (a short transaction): finished jobs are deleted, failed ones get their attempt
   count, last error and next retry time. A job whose lease expired and was claimed again by
   someone else is *lost*: the processor queues a fresh job for its key, since its write may
   have overtaken a newer one.

Jobs can also be born leased (:func:`enqueue` with ``claimed_by``), by the committing process
that will sync them right after the commit, which then needs no claim transaction: on SQLite
(one writer at a time), and on PostgreSQL in ``READ COMMITTED``, where the birth first takes
its rows' advisory locks, waiting for an open claim of them (whose lease it then sees) and
keeping later claims off them until its transaction ends.

Failures: every failed attempt counts in ``attempts`` (it sets the backoff); only permanent
failures count in ``failures``, and a job whose ``failures`` reach ``max_attempts`` is
dead-lettered (``dead = true``): visible in ``semantic-orm status``, re-queueable with
:func:`requeue_dead`, cleared when a later job for the same row succeeds, and never in the way
of the others. A store outage therefore never buries the queue.

The tables live in their own :data:`metadata`: the outbox and ``semantic_orm_checkpoint`` (where
long maintenance passes record how far they got). They are created on first use; to manage them
with Alembic instead, add :data:`metadata` to your ``target_metadata`` (or copy the tables with
:func:`include_in`) and pass ``create_outbox=False`` to the index.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from sqlalchemy import (
    ARRAY,
    JSON,
    BigInteger,
    Boolean,
    Column,
    Connection,
    DateTime,
    Engine,
    Float,
    Index,
    Integer,
    MetaData,
    Select,
    String,
    Table,
    Text,
    and_,
    bindparam,
    case,
    cast,
    delete,
    func,
    insert,
    literal,
    literal_column,
    null,
    select,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from .schemas import translated

__all__ = [
    "CHECKPOINT_TABLE",
    "OUTBOX_TABLE",
    "Job",
    "JobKey",
    "as_utc",
    "checkpoint",
    "claim",
    "counts",
    "dead_letter",
    "enqueue",
    "errors",
    "exists",
    "expedite",
    "include_in",
    "metadata",
    "outbox",
    "pending",
    "requeue_dead",
    "settle_done",
    "settle_failed",
]

OUTBOX_TABLE = "semantic_orm_outbox"
CHECKPOINT_TABLE = "semantic_orm_checkpoint"
BATCH = 500
"""Ids or keys per ``IN`` list: well under SQLite's expression limits on every version."""

metadata = MetaData()

outbox = Table(
    OUTBOX_TABLE,
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("table_name", String(255), nullable=False),
    Column("column_name", String(255), nullable=False),
    Column("row_pk", Text, nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    Column("failures", Integer, nullable=False, default=0, server_default="0"),
    Column("last_error", Text, nullable=True),
    Column("dead", Boolean, nullable=False, default=False),
    Column("next_attempt_at", DateTime(timezone=True), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("claimed_by", String(64), nullable=True),
    Index("ix_semantic_orm_outbox_due", "dead", "next_attempt_at"),
    Index("ix_semantic_orm_outbox_row", "table_name", "column_name", "row_pk"),
)

checkpoints = Table(
    CHECKPOINT_TABLE,
    metadata,
    Column("name", String(255), primary_key=True),
    Column("value", Text, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

_UPGRADE_COLUMNS = {
    "failures": "INTEGER NOT NULL DEFAULT 0",
    "claimed_by": "VARCHAR(64)",
}
"""Columns added after the first release, with the DDL that adds them to an older table."""


def include_in(target: MetaData) -> Table:
    """Copy the outbox table into your ``MetaData`` (for Alembic autogenerate).

    The checkpoint table is copied too; the outbox table is returned.
    """
    checkpoints.to_metadata(target)
    return outbox.to_metadata(target)


def create_tables(conn: Connection) -> None:
    """Create the outbox and checkpoint tables if missing; add columns an older outbox lacks.

    In the schema ``conn``'s ``schema_translate_map`` puts them in, if any."""
    from sqlalchemy import inspect

    metadata.create_all(conn, checkfirst=True)
    schema = translated(outbox.schema, conn.get_execution_options())
    have = {c["name"] for c in inspect(conn).get_columns(OUTBOX_TABLE, schema=schema)}
    quote = conn.dialect.identifier_preparer
    where = quote.quote(OUTBOX_TABLE)
    if schema is not None:
        where = f"{quote.quote_schema(schema)}.{where}"
    for name, ddl in _UPGRADE_COLUMNS.items():
        if name not in have:
            conn.exec_driver_sql(f"ALTER TABLE {where} ADD COLUMN {name} {ddl}")


def exists(bind: Engine | Connection) -> bool:
    """Whether ``bind``'s database has the outbox table (where its ``schema_translate_map``
    puts it, if any: the inspector itself does not translate)."""
    from sqlalchemy import inspect

    schema = translated(outbox.schema, bind.get_execution_options())
    return inspect(bind).has_table(OUTBOX_TABLE, schema=schema)


def current(conn: Connection) -> bool:
    """Whether ``conn``'s database has the outbox and checkpoint tables, the outbox with every
    column (:func:`create_tables` has nothing to do)."""
    from sqlalchemy import inspect

    schema = translated(outbox.schema, conn.get_execution_options())
    found = inspect(conn)
    if not found.has_table(OUTBOX_TABLE, schema=schema):
        return False
    have = {c["name"] for c in found.get_columns(OUTBOX_TABLE, schema=schema)}
    return have >= set(outbox.c.keys()) and found.has_table(checkpoints.name, schema=schema)


def utcnow() -> dt.datetime:
    """Timezone-aware now (UTC)."""
    return dt.datetime.now(dt.UTC)


def as_utc(value: dt.datetime) -> dt.datetime:
    """A time read from the outbox, timezone-aware (SQLite gives it back naive, in UTC)."""
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


def _alive(table: Any = outbox) -> ColumnElement[bool]:
    """Not dead-lettered (a job of ``table``: the outbox or an alias of it), for statements
    that find jobs by row or by id.

    The due-time index starts with the dead flag, and SQLite's planner (no statistics) takes
    any equality on it as a reason to walk that index, through every pending job (a retry
    backlog of 100,000 made each commit's lookups 60x slower); behind ``coalesce`` the flag
    is no index key, so the row index or the primary key is used.
    """
    return func.coalesce(table.c.dead, False).is_(False)


class JobKey(NamedTuple):
    """What a job syncs: one row's value of one semantic column."""

    table: str
    """The table's name (``schema.table`` when it has a schema)."""
    column: str
    """The column's name in the database."""
    pk: str
    """The row's key (:func:`semantic_orm.mapping.row_key`)."""


@dataclass(frozen=True, slots=True)
class Job:
    """One outbox row, as claimed (or as written by :func:`enqueue`)."""

    id: int
    key: JobKey
    attempts: int = 0
    failures: int = 0
    claimed_by: str | None = None
    alone: bool = False
    """Its row had no other job when it was born leased (:func:`enqueue`; a key given twice
    in one call may say so of both) or no older one when it was claimed (:func:`claim`): it
    supersedes none, so settling it looks for none. Sound where ids only grow while the job
    lives; elsewhere (a PostgreSQL transaction that took a smaller id commits later) that
    older job is left to be synced once more, never lost."""
    lease_end: float | None = None
    """When its birth lease ends at the latest (``time.monotonic()``; born leased by
    :func:`enqueue`)."""

    def holds(self, margin: float = 0.0) -> bool:
        """Whether its birth lease still holds ``margin`` seconds from now."""
        return self.lease_end is not None and self.lease_end > time.monotonic() + margin


_COLUMNS = (
    outbox.c.id,
    outbox.c.table_name,
    outbox.c.column_name,
    outbox.c.row_pk,
    outbox.c.attempts,
    outbox.c.failures,
)


def _job(row: Sequence[Any]) -> Job:
    return Job(int(row[0]), JobKey(row[1], row[2], row[3]), int(row[4]), int(row[5] or 0))


def _chunks(items: Sequence[Any], size: int = BATCH) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _parts(items: Sequence[Any], form: str | None) -> Iterator[Sequence[Any]]:
    """``items`` in lists of :data:`BATCH` for an expanding list, whole in one JSON array."""
    return _chunks(items, BATCH if form is None else max(len(items), 1))


# The statements every commit runs, built once: constructing a statement costs more than
# running it on SQLite (a commit of one row ran six of them). Keys and ids go in one list
# parameter, so the compiled form is cached too: one JSON array that a table function of the
# database reads (SQLite 3.38+ and PostgreSQL: binding each of fifty values through SQLAlchemy
# cost more than the statement), or elsewhere an expanding list (a placeholder per value).
# Each statement below is built in every form (:func:`_forms`), chosen by :func:`_list_form`.
_JSON_FORMS = ("sqlite", "postgresql")


def _list_form(conn: Connection, texts: Iterable[str] = ()) -> str | None:
    """How ``conn``'s database takes a list parameter: the dialect's name where a JSON array
    is read by a table function (``json_each`` is built into SQLite since 3.38), else
    ``None`` (an expanding list). ``texts``: the strings the list will carry; one holding a
    NUL character goes in an expanding list (``json_each`` ends a string there)."""
    dialect = conn.dialect
    if dialect.name == "sqlite" and tuple(dialect.server_version_info or ()) < (3, 38):
        return None
    if dialect.name not in _JSON_FORMS or any("\x00" in text for text in texts):
        return None
    return dialect.name


def _json_values(name: str, form: str) -> Any:
    """The values of the JSON array parameter ``name`` (a string), as rows of one column,
    ``value`` (text, or a number on SQLite)."""
    array = bindparam(name, type_=Text)
    if form == "postgresql":
        return func.json_array_elements_text(cast(array, JSON)).table_valued("value")
    return func.json_each(array).table_valued("value")


def _one_of(column: ColumnElement[Any], name: str, form: str | None) -> ColumnElement[bool]:
    """``column IN`` the list parameter ``name`` (see :func:`_list_param`)."""
    if form is None:
        return column.in_(bindparam(name, expanding=True))
    return column.in_(select(cast(_json_values(name, form).c.value, column.type)))


def _list_param(values: Iterable[Any], form: str | None) -> Any:
    """The value of a list parameter of :func:`_one_of`."""
    return list(values) if form is None else json.dumps(list(values), ensure_ascii=False)


def _forms(build: Callable[[str | None], Any]) -> dict[str | None, Any]:
    """A statement in every list form, by :func:`_list_form`."""
    return {form: build(form) for form in (None, *_JSON_FORMS)}


def _of_rows_where(form: str | None, table: Any = outbox) -> tuple[ColumnElement[bool], ...]:
    """Conditions for the jobs of ``table`` (the outbox or an alias of it) of the rows named
    by the parameters ``table`` and ``column`` and the list parameter ``pks``."""
    return (
        table.c.table_name == bindparam("table"),
        table.c.column_name == bindparam("column"),
        _one_of(table.c.row_pk, "pks", form),
    )


def _live_lease(table: Any = outbox) -> ColumnElement[bool]:
    """A job of ``table`` (the outbox or an alias of it) that a processor holds until after
    the ``now`` parameter."""
    return and_(
        table.c.claimed_by.is_not(None),
        table.c.next_attempt_at > bindparam("now", type_=outbox.c.next_attempt_at.type),
        _alive(table),
    )


_LIVE_LEASE = _live_lease()


def _holding(form: str | None, table: Any = outbox) -> ColumnElement[bool]:
    """A job of ``table`` (the outbox or an alias of it) holding its row for a new job born
    leased to the ``token`` parameter: a live lease, unless it is one of the jobs of that
    token in the list parameter ``ours`` (see :func:`enqueue`)."""
    return and_(
        _live_lease(table),
        ~and_(
            _one_of(table.c.id, "ours", form),
            table.c.claimed_by == bindparam("token", type_=outbox.c.claimed_by.type),
        ),
    )


_LEASED = _forms(
    lambda f: select(outbox.c.id, outbox.c.row_pk).where(*_of_rows_where(f), _LIVE_LEASE)
)
# the rows that have jobs, each with whether one holds it for a birth (see _holding)
_WITH_JOBS = _forms(
    lambda f: (
        select(outbox.c.row_pk, func.max(case((_holding(f), 1), else_=0)))
        .where(*_of_rows_where(f))
        .group_by(outbox.c.row_pk)
    )
)
_SUPERSEDED = _forms(
    lambda f: select(outbox.c.id, outbox.c.row_pk, outbox.c.claimed_by, outbox.c.dead).where(
        *_of_rows_where(f),
        outbox.c.dead.is_(True)
        | outbox.c.claimed_by.is_(None)
        | (outbox.c.next_attempt_at <= bindparam("now")),
    )
)
_DELETE = _forms(lambda f: delete(outbox).where(_one_of(outbox.c.id, "ids", f)))
_DELETE_MINE = _forms(
    lambda f: (
        delete(outbox)
        .where(_one_of(outbox.c.id, "ids", f), outbox.c.claimed_by == bindparam("token"))
        .returning(outbox.c.id)
    )
)
# the new ids come back with their keys, so the rows need no order: one statement for a batch
# (ordered RETURNING makes SQLAlchemy insert row by row on SQLite)
_INSERT = insert(outbox).returning(
    outbox.c.id, outbox.c.table_name, outbox.c.column_name, outbox.c.row_pk
)
_FRESH = {"attempts": 0, "failures": 0, "dead": False}
"""What a new job starts with, besides its key, its due time, its creation time and owner."""
_NEW_JOB = [
    "table_name",
    "column_name",
    "row_pk",
    *_FRESH,
    "next_attempt_at",
    "created_at",
    "claimed_by",
]
"""The columns an insert of new jobs from a list of keys fills (see :func:`_new_jobs`)."""


def _new_jobs(pk: Any, due: Any, owner: Any) -> Select[Any]:
    """The values of :data:`_NEW_JOB` for new jobs of the rows ``pk`` of the parameters
    ``table`` and ``column``, born at the parameter ``now``, due at ``due``, owned by
    ``owner`` (a ``SELECT`` its caller gives a ``FROM``)."""
    return select(
        bindparam("table", type_=outbox.c.table_name.type),
        bindparam("column", type_=outbox.c.column_name.type),
        pk,
        *(literal(value, outbox.c[name].type) for name, value in _FRESH.items()),
        due,
        bindparam("now", type_=outbox.c.created_at.type),
        owner,
    )


# a batch of jobs of one column from one JSON array of keys (see _insert_each)
_INSERT_EACH = {
    form: insert(outbox)
    .from_select(
        _NEW_JOB,
        _new_jobs(
            cast(_json_values("pks", form).c.value, Text),
            bindparam("due", type_=outbox.c.next_attempt_at.type),
            bindparam("token", type_=outbox.c.claimed_by.type),
        ),
    )
    .returning(outbox.c.id, outbox.c.row_pk)
    for form in _JSON_FORMS
}


def enqueue(
    conn: Connection,
    keys: Iterable[JobKey | tuple[str, str, str]],
    *,
    claimed_by: str | None = None,
    lease: float = 0.0,
    hold: float = 0.0,
    ours: Sequence[int] = (),
    returning: bool = True,
    now: dt.datetime | None = None,
) -> list[Job]:
    """Insert one job per key on ``conn`` (in its transaction); return the jobs.

    One statement per column (born leased: the insert looks at the rows' leases too; on
    PostgreSQL after one that takes the rows' locks) or, elsewhere, per column and lease state,
    the keys as one JSON array where the database reads one (:func:`_list_form`); elsewhere
    batches of nine parameters a job.

    Args:
        conn: The connection whose transaction the jobs belong to.
        keys: What to sync.
        claimed_by: Give the jobs to this processor token at birth (leased for ``lease``
            seconds), for a process that syncs them right after its commit. Keys another
            processor holds a live lease on are born unclaimed instead. Only where no
            concurrent transaction can lease a row's job unseen: SQLite (one writer at a
            time), and PostgreSQL in a ``READ COMMITTED`` transaction (the default), where the
            rows' advisory locks are taken first, for a bounded number of rows (see
            :func:`_birth_locks`); where that is refused the jobs are born unclaimed, held
            for ``hold``.
        lease: Seconds the birth lease lasts.
        hold: Seconds before unclaimed jobs are due for workers: the committing process claims
            them by id meanwhile (:func:`claim` with ``ids``), a worker only if it does not.
        ours: Jobs leased to ``claimed_by`` that hold no row back from these: the finished
            ones it has not deleted yet, and those its transaction wrote already (synced in
            the same pass).
        returning: Return the jobs (``False``: nothing; where the keys go as one JSON array
            their ids come back anyway, elsewhere the insert skips ``RETURNING``).
        now: The current time (tests).
    """
    rows = [JobKey(table, column, str(pk)) for table, column, pk in keys]  # pks as stored
    if not rows:
        return []
    lease_end = time.monotonic() + lease  # (taken before the locks: the lease counts from now)
    now = now or utcnow()
    if claimed_by and conn.dialect.name == "postgresql" and not _birth_locks(conn, rows):
        claimed_by = None  # an older snapshot: the commit's process claims them by id
    form = _list_form(conn, (key.pk for key in rows))
    if claimed_by and form is not None:  # the leases looked at by the insert itself
        until = now + _seconds(lease)
        born = _insert_born(conn, form, rows, claimed_by, until, now, ours, lease_end)
        return born if returning else []
    busy, present = (
        _row_jobs(conn, rows, now=now, token=claimed_by, ours=ours)
        if claimed_by
        else (set(), set())
    )
    free_at = now + _seconds(lease if claimed_by else hold)
    values = [  # a key behind a live lease: unclaimed and due at once, for whoever holds it next
        _values(key, now, now, None) if key in busy else _values(key, free_at, now, claimed_by)
        for key in rows
    ]
    if form is not None:
        made = _insert_each(conn, form, values)
    elif returning:
        made = _insert_many(conn, values)
    else:
        conn.execute(insert(outbox), values)
    if not returning:
        return []
    return [
        Job(
            i,
            key,
            claimed_by=value["claimed_by"],
            alone=bool(claimed_by) and key not in present,
            lease_end=lease_end if value["claimed_by"] else None,
        )
        for i, key, value in zip(_in_order(made, rows), rows, values, strict=True)
    ]


def _in_order(made: dict[JobKey, list[Any]], keys: Sequence[JobKey]) -> list[Any]:
    """What ``made`` holds for each of ``keys`` (lists sorted by new id), in the order given: a
    key given twice gets its first id first."""
    for each in made.values():
        each.sort(reverse=True)
    return [made[key].pop() for key in keys]


def _insert_born(
    conn: Connection,
    form: str,
    keys: Sequence[JobKey],
    token: str,
    until: dt.datetime,
    now: dt.datetime,
    ours: Sequence[int],
    lease_end: float,
) -> list[Job]:
    """Insert the jobs of ``keys`` leased to ``token`` until ``until``, each but those of rows
    another job holds a live lease on (born unclaimed and due at once, for whoever holds the
    row next); one statement per column, which looks at the leases too."""
    made: dict[JobKey, list[tuple[int, str | None, bool]]] = {}
    for (table, column), pks in _key_groups(keys).items():
        params = {
            "table": table,
            "column": column,
            "pks": _list_param(pks, form),
            "ours": _list_param(ours, form),
            "token": token,
            "until": until,
            "now": now,
        }
        for i, pk, owner, present in conn.execute(_born_statement(form), params):
            made.setdefault(JobKey(table, column, pk), []).append((int(i), owner, bool(present)))
    return [
        Job(
            i,
            key,
            claimed_by=owner,
            alone=owner is not None and not present,
            lease_end=lease_end if owner is not None else None,
        )
        for key, (i, owner, present) in zip(keys, _in_order(made, keys), strict=True)
    ]


def _values(key: JobKey, due: dt.datetime, now: dt.datetime, owner: str | None) -> dict[str, Any]:
    """One new job's column values."""
    return {
        "table_name": key.table,
        "column_name": key.column,
        "row_pk": key.pk,
        **_FRESH,
        "next_attempt_at": due,
        "created_at": now,
        "claimed_by": owner,
    }


def _insert_many(conn: Connection, values: Sequence[dict[str, Any]]) -> dict[JobKey, list[int]]:
    """Insert the jobs ``values`` (:func:`_values`), nine parameters each; the new ids of each
    key."""
    made: dict[JobKey, list[int]] = {}
    for start in range(0, len(values), 1000):
        for i, table, column, pk in conn.execute(_INSERT, values[start : start + 1000]):
            made.setdefault(JobKey(table, column, pk), []).append(int(i))
    return made


def _insert_each(
    conn: Connection, form: str, values: Sequence[dict[str, Any]]
) -> dict[JobKey, list[int]]:
    """Insert the jobs ``values`` (:func:`_values`), one statement per column and lease state
    with the keys as one JSON array (binding nine values a job through SQLAlchemy cost more
    than the insert); the new ids of each key."""
    shared = ("table_name", "column_name", "next_attempt_at", "created_at", "claimed_by")
    groups: dict[tuple[Any, ...], list[str]] = {}
    for value in values:
        groups.setdefault(tuple(value[name] for name in shared), []).append(value["row_pk"])
    made: dict[JobKey, list[int]] = {}
    for (table, column, due, now, token), pks in groups.items():
        params = {
            "table": table,
            "column": column,
            "pks": _list_param(pks, form),
            "due": due,
            "now": now,
            "token": token,
        }
        for i, pk in conn.execute(_INSERT_EACH[form], params):
            made.setdefault(JobKey(table, column, pk), []).append(int(i))
    return made


def _seconds(value: float) -> dt.timedelta:
    return dt.timedelta(seconds=value)


def _key_groups(keys: Iterable[JobKey]) -> dict[tuple[str, str], list[str]]:
    groups: dict[tuple[str, str], list[str]] = {}
    for key in keys:
        groups.setdefault((key.table, key.column), []).append(key.pk)
    return groups


def _of_rows(
    conn: Connection,
    statement: dict[str | None, Select[Any]],
    keys: Iterable[JobKey],
    now: dt.datetime,
    lists: Mapping[str, Sequence[Any]] | None = None,
    **values: Any,
) -> Iterator[tuple[str, str, Any]]:
    """``statement``'s rows for the jobs of ``keys``, each with its table and column (and the
    statement's other parameters: list parameters ``lists``, plain ``values``)."""
    for form, params in _by_rows(conn, set(keys)):
        params.update(values, now=now)
        params.update((name, _list_param(v, form)) for name, v in (lists or {}).items())
        rows = conn.execute(statement[form], params).all()  # no cursor left open
        for row in rows:
            yield params["table"], params["column"], row


def _by_rows(
    conn: Connection, keys: Iterable[JobKey]
) -> Iterator[tuple[str | None, dict[str, Any]]]:
    """For each table and column of ``keys``, and each list of their row keys: the list form
    and the parameters ``table``, ``column`` and ``pks`` (:func:`_of_rows_where`)."""
    for (table, column), pks in _key_groups(keys).items():
        form = _list_form(conn, pks)
        for part in _parts(pks, form):
            yield form, {"table": table, "column": column, "pks": _list_param(part, form)}


def _leased_keys(
    conn: Connection,
    keys: Iterable[JobKey],
    *,
    now: dt.datetime,
    besides: Set[int] = frozenset(),
) -> set[JobKey]:
    """Keys with a live lease on one of their jobs (other than the jobs ``besides``).

    Any processor's lease counts, this process's too: two passes never sync one row at once.
    """
    return {
        JobKey(table, column, pk)
        for table, column, (i, pk) in _of_rows(conn, _LEASED, keys, now)
        if i not in besides
    }


@functools.cache
def _born_statement(form: str) -> Any:
    """The insert of :func:`_insert_born` for a JSON list form: each key's job leased to the
    ``token`` parameter unless a live lease holds its row (see :func:`_holding`); it returns
    each job's id, key, owner and whether its row had another job (:attr:`Job.alone`)."""
    keys = _json_values("pks", form)
    pk = cast(keys.c.value, Text)
    other = outbox.alias("held")
    # the keys' rows held by a live lease, found from the keys through the row index (as a
    # correlated EXISTS, PostgreSQL hashed every job of the column once instead)
    held = pk.in_(select(other.c.row_pk).where(*_of_rows_where(form, other), _holding(form, other)))
    looked = select(pk.label("pk"), held.label("held")).select_from(keys).subquery("looked")
    now = bindparam("now", type_=outbox.c.created_at.type)
    until = bindparam("until", type_=outbox.c.next_attempt_at.type)
    token = bindparam("token", type_=outbox.c.claimed_by.type)
    jobs = _new_jobs(
        looked.c.pk,
        case((looked.c.held, now), else_=until),
        case((looked.c.held, null()), else_=token),
    )
    # whether the row had another job: in RETURNING, where no dialect correlates a subquery
    # (SQLite names the returned columns bare), so the inserted row is named in full; and
    # cast, or SQLite's planner takes no value of the inserted row for an index key and reads
    # every job of the column for each new one (900 ms for 50 beside 50,000 pending). (A
    # leading WITH, read before the insert, is no DML to Python's sqlite3, which then opens no
    # transaction for it: the jobs were committed on their own.)
    other = outbox.alias("present")
    inserted = functools.partial(literal_column, type_=Text)
    present = (
        select(literal(1))
        .select_from(other)
        .where(
            *(
                inserted(f"present.{name}") == cast(inserted(f"{outbox.name}.{name}"), Text)
                for name in ("table_name", "column_name", "row_pk")
            ),
            inserted("present.id") != inserted(f"{outbox.name}.id"),
        )
        .exists()
    )
    return (
        insert(outbox)
        .from_select(_NEW_JOB, jobs)
        .returning(outbox.c.id, outbox.c.row_pk, outbox.c.claimed_by, present.label("present"))
    )


_KEY_SEP = literal("\x1f", Text)
"""Between the table, the column and the key in the name of a row's advisory lock (the name
every version of the library hashes: processes of two versions exclude each other)."""


def _birth_locks_query() -> Select[Any]:
    keys = func.unnest(bindparam("pks", type_=ARRAY(Text))).table_valued("value").render_derived()
    row = bindparam("table", type_=Text) + _KEY_SEP + bindparam("column", type_=Text) + _KEY_SEP
    lock = func.pg_advisory_xact_lock(func.hashtextextended(row + keys.c.value, 0))
    reads_committed = func.current_setting("transaction_isolation").in_(_READS_COMMITTED)
    budget = cast(func.current_setting("max_locks_per_transaction"), Integer)
    within = bindparam("locked", type_=Integer) <= budget * bindparam(
        "share", callable_=lambda: BIRTH_LOCKS, type_=Float
    )
    return select(lock).select_from(keys).where(reads_committed, within).order_by(keys.c.value)


_READS_COMMITTED = ("read committed", "read uncommitted")
"""PostgreSQL's isolation levels whose statements see what committed before they started."""
BIRTH_LOCKS = 1.0
"""Most rows a PostgreSQL transaction's jobs are born leased for, as a share of the server's
``max_locks_per_transaction`` (64 by default): each holds an advisory lock until the
transaction ends, in the shared lock table every session draws from, which the server sizes
for that many locks a session. A bulk write's jobs are born unclaimed and claimed after the
commit."""
_BIRTH_LOCKS = _birth_locks_query()
_BIRTHS = "semantic_orm.births"
"""Where a connection's ``info`` keeps its transaction's birth locks: the transaction (a weak
reference) and how many rows it locked (``-1``: births refused for the rest of it)."""


def _birth_locks(conn: Connection, keys: Sequence[JobKey]) -> bool:
    """PostgreSQL: whether the jobs of ``keys`` can be born leased in ``conn``'s transaction,
    having taken the advisory lock of each of their rows (the one a claim tries, see
    :func:`_claimed`) until the transaction ends, in a fixed order.

    Only in a transaction in ``READ COMMITTED``, where a look at the rows' leases made after the
    locks sees every lease (a claim's lease commits before it releases its lock; a claim that
    comes later skips the rows: it only tries the lock); not in one that reads an older
    snapshot (``REPEATABLE READ``, ``SERIALIZABLE``) or none at all (``AUTOCOMMIT``: each lock
    would end with its statement), nor past :data:`BIRTH_LOCKS` (no lock is taken then), nor
    before PostgreSQL 11 (no ``hashtextextended``). Once refused, a transaction's later jobs
    are born unclaimed too."""
    transaction = conn.get_transaction()
    if (
        transaction is None
        or getattr(conn.connection.dbapi_connection, "autocommit", False)
        or (conn.dialect.server_version_info or (11,)) < (11,)
    ):
        return False
    held = conn.info.get(_BIRTHS)
    if held is None or held[0]() is not transaction:
        held = (weakref.ref(transaction), 0)
    count = held[1] + len(keys)  # the rows locked once these are
    refused = held[1] < 0
    for (table, column), pks in sorted(_key_groups(keys).items()):
        if refused:
            break
        params = {"table": table, "column": column, "pks": pks, "locked": count}
        refused = len(conn.execute(_BIRTH_LOCKS, params).all()) < len(pks)
    conn.info[_BIRTHS] = (held[0], -1 if refused else count)  # refused: from now on
    return not refused


def _row_jobs(
    conn: Connection,
    keys: Iterable[JobKey],
    *,
    now: dt.datetime,
    token: str,
    ours: Sequence[int] = (),
) -> tuple[set[JobKey], set[JobKey]]:
    """The keys with a live lease on one of their jobs (as :func:`_leased_keys`, not counting
    the jobs ``ours`` of ``token``), and the keys with any job at all, in one statement."""
    busy: set[JobKey] = set()
    present: set[JobKey] = set()
    lists = {"ours": ours}
    for table, column, (pk, leased) in _of_rows(conn, _WITH_JOBS, keys, now, lists, token=token):
        key = JobKey(table, column, pk)
        present.add(key)
        if leased:
            busy.add(key)
    return busy, present


def claim(
    conn: Connection,
    *,
    token: str,
    lease: float,
    limit: int,
    ids: Sequence[int] | None = None,
    now: dt.datetime | None = None,
) -> list[Job]:
    """Lease up to ``limit`` due jobs, earliest due first (or the claimable ones among
    ``ids``, oldest first).

    Run it in its own short transaction: the leases become visible to other processors when it
    commits. Among ``ids``, unclaimed jobs are claimable before they are due (a commit's own
    jobs, held back from workers for a moment so that the committing process syncs them).

    Args:
        conn: A connection in a transaction (``BEGIN IMMEDIATE`` on SQLite is best).
        token: This processor's identity, written to ``claimed_by``.
        lease: Seconds the processor may take before its jobs are due again for others.
        limit: Most jobs to claim.
        ids: Claim only among these jobs (e.g. those a commit just wrote).
        now: The current time (tests).
    """
    now = now or utcnow()
    postgres = conn.dialect.name == "postgresql"
    form = _list_form(conn)
    query = _claimed(form if ids is not None else None, postgres, ids is not None)
    rows: list[Any] = []
    if ids is None:
        rows = list(conn.execute(query, {"now": now, "limit": limit}))
    else:
        for part in _parts(list(ids), form):
            params = {"now": now, "limit": limit, "ids": _list_param(part, form)}
            rows += conn.execute(query, params)
        rows = rows[:limit]
    if not rows:
        return []
    # each row came with whether its row has an older job (its settle then looks for it) and,
    # on PostgreSQL, whether this transaction got the row's advisory lock
    found = [replace(_job(row), alone=not row.older) for row in rows]
    free = [job for job, row in zip(found, rows, strict=True) if not postgres or row.got]
    until = now + _seconds(lease)
    if not conn.dialect.update_returning or (form is None and len(found) > BATCH):
        # look, then lease (SQLite before 3.35; or too many ids for one list of parameters)
        keys = {job.key for job in free}
        keys -= _leased_keys(conn, keys, now=now, besides={job.id for job in found})
        jobs = [job for job in free if job.key in keys]
        for part in _parts([job.id for job in jobs], form):
            params = {"ids": _list_param(part, form), "token": token, "until": until}
            conn.execute(_LEASE[form], params)
        return jobs
    # lease the jobs whose rows no other job holds a live lease on, in the same statement
    leased: set[int] = set()
    besides = _list_param([job.id for job in found], form)
    for part in _parts([job.id for job in free], form):
        params = {
            "ids": _list_param(part, form),
            "besides": besides,
            "now": now,
            "token": token,
            "until": until,
        }
        leased.update(int(i) for i in conn.execute(_LEASE_FREE[form], params).scalars())
    return [job for job in free if job.id in leased]


@functools.cache
def _claimed(form: str | None, postgres: bool, by_ids: bool) -> Select[Any]:
    """The query of :func:`claim`, built once for each shape (see :func:`_forms`): up to
    ``limit`` due jobs earliest due first, or the claimable ones among the list ``ids``, these
    each with whether its row has an older job (:attr:`Job.alone`; due jobs say they may:
    asked of every due job a backlog holds, before its ``LIMIT``, it would cost a lookup
    each). Due jobs are taken in the order of the due-time index, which then ends the read at
    ``limit`` (in id order, SQLite sorted every due job of a backlog first, and PostgreSQL
    walked the ids past every job not due yet: 13 and 22 ms a pass at 50,000 jobs). On
    PostgreSQL the rows are locked (skipping those another transaction holds) and each comes
    with whether this transaction got the advisory lock of its row (a try: it never waits),
    ``got``: two claimers never take one row's jobs at once."""
    due: ColumnElement[bool] = outbox.c.next_attempt_at <= bindparam(
        "now", type_=outbox.c.next_attempt_at.type
    )
    alive: ColumnElement[bool] = outbox.c.dead.is_(False)  # due jobs: by the due-time index
    older: ColumnElement[Any] = literal(True)
    order = outbox.c.next_attempt_at
    if by_ids:
        due = due | outbox.c.claimed_by.is_(None)
        alive = _alive()  # found by id
        older = _of_its_row("earlier", lambda earlier: [earlier.c.id < outbox.c.id])
        order = outbox.c.id
    statement = (
        select(*_COLUMNS, older.label("older"))
        .where(alive, due)
        .order_by(order)
        .limit(bindparam("limit", type_=Integer))
    )
    if by_ids:
        statement = statement.where(_one_of(outbox.c.id, "ids", form))
    if not postgres:
        return statement
    found = statement.with_for_update(skip_locked=True).cte("found")
    row = found.c.table_name + _KEY_SEP + found.c.column_name + _KEY_SEP + found.c.row_pk
    got = func.pg_try_advisory_xact_lock(func.hashtextextended(row, 0))
    return select(*found.c, got.label("got")).order_by(found.c.id)


def _of_its_row(name: str, where: Callable[[Any], list[ColumnElement[bool]]]) -> Any:
    """Whether the row of the outbox row at hand has a job (the outbox aliased ``name``) for
    which the conditions ``where(alias)`` hold: ``EXISTS``, found through the row index."""
    other = outbox.alias(name)
    return (
        select(literal(1))
        .where(
            other.c.table_name == outbox.c.table_name,
            other.c.column_name == outbox.c.column_name,
            other.c.row_pk == outbox.c.row_pk,
            *where(other),
        )
        .exists()
    )


def _lease_free(form: str | None) -> Any:
    """Lease the jobs ``ids`` whose row has no other live lease than the jobs ``besides``;
    returns the ids leased (a look and the lease in one statement)."""
    held = _of_its_row(
        "other",
        lambda other: [_live_lease(other), ~_one_of(other.c.id, "besides", form)],
    )
    return _LEASE[form].where(~held).returning(outbox.c.id)


_LEASE = _forms(
    lambda f: (
        update(outbox)
        .where(_one_of(outbox.c.id, "ids", f))
        .values(
            claimed_by=bindparam("token", type_=outbox.c.claimed_by.type),
            next_attempt_at=bindparam("until", type_=outbox.c.next_attempt_at.type),
        )
    )
)
"""Lease the jobs ``ids`` (``token``, until ``until``)."""
_LEASE_FREE = _forms(_lease_free)


def settle_done(
    conn: Connection, jobs: Sequence[Job], *, token: str, watch: float = 0.0
) -> list[JobKey]:
    """Delete finished jobs still leased to ``token``, and the older (or dead) jobs of their
    rows that they supersede.

    Args:
        conn: The connection, in the transaction that settles.
        jobs: The finished jobs.
        token: This processor's token.
        watch: Seconds after which a row is synced once more where a superseded job was
            leased (its lease ran out): the processor holding it may still write its older
            read of the row, and its own settle, which would queue the row again, never runs
            if it dies first (``0``: no such job).

    Returns:
        The keys of jobs whose lease was lost (expired and claimed by another processor, or
        already settled by it). The caller should queue them again: its write may have
        overtaken a newer one.
    """
    ids = [job.id for job in jobs]
    now = utcnow()
    # older jobs of the same rows are superseded: the value synced was read after they committed
    # (jobs of one row are numbered in commit order), unless another processor holds them now.
    # Found through the row index, so the cost follows these rows, never the whole backlog.
    latest: dict[JobKey, int] = {}
    for job in jobs:
        latest[job.key] = max(job.id, latest.get(job.key, job.id))
    rows = dict.fromkeys(job.key for job in jobs if not job.alone)  # alone: supersedes none
    older: list[int] = []
    watched: dict[JobKey, None] = {}
    claimed = set(ids)
    for table, column, (i, pk, holder, dead) in _of_rows(conn, _SUPERSEDED, rows, now):
        key = JobKey(table, column, str(pk))
        if int(i) < latest[key] and int(i) not in claimed:
            older.append(int(i))
            if holder is not None and not dead and watch > 0:
                watched[key] = None
    form = _list_form(conn)
    for part in _parts(older, form):
        conn.execute(_DELETE[form], {"ids": _list_param(part, form)})
    gone: set[int] = set()
    for part in _parts(ids, form):
        params = {"ids": _list_param(part, form), "token": token}
        gone.update(int(i) for i in conn.execute(_DELETE_MINE[form], params).scalars())
    if watched:
        enqueue(conn, list(watched), hold=watch, returning=False)
    return sorted({job.key for job in jobs if job.id not in gone})


def settle_failed(
    conn: Connection,
    jobs: Sequence[Job],
    error: BaseException,
    *,
    token: str,
    permanent: bool,
    retry_in: float,
    max_failures: int,
) -> int:
    """Record a failed attempt of ``jobs``; returns how many were dead-lettered.

    Every attempt counts in ``attempts`` (the backoff); a permanent failure also counts in
    ``failures``, and a job whose failures reach ``max_failures`` is dead-lettered.
    """
    message = f"{type(error).__name__}: {error}"[:2000]
    form = _list_form(conn)
    values = {
        "token": token,
        "failed": 1 if permanent else 0,
        "max_failures": max_failures,
        "message": message,
        "due": utcnow() + _seconds(retry_in),
    }
    dead = 0
    for part in _parts([job.id for job in jobs], form):
        result = conn.execute(_FAILED[form], {**values, "ids": _list_param(part, form)})
        dead += sum(1 for d in result.scalars() if d)
    return dead


def _failed(form: str | None) -> Any:
    """:func:`settle_failed`'s statement in list form ``form``."""
    failures = outbox.c.failures + bindparam("failed", type_=Integer)
    return (
        update(outbox)
        .where(_one_of(outbox.c.id, "ids", form), outbox.c.claimed_by == bindparam("token"))
        .values(
            attempts=outbox.c.attempts + 1,
            failures=failures,
            last_error=bindparam("message", type_=outbox.c.last_error.type),
            dead=case((failures >= bindparam("max_failures", type_=Integer), True), else_=False),
            next_attempt_at=bindparam("due", type_=outbox.c.next_attempt_at.type),
            claimed_by=None,
        )
        .returning(outbox.c.dead)
    )


_FAILED = _forms(_failed)


def has_due(conn: Connection, *, now: dt.datetime | None = None) -> bool:
    """Whether some pending job is due (a read: idle polling takes no write lock)."""
    stmt = (
        select(outbox.c.id)
        .where(outbox.c.dead.is_(False), outbox.c.next_attempt_at <= (now or utcnow()))
        .order_by(outbox.c.next_attempt_at)  # the due-time index's first (PostgreSQL scanned)
        .limit(1)
    )
    return conn.execute(stmt).first() is not None


def leased(conn: Connection, *, now: dt.datetime | None = None) -> bool:
    """Whether some pending job is leased now: a processor is syncing it (a read)."""
    stmt = (
        select(outbox.c.id)
        .where(
            outbox.c.dead.is_(False),
            outbox.c.claimed_by.is_not(None),
            outbox.c.next_attempt_at > (now or utcnow()),
        )
        .limit(1)
    )
    return conn.execute(stmt).first() is not None


def orphaned_tokens(conn: Connection, *, now: dt.datetime | None = None) -> list[str]:
    """Tokens of processors of this host that died holding live leases.

    A processor's token is ``host:pid:nonce``; a lease held by a process of this host that no
    longer exists can never be settled, so it need not run out before others take over (as it
    must for other hosts, whose processes cannot be seen from here).
    """
    import os
    import socket

    host = socket.gethostname()[:40]
    tokens = conn.execute(
        select(outbox.c.claimed_by)
        .where(outbox.c.dead.is_(False), outbox.c.next_attempt_at > (now or utcnow()))
        .where(outbox.c.claimed_by.like(f"{host}:%"))
        .distinct()
    ).scalars()
    gone = []
    for token in tokens:
        try:
            pid = int(token.split(":")[1])
        except (IndexError, ValueError):
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            gone.append(token)
        except PermissionError:  # alive, another user's
            continue
    return gone


def release(conn: Connection, tokens: Sequence[str], *, now: dt.datetime | None = None) -> int:
    """Make the jobs leased to ``tokens`` due again, now (their processors are gone)."""
    if not tokens:
        return 0
    stmt = (
        update(outbox)
        .where(outbox.c.claimed_by.in_(list(tokens)))
        .values(claimed_by=None, next_attempt_at=now or utcnow())
    )
    return int(conn.execute(stmt).rowcount)


def dead_letter(conn: Connection, keys: Iterable[JobKey], error: str) -> int:
    """Bury the pending jobs of ``keys`` at once (e.g. their table is no longer mapped)."""
    buried = 0
    for form, params in _by_rows(conn, keys):
        buried += int(conn.execute(_BURY[form], {**params, "error": error[:2000]}).rowcount)
    return buried


_BURY = _forms(
    lambda f: (
        update(outbox)
        .where(*_of_rows_where(f), _alive())
        .values(
            dead=True,
            last_error=bindparam("error", type_=outbox.c.last_error.type),
            claimed_by=None,
        )
    )
)


_RENAME = update(outbox).where(outbox.c.id == bindparam("job")).values(row_pk=bindparam("key"))


def rename_keys(conn: Connection, jobs: Sequence[Job]) -> None:
    """Store each of ``jobs``' key (``row_pk``) as the job holds it: a key written otherwise
    (a migration's, from a reflected table) named as the model writes it, so that the other
    jobs of its row see it."""
    if jobs:
        conn.execute(_RENAME, [{"job": job.id, "key": job.key.pk} for job in jobs])


def requeue_dead(
    conn: Connection, table: str | None = None, column: str | None = None, pk: str | None = None
) -> int:
    """Give dead-lettered jobs (all, or of ``table``/``column``/``pk``) fresh attempts, due now."""
    stmt = update(outbox)
    for col, value in ((outbox.c.table_name, table), (outbox.c.column_name, column)):
        if value is not None:
            stmt = stmt.where(col == value)
    # all: through the due-time index; of a table or row: through the row index (see _alive)
    is_dead = outbox.c.dead if table is None else func.coalesce(outbox.c.dead, False)
    stmt = stmt.where(is_dead.is_(True))
    if pk is not None:
        stmt = stmt.where(outbox.c.row_pk == pk)
    result = conn.execute(
        stmt.values(dead=False, attempts=0, failures=0, next_attempt_at=utcnow(), claimed_by=None)
    )
    return int(result.rowcount)


def expedite(conn: Connection, table: str, column: str) -> int:
    """Make the unleased pending jobs of one column due now (e.g. held back by a drift error)."""
    stmt = (
        update(outbox)
        .where(_alive())  # through the row index, not every pending job's (see _alive)
        .where(outbox.c.claimed_by.is_(None))
        .where(outbox.c.table_name == table)
        .where(outbox.c.column_name == column)
        .values(next_attempt_at=utcnow())
    )
    return int(conn.execute(stmt).rowcount)


def delete_column(conn: Connection, table: str, column: str) -> int:
    """Delete every job (pending and dead) of one column, e.g. before the column is dropped."""
    stmt = delete(outbox).where(outbox.c.table_name == table, outbox.c.column_name == column)
    return int(conn.execute(stmt).rowcount)


def counts(conn: Connection) -> dict[tuple[str, str], dict[str, Any]]:
    """Per ``(table, column)``: pending, dead and retrying job counts, oldest pending time (UTC)."""
    retrying = func.sum(case((outbox.c.attempts > 0, 1), else_=0))
    stmt = select(
        outbox.c.table_name,
        outbox.c.column_name,
        outbox.c.dead,
        func.count(),
        func.min(outbox.c.created_at),
        retrying,
    ).group_by(outbox.c.table_name, outbox.c.column_name, outbox.c.dead)
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for table, column, dead, n, oldest, retries in conn.execute(stmt):
        entry = out.setdefault(
            (table, column), {"pending": 0, "dead": 0, "retrying": 0, "oldest_pending": None}
        )
        if dead:
            entry["dead"] = int(n)
        else:
            entry["pending"] = int(n)
            entry["retrying"] = int(retries or 0)
            entry["oldest_pending"] = None if oldest is None else as_utc(oldest)
    return out


def errors(conn: Connection, *, limit: int = 20) -> list[dict[str, Any]]:
    """The last errors of dead and retrying jobs, grouped by column, state and error text."""
    state = case((outbox.c.dead.is_(True), "dead"), else_="retrying")
    stmt = (
        select(
            outbox.c.table_name,
            outbox.c.column_name,
            state.label("state"),
            outbox.c.last_error,
            func.count(),
            func.min(outbox.c.row_pk),
        )
        .where(outbox.c.last_error.is_not(None))
        .group_by(outbox.c.table_name, outbox.c.column_name, state, outbox.c.last_error)
        .order_by(func.count().desc())
        .limit(limit)
    )
    return [
        {
            "table": t,
            "column": c,
            "state": s,
            "error": e,
            "jobs": int(n),
            "example_pk": pk,
        }
        for t, c, s, e, n, pk in conn.execute(stmt)
    ]


def pending(conn: Connection, *, limit: int = 10) -> list[dict[str, Any]]:
    """Pending (not dead) jobs, next due first: what a drain that timed out is waiting for."""
    stmt = (
        select(
            outbox.c.table_name,
            outbox.c.column_name,
            outbox.c.row_pk,
            outbox.c.attempts,
            outbox.c.last_error,
            outbox.c.next_attempt_at,
            outbox.c.claimed_by,
        )
        .where(outbox.c.dead.is_(False))
        .order_by(outbox.c.next_attempt_at, outbox.c.id)
        .limit(limit)
    )
    return [dict(row._mapping) for row in conn.execute(stmt)]


def next_due(conn: Connection) -> dt.datetime | None:
    """When the next pending job is due (``None``: nothing pending)."""
    stmt = (
        select(outbox.c.next_attempt_at)
        .where(outbox.c.dead.is_(False))
        .order_by(outbox.c.next_attempt_at)
        .limit(1)
    )
    found = conn.execute(stmt).scalar()
    return None if found is None else as_utc(found)


def checkpoint(conn: Connection, name: str, value: str | None = None) -> str | None:
    """Read (``value=None``) or record a maintenance pass's progress under ``name``.

    Recording an empty string deletes the checkpoint (the pass finished).
    """
    if value is None:
        return conn.execute(select(checkpoints.c.value).where(checkpoints.c.name == name)).scalar()
    conn.execute(delete(checkpoints).where(checkpoints.c.name == name))
    if value:
        conn.execute(insert(checkpoints).values(name=name, value=value, updated_at=utcnow()))
    return value
