"""The transactional outbox: sync jobs written in the same transaction as the change.

When a flush changes a ``SemanticText`` value, the session also inserts one row into
``semantic_orm_outbox`` naming the table, the column and the row's primary key. The job commits
or rolls back with the change itself, so a committed change always has a job and a rolled-back
one never does. A job carries no text: whoever processes it reads the row's *current* committed
value, so the index converges to the database whatever order jobs run in.

After commit the job is processed inline (the default) or left for a worker
(:class:`~semantic_orm.worker.Worker`, ``semantic-orm worker``). A job that fails stays, with its
attempt count, last error and next retry time; one that fails permanently ``max_attempts`` times
is dead-lettered (``dead = true``): visible in ``semantic-orm status``, re-queueable with
:func:`requeue_dead`, and never in the way of the others.

The table lives in its own :data:`metadata`. It is created on first use (``CREATE TABLE IF NOT
EXISTS``); to manage it with Alembic instead, add it to your metadata with
:func:`include_in` and pass ``create_outbox=False`` to the index.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Connection,
    DateTime,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    and_,
    delete,
    func,
    insert,
    or_,
    select,
    update,
)

__all__ = [
    "OUTBOX_TABLE",
    "Job",
    "claim",
    "enqueue",
    "expedite",
    "include_in",
    "metadata",
    "outbox",
    "requeue_dead",
]

OUTBOX_TABLE = "semantic_orm_outbox"

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
    Column("last_error", Text, nullable=True),
    Column("dead", Boolean, nullable=False, default=False),
    Column("next_attempt_at", DateTime(timezone=True), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Index("ix_semantic_orm_outbox_due", "dead", "next_attempt_at"),
    Index("ix_semantic_orm_outbox_row", "table_name", "column_name", "row_pk"),
)


def include_in(target: MetaData) -> Table:
    """Copy the outbox table into your ``MetaData`` (for Alembic autogenerate)."""
    return outbox.to_metadata(target)


def utcnow() -> dt.datetime:
    """Timezone-aware now (UTC)."""
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True, slots=True)
class Job:
    """One pending outbox row."""

    id: int
    table_name: str
    column_name: str
    row_pk: str
    attempts: int

    @property
    def key(self) -> tuple[str, str, str]:
        """``(table, column, primary key)``: the row and column the job syncs."""
        return (self.table_name, self.column_name, self.row_pk)


def enqueue(conn: Connection, keys: Iterable[tuple[str, str, str]]) -> int:
    """Insert one job per ``(table, column, pk)``, on ``conn`` (in its transaction)."""
    now = utcnow()
    rows = [
        {
            "table_name": t,
            "column_name": c,
            "row_pk": pk,
            "attempts": 0,
            "dead": False,
            "next_attempt_at": now,
            "created_at": now,
        }
        for t, c, pk in keys
    ]
    if rows:
        conn.execute(insert(outbox), rows)
    return len(rows)


def claim(
    conn: Connection,
    *,
    limit: int,
    keys: Sequence[tuple[str, str, str]] | None = None,
    now: dt.datetime | None = None,
) -> list[Job]:
    """Lock and return up to ``limit`` due jobs (or the jobs of ``keys``), oldest first.

    On PostgreSQL the rows are locked ``FOR UPDATE SKIP LOCKED``: concurrent workers each get
    different jobs, and a job stays claimed until the claiming transaction ends.
    """
    stmt = select(
        outbox.c.id, outbox.c.table_name, outbox.c.column_name, outbox.c.row_pk, outbox.c.attempts
    ).where(outbox.c.dead.is_(False))
    if keys is not None:
        if not keys:
            return []
        stmt = stmt.where(
            or_(
                *(
                    and_(
                        outbox.c.table_name == t,
                        outbox.c.column_name == c,
                        outbox.c.row_pk == pk,
                    )
                    for t, c, pk in keys
                )
            )
        )
    else:
        stmt = stmt.where(outbox.c.next_attempt_at <= (now or utcnow()))
    stmt = stmt.order_by(outbox.c.id).limit(limit)
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update(skip_locked=True)
    return [Job(*row) for row in conn.execute(stmt)]


def finish(conn: Connection, ids: Sequence[int]) -> None:
    """Delete jobs that were processed."""
    for start in range(0, len(ids), 500):
        conn.execute(delete(outbox).where(outbox.c.id.in_(ids[start : start + 500])))


def fail(
    conn: Connection,
    jobs: Sequence[Job],
    error: BaseException,
    *,
    retry_in: dt.timedelta,
    dead: bool,
) -> None:
    """Record a failed attempt: bump attempts, keep the error, schedule the retry or bury it."""
    message = f"{type(error).__name__}: {error}"[:2000]
    ids = [job.id for job in jobs]
    conn.execute(
        update(outbox)
        .where(outbox.c.id.in_(ids))
        .values(
            attempts=outbox.c.attempts + 1,
            last_error=message,
            dead=dead,
            next_attempt_at=utcnow() + retry_in,
        )
    )


def requeue_dead(conn: Connection, table: str | None = None) -> int:
    """Give dead-lettered jobs (of ``table``, or all) a fresh set of attempts, due now."""
    stmt = update(outbox).where(outbox.c.dead.is_(True))
    if table is not None:
        stmt = stmt.where(outbox.c.table_name == table)
    result = conn.execute(stmt.values(dead=False, attempts=0, next_attempt_at=utcnow()))
    return int(result.rowcount)


def expedite(conn: Connection, table: str, column: str) -> int:
    """Make the pending jobs of one column due now (e.g. those held back by a drift error)."""
    stmt = (
        update(outbox)
        .where(outbox.c.dead.is_(False))
        .where(outbox.c.table_name == table)
        .where(outbox.c.column_name == column)
        .values(next_attempt_at=utcnow())
    )
    return int(conn.execute(stmt).rowcount)


def counts(conn: Connection) -> dict[tuple[str, str], dict[str, Any]]:
    """Per ``(table, column)``: pending and dead job counts and the oldest pending job's time."""
    stmt = select(
        outbox.c.table_name,
        outbox.c.column_name,
        outbox.c.dead,
        func.count(),
        func.min(outbox.c.created_at),
    ).group_by(outbox.c.table_name, outbox.c.column_name, outbox.c.dead)
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for table, column, dead, n, oldest in conn.execute(stmt):
        entry = out.setdefault((table, column), {"pending": 0, "dead": 0, "oldest_pending": None})
        if dead:
            entry["dead"] = n
        else:
            entry["pending"] = n
            entry["oldest_pending"] = oldest
    return out
