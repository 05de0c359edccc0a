"""Processing outbox jobs: claim, read, apply, settle, each in its own short step.

A :class:`Processor` pass over one database:

1. **claim** due jobs in a short transaction (:func:`semantic_orm.outbox.claim`: leases, and on
   PostgreSQL ``FOR UPDATE SKIP LOCKED`` plus per-row advisory locks), unless the caller already
   holds them (jobs born leased to this processor by the commit that wrote them);
2. **read** each row's *current* committed value of the column, one ``SELECT`` per column and
   500 keys;
3. **apply** them (:class:`~semantic_orm.applying.Applier`) with no database transaction open,
   after checking that each column's collection still matches its settings;
4. **settle** in a short transaction: delete finished jobs (and dead jobs of the same rows),
   record failures with their backoff, queue again the rows whose lease was lost, and remove
   the points of rows whose job was dead-lettered, so the store holds only current text.

No transaction stays open while the model embeds. On SQLite each short write takes the
:class:`~semantic_orm.gate.WriteGate` of its engine, waiting for the application's open
transactions in this process, and takes SQLite's write lock with its first statement, so it
waits (busy timeout) instead of failing. With a pool that hands every caller the same driver
connection (``StaticPool``, ``SingletonThreadPool``: SQLite in memory) a pass does not run while
a session, or an external transaction a session joined, is open on it: its commit or rollback
would be theirs.
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from sqlalchemy import Connection, Engine, select
from sqlalchemy.orm import Session

from . import outbox
from .applying import Applier, ApplyReport, SyncOp
from .binding import ColumnBinding
from .exc import ConfigurationError, is_transient
from .gate import WriteGate
from .mapping import SemanticColumn, pk_in, row_key
from .outbox import Job, JobKey

__all__ = ["ProcessReport", "Processor", "RetryPolicy", "read_values"]

log = logging.getLogger("semantic_orm")

SWEEP = 60.0
"""Seconds between two looks for the leases of processes of this host that died."""

Resolve = Callable[[str, str], ColumnBinding | None]
"""Maps a job's ``(table, column)`` to the binding that syncs it (``None``: not mapped here)."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When failed jobs run again, and when they are given up on.

    Args:
        max_attempts: Permanent failures after which a job is dead-lettered (transient ones,
            such as an unreachable store, never count).
        base: Seconds before the first retry; doubled each attempt.
        cap: Longest wait between retries, in seconds.
        lease: Seconds a processor may hold claimed jobs before others may take them.
    """

    max_attempts: int = 5
    base: float = 1.0
    cap: float = 300.0
    lease: float = 300.0

    def delay(self, attempts: int) -> float:
        """Seconds to wait after the ``attempts``-th failed attempt."""
        return float(min(self.cap, self.base * 2 ** max(attempts - 1, 0)))


@dataclass(slots=True)
class ProcessReport:
    """What :meth:`Processor.process` did with outbox jobs."""

    claimed: int = 0
    done: int = 0
    retried: int = 0
    dead: int = 0
    lost: int = 0
    """Jobs whose lease expired before they were settled (their rows were queued again)."""
    skipped: int = 0
    """Jobs asked for (``ids=``) but not claimed: their row was being synced by another pass."""
    blocked: bool = False
    """Nothing could run: the pooled connection had another transaction open."""
    unknown: list[JobKey] = field(default_factory=list)
    """Jobs naming a table and column no registered model maps (left to retry)."""
    sync: ApplyReport = field(default_factory=ApplyReport)

    def add(self, other: ProcessReport) -> None:
        """Accumulate another pass's counts."""
        for name in ("claimed", "done", "retried", "dead", "lost", "skipped"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.blocked = self.blocked or other.blocked
        self.unknown.extend(k for k in other.unknown if k not in self.unknown)
        for name in ("upserted", "deleted", "points", "embedded", "reused"):
            setattr(self.sync, name, getattr(self.sync, name) + getattr(other.sync, name))
        self.sync.failed.extend(other.sync.failed)


class Blocked(Exception):
    """A pooled connection came with another transaction open on it."""


def read_values(
    session: Session, column: SemanticColumn, pks: Sequence[str]
) -> dict[str, str | None]:
    """``column``'s current value for each row key in ``pks`` that exists, 500 keys a query."""
    mapper = column.mapper
    cls = column.mapped_class
    keys = [getattr(cls, mapper.get_property_by_column(c).key) for c in mapper.primary_key]
    value = getattr(cls, column.key)
    values: dict[str, str | None] = {}
    for start in range(0, len(pks), 500):
        stmt = select(*keys, value).where(pk_in(mapper, list(pks[start : start + 500])))
        for row in session.execute(stmt):
            values[row_key(tuple(row)[:-1])] = row[-1]
    return values


class Processor:
    """Runs processing passes for one index (see the module docstring).

    Args:
        resolve: Maps a job's table and column to its binding.
        applier: Applies ops to the store.
        policy: Retries and leases.
        token: This processor's identity in ``claimed_by``.
        gate_for: The write gate of a SQLite engine (``None`` for other databases).
        blocked: Whether using an engine now would run on someone's open transaction (a pool
            that hands every caller the same driver connection).
    """

    def __init__(
        self,
        resolve: Resolve,
        applier: Applier,
        policy: RetryPolicy,
        *,
        token: str,
        gate_for: Callable[[Engine], WriteGate | None],
        blocked: Callable[[Engine], bool],
    ) -> None:
        self.resolve = resolve
        self.applier = applier
        self.policy = policy
        self.token = token
        self.gate_for = gate_for
        self.blocked = blocked
        self._swept: weakref.WeakKeyDictionary[Engine, float] = weakref.WeakKeyDictionary()

    @contextlib.contextmanager
    def writing(self, engine: Engine) -> Iterator[Connection]:
        """A short write transaction on ``engine`` (gated and write-locked on SQLite)."""
        gate = self.gate_for(engine)
        with gate.writing() if gate is not None else contextlib.nullcontext():
            if self.blocked(engine):
                raise Blocked
            with engine.connect() as conn:
                with conn.begin():
                    if conn.dialect.name == "sqlite":
                        # a write first: the transaction holds SQLite's write lock from its
                        # start, so it waits for other writers instead of failing to upgrade
                        conn.execute(
                            outbox.outbox.update()
                            .where(outbox.outbox.c.id < 0)
                            .values(attempts=outbox.outbox.c.attempts)
                        )
                    yield conn

    def process(
        self,
        engine: Engine,
        *,
        limit: int = 256,
        ids: Sequence[int] | None = None,
        claimed: Sequence[Job] | None = None,
    ) -> ProcessReport:
        """One pass: claim due jobs (or those among ``ids``), sync their rows, settle them.

        ``claimed`` are jobs this processor already holds (born leased to its token), synced
        without a claim transaction. Never raises for a job's failure; raises only if the
        database itself fails.
        """
        report = ProcessReport()
        try:
            if self.blocked(engine):
                raise Blocked
            if claimed is None:
                if ids is None and not self._anything_to_claim(engine):
                    return report  # idle: no write transaction at all
                with self.writing(engine) as conn:
                    claimed = outbox.claim(
                        conn, token=self.token, lease=self.policy.lease, limit=limit, ids=ids
                    )
                if ids is not None:
                    report.skipped = len(ids) - len(claimed)
            if claimed:
                self._run(engine, list(claimed), report)
        except Blocked:
            report.blocked = True
        return report

    def _anything_to_claim(self, engine: Engine) -> bool:
        """Read whether a job is due, first releasing the leases of processes that died here
        (looked for every :data:`SWEEP` seconds)."""
        with engine.connect() as conn:
            orphans: list[str] = []
            if time.monotonic() - self._swept.get(engine, -SWEEP) >= SWEEP:
                self._swept[engine] = time.monotonic()
                orphans = outbox.orphaned_tokens(conn)
            due = outbox.has_due(conn)
        if orphans:
            with self.writing(engine) as conn:
                outbox.release(conn, orphans)
            return True
        return due

    def _run(self, engine: Engine, jobs: list[Job], report: ProcessReport) -> None:
        report.claimed = len(jobs)
        by_key: dict[JobKey, list[Job]] = {}
        for job in jobs:
            by_key.setdefault(job.key, []).append(job)
        groups: dict[tuple[str, str], list[str]] = {}
        for key in by_key:
            groups.setdefault((key.table, key.column), []).append(key.pk)

        ops: list[SyncOp] = []
        unknown: list[JobKey] = []
        failed: list[tuple[list[JobKey], BaseException]] = []
        with engine.connect() as conn, Session(bind=conn, autoflush=False) as session:
            for (table, column), pks in groups.items():
                binding = self.resolve(table, column)
                if binding is None:
                    unknown.extend(JobKey(table, column, pk) for pk in pks)
                    continue
                values = read_values(session, binding.column, pks)
                ops.extend(SyncOp(binding, pk, values.get(pk)) for pk in pks)
            session.rollback()

        sync = self.applier.apply(ops)
        report.sync = sync
        for group, error in sync.failed:
            failed.append(([op.key for op in group], error))
        if unknown:
            report.unknown = unknown
            failed.append(
                (
                    unknown,
                    ConfigurationError(
                        f"no mapped SemanticText column for {unknown[0].table}."
                        f"{unknown[0].column}: import the models (or pass models= to "
                        "SemanticIndex) in the process that syncs"
                    ),
                )
            )
        self._settle(engine, by_key, failed, ops, report)

    def _settle(
        self,
        engine: Engine,
        by_key: dict[JobKey, list[Job]],
        failed: list[tuple[list[JobKey], BaseException]],
        ops: list[SyncOp],
        report: ProcessReport,
    ) -> None:
        failed_keys = {key for keys, _ in failed for key in keys}
        done = [job for key, jobs in by_key.items() if key not in failed_keys for job in jobs]
        buried: list[JobKey] = []
        with self.writing(engine) as conn:
            lost = outbox.settle_done(conn, done, token=self.token)
            if lost:
                outbox.enqueue(conn, lost)
            report.lost = len(lost)
            report.done = len(done) - sum(len(by_key[k]) for k in lost)
            for keys, error in failed:
                jobs = [job for key in keys for job in by_key[key]]
                permanent = not is_transient(error)
                attempts = max(job.attempts for job in jobs) + 1
                dead = outbox.settle_failed(
                    conn,
                    jobs,
                    error,
                    token=self.token,
                    permanent=permanent,
                    retry_in=self.policy.delay(attempts),
                    max_failures=self.policy.max_attempts,
                )
                if dead:
                    report.dead += dead
                    buried.extend(keys)
                    log.error("semantic_orm: dead-lettered %s: %s", keys[0], error)
                report.retried += len(jobs) - dead
        if buried:
            self._forget_points(buried, ops)

    def _forget_points(self, keys: list[JobKey], ops: list[SyncOp]) -> None:
        """Remove the points of dead-lettered rows (their text could not be indexed)."""
        bindings = {op.key: op.binding for op in ops}
        targets: dict[str, list[tuple[str, int]]] = {}
        for key in keys:
            binding = bindings.get(key)
            if binding is not None:
                targets.setdefault(binding.target, []).append((key.pk, 0))
        for target, rows in targets.items():
            try:
                self.applier.store.delete_rows(target, rows)
            except Exception as exc:  # the store is the problem: the points go with a rewrite
                log.warning("semantic_orm: could not remove dead-lettered rows' points: %s", exc)


def _by_binding(ops: Sequence[SyncOp]) -> list[tuple[ColumnBinding, list[SyncOp]]]:
    groups: dict[tuple[str, str, str], tuple[ColumnBinding, list[SyncOp]]] = {}
    for op in ops:
        key = (op.key.table, op.key.column, op.binding.target)
        groups.setdefault(key, (op.binding, []))[1].append(op)
    return list(groups.values())
