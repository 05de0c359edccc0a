"""Processing outbox jobs: claim, read, apply, settle, each in its own short step.

A :class:`Processor` pass over one database:

1. **claim** due jobs in a short transaction (:func:`semantic_orm.outbox.claim`: leases, and on
   PostgreSQL ``FOR UPDATE SKIP LOCKED`` plus per-row advisory locks), unless the caller already
   holds them (jobs born leased to this processor by the commit that wrote them);
2. **read** each row's *current* committed value of the column, one ``SELECT`` per column and
   500 keys (a commit's own jobs, claimed by id, in the claim's transaction); except, for jobs
   born leased to this processor, the rows whose text their commit's flush wrote and knows
   (:meth:`_Pass.group`): no other pass syncs those rows before the jobs are settled, so that
   text is still theirs;
3. **apply** them (:class:`~semantic_orm.applying.Applier`) with no database transaction open,
   after checking that each column's collection still matches its settings;
4. **settle** in a short transaction: delete finished jobs (and dead jobs of the same rows),
   record failures with their backoff, queue again the rows whose lease was lost, and remove
   the points of rows whose job was dead-lettered, so the store holds only current text. A
   settle the database refuses (locked, gone) waits for the next pass on that database, which
   settles it first while its leases hold (:meth:`Processor.wanted` tells a retrier so).

An inline commit's jobs that all succeeded may be settled later instead (``defer=True``, see
:class:`DeferredSettle`): on SQLite the next commit on the same database deletes them in its
own transaction (no transaction of their own), else (and elsewhere) a timer does a moment
later, in one transaction for all the commits meanwhile (for an async driver's engine, in a
task on the event loop its commits synced on). Until then they stay leased to this processor,
so no one else syncs those rows again; if the process dies first, the leases expire and a later
pass syncs the rows once more (it finds them up to date).

No transaction stays open while the model embeds. On SQLite each short write takes the
:class:`~semantic_orm.gate.WriteGate` of its engine, waiting for the application's open
transactions in this process, and takes SQLite's write lock with its first statement, so it
waits (busy timeout) instead of failing. With a pool that hands every caller the same driver
connection (``StaticPool``, ``SingletonThreadPool``: SQLite in memory) a pass does not run while
a session, or an external transaction a session joined, is open on it: its commit or rollback
would be theirs.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import logging
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import Connection, Engine, Select, select
from sqlalchemy.orm import Mapper, Session

from . import outbox
from .applying import Applier, ApplyReport, RowValue, SyncOp
from .binding import ColumnBinding
from .exc import ConfigurationError, is_transient
from .filtering import FilterField, row_fields
from .forking import RenewedLock
from .gate import WriteGate
from .mapping import (
    SemanticColumn,
    canonical_key,
    key_params,
    keys_in,
    pk_in,
    rewrites_keys,
    row_key,
)
from .outbox import Job, JobKey

__all__ = [
    "FAILURE_WAIT_CAP",
    "DeferredSettle",
    "ProcessReport",
    "Processor",
    "RetryPolicy",
    "async_engine",
    "failure_wait",
    "read_values",
    "running_loop",
]

log = logging.getLogger("semantic_orm")

UNSETTLED_MARGIN = 5.0
"""Seconds a failed settle's leases must hold yet for the next pass to settle it (after that
its jobs are left to be claimed again)."""

FAILURE_WAIT_CAP = 30.0
"""Longest wait, in seconds, between the passes of a worker or a retrier whose passes keep
failing (the database down): the wait doubles up to it (a worker's is at least its
``poll_interval``)."""


def failure_wait(interval: float, failures: int) -> float:
    """Seconds to wait after ``failures`` (at least 1) passes failed in a row, for a loop
    that passes every ``interval`` seconds: ``interval``, doubled for each further failure,
    up to :data:`FAILURE_WAIT_CAP` (or ``interval``, if longer)."""
    return min(interval * 2.0 ** min(failures - 1, 30), max(interval, FAILURE_WAIT_CAP))


SWEEP = 60.0
"""Seconds between two looks for the leases of processes of this host that died."""

SETTLE_DELAY = 0.25
"""Seconds an inline commit's finished jobs wait (on SQLite for a later commit to delete them)
before a timer deletes them, in a transaction of its own for all that waited."""
SETTLE_RETRY = 5.0
"""Seconds before the timer tries again to delete finished jobs it could not delete."""

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
        """Accumulate another pass's counts. Of the failures (``sync.failed``, which hold the
        rows' text) and the jobs no model maps (``unknown``) a total keeps those of the latest
        pass that had any: a worker's total lives as long as the worker, through outages (and
        deployments missing a model) of any length."""
        for name in ("claimed", "done", "retried", "dead", "lost", "skipped"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.blocked = self.blocked or other.blocked
        if other.unknown:
            self.unknown = list(other.unknown)
        for name in ("upserted", "deleted", "points", "embedded", "reused"):
            setattr(self.sync, name, getattr(self.sync, name) + getattr(other.sync, name))
        if other.sync.failed:
            self.sync.failed = list(other.sync.failed)


class Blocked(Exception):
    """A pooled connection came with another transaction open on it."""


def read_values(
    bind: Connection | Session,
    column: SemanticColumn,
    pks: Sequence[str],
    fields: Sequence[FilterField] = (),
) -> dict[str, RowValue]:
    """``column``'s current value (and ``fields``') for each row key in ``pks`` that exists,
    500 keys a query.

    The rows are read with Core statements on the mapped tables, never through an ORM
    session: the application's ORM query hooks (``do_orm_execute`` adding a tenant's or a
    soft-delete's loader criteria) must not hide a committed row from its sync, which would
    take it out of the index.
    """
    conn = bind.connection() if isinstance(bind, Session) else bind
    mapper = _owner(column)
    n = len(mapper.primary_key)
    values: dict[str, RowValue] = {}
    for start in range(0, len(pks), 500):
        part = list(pks[start : start + 500])
        if n == 1:  # built once per column and fields: a sync of one row runs it too
            stmt, params = _read_statement(column, tuple(fields)), key_params(mapper, part)
        else:
            stmt, params = _columns_of(column, fields).where(pk_in(mapper, part)), {}
        for row in conn.execute(stmt, params):
            cells = tuple(row)
            values[row_key(cells[:n])] = RowValue(cells[n], row_fields(fields, cells[n + 1 :]))
    return values


def _columns_of(column: SemanticColumn, fields: Sequence[FilterField]) -> Select[Any]:
    """``SELECT`` the primary key, ``column`` and ``fields`` of ``column``'s model, in Core
    (from the tables the mapper writes: a joined-inheritance parent's too, never a polymorphic
    union or the other subclasses' tables)."""
    mapper = _owner(column)
    return select(*mapper.primary_key, column.column, *(f.column for f in fields)).select_from(
        mapper.persist_selectable
    )


def _owner(column: SemanticColumn) -> Mapper[Any]:
    """The mapper of the table holding ``column``: a joined-inheritance base's when the column
    was found through a subclass, so that the base's other rows are read too."""
    table = column.column.table
    chain = list(column.mapper.iterate_to_root())
    return next((m for m in reversed(chain) if m.local_table is table), column.mapper)


@functools.lru_cache(maxsize=256)
def _read_statement(column: SemanticColumn, fields: tuple[FilterField, ...]) -> Select[Any]:
    return _columns_of(column, fields).where(keys_in(_owner(column)))


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
        requeued: Called with an engine where a deferred settle queued rows again (their lease
            was lost): someone should process its due jobs soon.
        reach: Called with the connection of a pass's claim and each column whose jobs it
            claims, in the claim's transaction: raises if the index cannot use them there (a
            database or schema it did not use them in, see :mod:`semantic_orm.schemas`).
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
        requeued: Callable[[Engine], None] = lambda engine: None,
        reach: Callable[[Any, Sequence[SemanticColumn]], None] = lambda bind, columns: None,
    ) -> None:
        self.resolve = resolve
        self.reach = reach
        self.applier = applier
        self.policy = policy
        self.token = token
        self.gate_for = gate_for
        self.blocked = blocked
        self._swept: weakref.WeakKeyDictionary[Engine, float] = weakref.WeakKeyDictionary()
        self.later = DeferredSettle(self, requeued)
        """Finished jobs of inline commits that are not deleted yet."""
        self._unsettled: weakref.WeakKeyDictionary[Engine, list[_Pass]] = (
            weakref.WeakKeyDictionary()
        )
        """Passes whose settle failed (the database refused it): the next pass on their
        database settles them first, while their leases hold."""
        self._lock = RenewedLock()

    def forked(self, token: str) -> None:
        """In a process forked from this one's: a token of its own, none of the parent's
        finished or unsettled jobs (it settles them)."""
        self.token = token
        self.later.forked()
        self._unsettled = weakref.WeakKeyDictionary()

    @contextlib.contextmanager
    def writing(self, engine: Engine) -> Iterator[Connection]:
        """A short write transaction on ``engine`` (gated and write-locked on SQLite)."""
        gate = self.gate_for(engine)
        with gate.writing() if gate is not None else contextlib.nullcontext():
            if self.blocked(engine):
                raise Blocked
            with engine.connect() as conn, conn.begin():
                _lock_first(conn)
                yield conn

    @contextlib.asynccontextmanager
    async def awriting(self, engine: Any) -> AsyncIterator[Any]:
        """:meth:`writing` for an ``AsyncEngine``: waits for the gate without blocking."""
        gate = self.gate_for(engine.sync_engine)
        deadline = time.monotonic() + (gate.max_wait if gate is not None else 0)
        while gate is not None and gate.busy() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        if self.blocked(engine.sync_engine):
            raise Blocked
        async with engine.connect() as conn, conn.begin():
            await conn.run_sync(_lock_first)
            yield conn

    def process(
        self,
        engine: Engine,
        *,
        limit: int = 256,
        ids: Sequence[int] | None = None,
        claimed: Sequence[Job] | None = None,
        defer: bool = False,
        written: Mapping[JobKey, str | None] | None = None,
        inline: bool = False,
    ) -> ProcessReport:
        """One pass: claim due jobs (or those among ``ids``), sync their rows, settle them.

        ``claimed`` are jobs this processor already holds (born leased to its token), synced
        without a claim transaction, and ``written`` the text their commit wrote to some of
        their rows (those are not read again, see :meth:`_Pass.group`); with ``defer``, if
        every one of them succeeds they are settled later (:attr:`later`), not in a transaction
        of their own. ``inline``: a commit's own sync, which does not wait on a store found
        unreachable (:class:`~semantic_orm.applying.Outage`). Never raises for a job's
        failure; raises only if the database itself
        fails, or if ``reach`` refuses the engine for a claimed job's column (the claim is
        undone).
        """
        run = _Pass(self, engine)
        try:
            if self.blocked(engine):
                raise Blocked
            left = self._left(engine)
            while left:  # earlier passes whose settle failed
                with self._settling(engine, left), self.writing(engine) as conn:
                    left[0].settle(conn)
                left.pop(0).forget()
            if claimed is None:
                if ids is None:
                    with engine.connect() as conn:
                        due = run.look(conn, self._sweep(engine))
                    if run.orphans:
                        with self.writing(engine) as conn:
                            run.release(conn)
                    if not due and not run.orphans:
                        return run.report  # idle: no write transaction at all
                with self.writing(engine) as conn:
                    claimed = run.claim_and_read(conn, limit, ids)
                written = None  # claimed now: another pass may have synced a newer value
            else:
                run.hold(claimed)
            if claimed and not run.grouped and run.group(written):
                with engine.connect() as conn:
                    run.read(conn)
            if claimed:
                run.apply(inline)
                if defer and not run.failed:
                    run.report.done = len(run.jobs)
                    self.later.add(engine, run.jobs)
                else:
                    with self._settling(engine, [run]), self.writing(engine) as conn:
                        run.settle(conn)
                    run.forget()
        except Blocked:
            run.report.blocked = True
        return run.report

    async def aprocess(
        self,
        engine: Any,
        *,
        limit: int = 256,
        ids: Sequence[int] | None = None,
        claimed: Sequence[Job] | None = None,
        defer: bool = False,
        written: Mapping[JobKey, str | None] | None = None,
        inline: bool = False,
    ) -> ProcessReport:
        """:meth:`process` for an ``AsyncEngine``: SQL on the event loop (awaited), the
        embedding and the store calls in a worker thread; the loop is never blocked. Deferred
        settles run on this loop too."""
        run = _Pass(self, engine)
        sync_engine = engine.sync_engine
        try:
            if self.blocked(sync_engine):
                raise Blocked
            left = self._left(sync_engine)
            while left:
                with self._settling(sync_engine, left):
                    async with self.awriting(engine) as conn:
                        await conn.run_sync(left[0].settle)
                await asyncio.to_thread(left.pop(0).forget)
            if claimed is None:
                if ids is None:
                    sweep = self._sweep(sync_engine)
                    async with engine.connect() as conn:
                        due = await conn.run_sync(run.look, sweep)
                    if run.orphans:
                        async with self.awriting(engine) as conn:
                            await conn.run_sync(run.release)
                    if not due and not run.orphans:
                        return run.report
                async with self.awriting(engine) as conn:
                    claimed = await conn.run_sync(run.claim_and_read, limit, ids)
                written = None
            else:
                run.hold(claimed)
            if claimed and not run.grouped and run.group(written):
                async with engine.connect() as conn:
                    await conn.run_sync(run.read)
            if claimed:
                await asyncio.to_thread(run.apply, inline)
                if defer and not run.failed:
                    run.report.done = len(run.jobs)
                    self.later.add(sync_engine, run.jobs, asyncio.get_running_loop())
                    return run.report
                with self._settling(sync_engine, [run]):
                    async with self.awriting(engine) as conn:
                        await conn.run_sync(run.settle)
                await asyncio.to_thread(run.forget)
        except Blocked:
            run.report.blocked = True
        return run.report

    @contextlib.contextmanager
    def _settling(self, engine: Engine, runs: list[_Pass]) -> Iterator[None]:
        """Around the settle of ``runs[0]`` (the others wait their turn): if it fails (the
        database refused it, or a session holds the only connection), they wait for the next
        pass on ``engine`` instead of leaving their jobs leased to this processor until the
        leases end (300 s by default: what they synced stayed pending that long, what failed
        was not retried sooner)."""
        try:
            yield
        except BaseException:
            with self._lock:
                self._unsettled.setdefault(engine, []).extend(runs)
            raise

    def wanted(self, engine: Engine) -> bool:
        """Whether a pass on ``engine`` has work even if no job is due: a pass whose settle
        failed waits for it, or a look for the leases of dead processes of this host is due
        (their jobs look leased for the rest of their leases)."""
        if self._sweep_due(engine):
            return True
        with self._lock:
            return any(run.holds() for run in self._unsettled.get(engine, ()))

    def _left(self, engine: Engine) -> list[_Pass]:
        """Take ``engine``'s passes whose settle failed, those whose leases still hold (the
        others' jobs are due again: another pass syncs their rows once more)."""
        with self._lock:
            runs = self._unsettled.pop(engine, [])
        return [run for run in runs if run.holds()]

    def _sweep_due(self, engine: Engine) -> bool:
        """Whether :data:`SWEEP` s have passed since the last look at ``engine``'s leases."""
        return time.monotonic() - self._swept.get(engine, -SWEEP) >= SWEEP

    def _sweep(self, engine: Engine) -> bool:
        """Whether to look for the leases of processes that died here (every :data:`SWEEP` s)."""
        if not self._sweep_due(engine):
            return False
        self._swept[engine] = time.monotonic()
        return True


class DeferredSettle:
    """Finished jobs of inline commits, deleted later and together (see the module docstring).

    A commit's jobs are synced right after it; deleting them takes another write transaction
    (another commit to disk). Instead they wait here, still leased: on SQLite the next flush
    of an installed session on the same database deletes them in its own transaction
    (:meth:`carry`, given back with :meth:`give_back` if that transaction does not commit), and
    a timer deletes what has waited :data:`SETTLE_DELAY` seconds (:meth:`flush`, in one short
    transaction per database). In a steady stream of SQLite commits each flush takes the last
    commit's jobs before they are due, so the timer never needs a transaction of its own;
    elsewhere the timer settles the jobs of all the commits of its delay together.

    Args:
        processor: Whose jobs these are (its token holds their leases).
        requeued: Called with an engine where rows were queued again (a lost lease).
        delay: Seconds the first waiting job waits for the timer.
    """

    def __init__(
        self,
        processor: Processor,
        requeued: Callable[[Engine], None],
        delay: float = SETTLE_DELAY,
    ) -> None:
        self.processor = processor
        self.requeued = requeued
        self.delay = delay
        self._jobs: weakref.WeakKeyDictionary[Engine, list[Job]] = weakref.WeakKeyDictionary()
        # when the oldest of each database's waiting jobs came
        self._since: weakref.WeakKeyDictionary[Engine, float] = weakref.WeakKeyDictionary()
        # what each settle in flight took (one list each): still in the database, still ours
        self._settling: weakref.WeakKeyDictionary[Engine, list[list[Job]]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = RenewedLock()
        self._timer: threading.Timer | None = None
        self._closed = False
        self._failing: weakref.WeakSet[Engine] = weakref.WeakSet()  # warned, not settled since
        # an async driver's engine: the event loop its commits synced on, which settles them
        self._loops: weakref.WeakKeyDictionary[Engine, asyncio.AbstractEventLoop] = (
            weakref.WeakKeyDictionary()
        )
        self._tasks: set[asyncio.Task[None]] = set()
        _deferred.add(self)

    def add(
        self, engine: Engine, jobs: Sequence[Job], loop: asyncio.AbstractEventLoop | None = None
    ) -> None:
        """Keep ``engine``'s finished ``jobs`` for a later settle (settled at once once
        :meth:`close` was called); ``loop``: the event loop of an async driver's engine, where
        its settles run."""
        if loop is not None:
            with self._lock:
                self._loops[engine] = loop
        if self._keep(engine, jobs):
            self.flush(engine)

    def give_back(self, engine: Engine, jobs: Sequence[Job]) -> None:
        """Return jobs taken by :meth:`carry` whose transaction did not commit.

        They have waited already: the timer settles them at its next turn (a session that
        flushes and rolls back over and over cannot keep them waiting until their leases end).
        """
        if self._keep(engine, jobs, waited=self.delay):
            self.flush(engine)

    def _keep(self, engine: Engine, jobs: Sequence[Job], waited: float = 0.0) -> bool:
        """Store ``jobs`` (waiting for ``waited`` seconds already) and arm the timer; whether
        the caller must settle them itself (closed)."""
        if not jobs:
            return False
        with self._lock:
            since = time.monotonic() - waited
            waiting = self._jobs.setdefault(engine, [])
            self._since[engine] = min(since, self._since.get(engine, since)) if waiting else since
            waiting.extend(jobs)
            if self._closed:
                return True
            if self._timer is None:
                self._arm(self.delay)
        return False

    def _arm(self, seconds: float) -> None:
        """Start the timer (the lock held)."""
        self._timer = threading.Timer(seconds, self._due)
        self._timer.daemon = True
        self._timer.start()

    def forked(self) -> None:
        """In a process forked from this one's: the waiting jobs are the parent's (it settles
        them) and no timer runs here (threads do not survive a fork): start empty (the lock
        is renewed by :mod:`semantic_orm.forking`)."""
        self._jobs = weakref.WeakKeyDictionary()
        self._since = weakref.WeakKeyDictionary()
        self._settling = weakref.WeakKeyDictionary()
        self._loops = weakref.WeakKeyDictionary()
        self._tasks = set()
        self._timer = None

    def waiting(self, engine: Engine) -> list[Job]:
        """``engine``'s waiting jobs (a copy; they stay), with those a settle in flight took:
        until its transaction ends they are still in the database, leased to this process (a
        birth of their rows meanwhile must pass them, or it would wait for their lease)."""
        with self._lock:
            taken = [job for jobs in self._settling.get(engine, ()) for job in jobs]
            return [*self._jobs.get(engine, ()), *taken]

    def take(self, engine: Engine, settling: bool = False) -> list[Job]:
        """Remove and return ``engine``'s waiting jobs; with ``settling`` they stay in
        :meth:`waiting` until :meth:`_settled` (the caller deletes them in a transaction of its
        own)."""
        with self._lock:
            self._since.pop(engine, None)
            jobs = self._jobs.pop(engine, [])
            if settling and jobs:
                self._settling.setdefault(engine, []).append(jobs)
            return jobs

    def _settled(self, engine: Engine, jobs: list[Job]) -> None:
        """The settle of ``jobs`` (the very list :meth:`take` returned with ``settling``) has
        ended, whichever way (another settle that took some of them since keeps its own)."""
        with self._lock:
            left = [taken for taken in self._settling.pop(engine, ()) if taken is not jobs]
            if left:
                self._settling[engine] = left

    def carry(self, conn: Connection) -> tuple[list[Job], list[JobKey]]:
        """Delete the waiting jobs of ``conn``'s database in its open transaction (SQLite's;
        elsewhere they wait for the timer: a statement that fails there would abort the
        caller's transaction, and a lock it waits for would hold the caller's commit).

        Returns:
            The jobs deleted (to :meth:`give_back` if the transaction does not commit) and the
            keys whose lease was lost (the caller queues them again in the same transaction).
            Never raises: on an error the jobs wait for the timer.
        """
        if conn.dialect.name != "sqlite":
            return [], []
        engine = conn.engine
        jobs = self.take(engine)
        if not jobs:
            return [], []
        try:
            p = self.processor
            lost = outbox.settle_done(conn, jobs, token=p.token, watch=p.policy.lease)
        except Exception:  # the timer settles them in a transaction of its own
            log.debug("semantic_orm: settling finished jobs in a commit failed", exc_info=True)
            self.give_back(engine, jobs)
            return [], []
        return jobs, lost

    def flush(self, engine: Engine | None = None) -> None:
        """Delete the waiting jobs now (``engine``'s, or every database's), each database's in
        one short transaction. Never raises: jobs that cannot be settled are tried again later
        (:meth:`_failed`) or keep their lease until it expires, and a later pass syncs their
        rows again."""
        with self._lock:
            engines = [engine] if engine is not None else list(self._jobs)
        for each in engines:
            jobs = self.take(each, settling=True)
            if not jobs:
                continue
            if each.dialect.is_async:  # on its event loop
                self._on_loop(each, jobs)
                continue
            try:
                with self.processor.writing(each) as conn:
                    lost = _settle_done(
                        conn, jobs, self.processor.token, self.processor.policy.lease
                    )
            except Blocked:  # a session holds the only connection: later (or at expiry)
                self._keep(each, jobs)
                continue
            except Exception as exc:
                self._failed(each, jobs, exc)
                continue
            finally:  # (those kept are in waiting() again first; those _failed drops are
                # left to their leases)
                self._settled(each, jobs)
            self._failing.discard(each)
            if lost:
                self.requeued(each)
        with self._lock:  # nothing left to wait for: no timer either
            timer = self._timer if not self._jobs else None
            if timer is not None:
                self._timer = None
        if timer is not None:
            timer.cancel()

    def _on_loop(self, engine: Engine, jobs: list[Job]) -> None:
        """Settle an async driver's ``jobs`` (taken, settling) in a task on the event loop its
        commits synced on; if that loop is gone, they are left to their leases (their rows are
        synced again when the leases end)."""
        loop = self._loops.get(engine)
        try:
            if loop is None:
                raise RuntimeError("no event loop")
            if running_loop() is loop:
                self._spawn(engine, jobs)
            else:
                loop.call_soon_threadsafe(self._spawn, engine, jobs)
        except RuntimeError:  # the loop is closed
            log.debug("semantic_orm: finished jobs left to their leases (event loop closed)")
            self._settled(engine, jobs)

    def _spawn(self, engine: Engine, jobs: list[Job]) -> None:
        task = asyncio.get_running_loop().create_task(self._asettle(engine, jobs))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aflush(self, engine: Engine) -> None:
        """:meth:`flush` of an async driver's ``engine``, awaited on the running loop (for
        ``adrain``)."""
        await self._asettle(engine, self.take(engine, settling=True))

    async def _asettle(self, engine: Engine, jobs: list[Job]) -> None:
        """Delete ``jobs`` (taken, settling) in one transaction on ``engine``'s event loop;
        as :meth:`flush` does, never raises."""
        if not jobs:
            return
        try:
            async with self.processor.awriting(async_engine(engine)) as conn:
                lost = await conn.run_sync(
                    _settle_done, jobs, self.processor.token, self.processor.policy.lease
                )
        except Blocked:
            self._keep(engine, jobs)
            return
        except Exception as exc:
            self._failed(engine, jobs, exc)
            return
        finally:
            self._settled(engine, jobs)
        self._failing.discard(engine)
        if lost:
            self.requeued(engine)

    def _failed(self, engine: Engine, jobs: list[Job], exc: Exception) -> None:
        """Keep the jobs a settle could not delete, for another try in :data:`SETTLE_RETRY`
        seconds while their birth leases hold (they still pass later births of their rows);
        the others, and all once closed, are left to their leases: their rows are synced
        again when the leases end. Warns once a streak of failures."""
        live = [job for job in jobs if job.holds()]
        retry = self.delay - SETTLE_RETRY  # (as if waiting since then: due SETTLE_RETRY s on)
        kept = bool(live) and not self._closed and not self._keep(engine, live, retry)
        if engine in self._failing:
            return
        self._failing.add(engine)
        log.warning(
            "semantic_orm: could not settle %d finished jobs (%s); %s",
            len(jobs),
            exc,
            f"trying again every {SETTLE_RETRY:.0f} s while their leases hold"
            if kept
            else "their rows are synced again when the leases expire",
        )

    def _due(self) -> None:
        """Settle the databases whose oldest waiting job has waited :attr:`delay`; wait again
        for the younger ones (on SQLite the next commit's flush usually takes them first)."""
        now = time.monotonic()
        with self._lock:
            self._timer = None
            due = [engine for engine, since in self._since.items() if now - since >= self.delay]
        for engine in due:
            self.flush(engine)
        with self._lock:
            waiting = list(self._since.values())  # (weak keys: an engine may go meanwhile)
            if waiting and self._timer is None and not self._closed:
                self._arm(max(0.0, min(waiting) + self.delay - time.monotonic()))

    def close(self) -> None:
        """Settle what waits, and settle at once from now on."""
        with self._lock:
            self._closed = True
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        self.flush()


def async_engine(engine: Any) -> Any:
    """The ``AsyncEngine`` of ``engine`` (one of an async driver): the application's if it is
    alive (SQLAlchemy keeps a weak reference from one to the other), else a new one."""
    from sqlalchemy.ext.asyncio import AsyncEngine

    if isinstance(engine, AsyncEngine):
        return engine
    return AsyncEngine._retrieve_proxy_for_target(engine)


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, if any."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _settle_done(conn: Connection, jobs: Sequence[Job], token: str, watch: float) -> list[JobKey]:
    """Delete finished ``jobs`` and queue again the rows whose lease was lost; return those
    (``watch``: see :func:`~semantic_orm.outbox.settle_done`)."""
    lost = outbox.settle_done(conn, jobs, token=token, watch=watch)
    if lost:
        outbox.enqueue(conn, lost)
    return lost


_deferred: weakref.WeakSet[DeferredSettle] = weakref.WeakSet()


@atexit.register
def _settle_at_exit() -> None:
    """Settle the finished jobs still waiting when the interpreter exits (best effort: no timer
    tries again)."""
    for deferred in list(_deferred):
        deferred.close()


_NO_WRITE = (
    outbox.outbox.update().where(outbox.outbox.c.id < 0).values(attempts=outbox.outbox.c.attempts)
)
"""A write that changes nothing (built once: building it cost more than running it)."""


def _lock_first(conn: Connection) -> None:
    """On SQLite, a write first: the transaction holds the write lock from its start, so it
    waits for other writers (busy timeout) instead of failing to upgrade later."""
    if conn.dialect.name == "sqlite":
        conn.execute(_NO_WRITE)


class _Pass:
    """One processing pass, as steps that each take a connection (or none).

    The sync and async drivers (:meth:`Processor.process`, :meth:`Processor.aprocess`) run the
    same steps; only how they get a connection and where :meth:`apply` runs differ.
    """

    def __init__(self, processor: Processor, engine: Any) -> None:
        self.processor = processor
        self.engine = engine
        self.report = ProcessReport()
        self.orphans: list[str] = []
        self.jobs: list[Job] = []
        self.by_key: dict[JobKey, list[Job]] = {}
        self.ops: list[SyncOp] = []
        self.unread: list[tuple[ColumnBinding, list[str]]] = []
        self.failed: list[tuple[list[JobKey], BaseException]] = []
        self.buried: list[JobKey] = []
        self.grouped = False
        """Whether :meth:`group` ran."""
        self.until: float | None = None
        """When (``time.monotonic()``) the leases of its jobs end."""

    def look(self, conn: Connection, sweep: bool) -> bool:
        """Whether a job is due (a read); notes the leases of dead local processes."""
        if sweep:
            self.orphans = outbox.orphaned_tokens(conn)
        return outbox.has_due(conn)

    def hold(self, jobs: Sequence[Job]) -> None:
        """Take ``jobs``, already leased to this processor (born leased: their leases end
        with the earliest of theirs)."""
        self.jobs = list(jobs)
        ends = [job.lease_end for job in jobs if job.lease_end is not None]
        self.until = min(ends) if len(ends) == len(self.jobs) and ends else None

    def holds(self) -> bool:
        """Whether the leases of its jobs hold for a few seconds yet (a settle then still finds
        them ours, none synced by another pass meanwhile)."""
        return self.until is not None and self.until > time.monotonic() + UNSETTLED_MARGIN

    def release(self, conn: Connection) -> None:
        """Make the dead processes' jobs due again."""
        outbox.release(conn, self.orphans)

    def claim(self, conn: Connection, limit: int, ids: Sequence[int] | None) -> list[Job]:
        """Lease due jobs (or those among ``ids``); a column the index cannot use through
        this pass's engine raises in the claim's transaction, which leaves them as they were."""
        p = self.processor
        self.until = time.monotonic() + p.policy.lease  # (before the claim: counts from now)
        claimed = self._canonical(
            conn, outbox.claim(conn, token=p.token, lease=p.policy.lease, limit=limit, ids=ids)
        )
        for table, column in dict.fromkeys((job.key.table, job.key.column) for job in claimed):
            binding = p.resolve(table, column)
            if binding is not None:
                p.reach(conn, (binding.column,))
        if ids is not None:
            self.report.skipped = len(ids) - len(claimed)
        return claimed

    def claim_and_read(self, conn: Connection, limit: int, ids: Sequence[int] | None) -> list[Job]:
        """Lease due jobs (or those among ``ids``); a commit's own jobs (``ids``), up to
        :data:`~semantic_orm.outbox.BATCH` of them, have their rows read in the same
        transaction, before the leases commit (no transaction of its own for the read); a
        worker's batch or a bulk commit's after it (:meth:`read`: the locks are not held
        while many rows are read). Jobs claimed now may follow a
        pass that synced a newer value than their commit wrote: their rows are read, never
        taken from a commit."""
        self.jobs = self.claim(conn, limit, ids)
        if self.jobs and ids is not None and len(self.jobs) <= outbox.BATCH and self.group():
            self.read(conn)
        return self.jobs

    def group(self, written: Mapping[JobKey, str | None] | None = None) -> bool:
        """Group the claimed jobs by row, resolve their columns; whether a row must be read.

        ``written``: the text of rows whose jobs were born leased to this processor, as their
        commit wrote them. No other pass syncs such a row until these jobs are settled (a later
        commit's job for it is born unclaimed behind the lease), so that text is the row's while
        the lease lasts (the committing index hands it over for half the lease only); the other
        rows are read (:meth:`read`).
        """
        self.grouped = True
        known = written or {}
        self.report.claimed = len(self.jobs)
        for job in self.jobs:
            self.by_key.setdefault(job.key, []).append(job)
        groups: dict[tuple[str, str], list[str]] = {}
        for key in self.by_key:
            groups.setdefault((key.table, key.column), []).append(key.pk)
        unknown: list[JobKey] = []
        for (table, column), pks in groups.items():
            binding = self.processor.resolve(table, column)
            if binding is None:
                unknown.extend(JobKey(table, column, pk) for pk in pks)
                continue
            if binding.fields:  # filter values are read with the text
                self.unread.append((binding, pks))
                continue
            missing = []
            for pk in pks:
                key = JobKey(table, column, pk)
                if key in known:
                    self.ops.append(SyncOp(binding, pk, known[key]))
                else:
                    missing.append(pk)
            if missing:
                self.unread.append((binding, missing))
        if unknown:
            self.report.unknown = unknown
            error = ConfigurationError(
                f"no mapped SemanticText column for {unknown[0].table}.{unknown[0].column}: "
                "import the models (or pass models= to SemanticIndex) in the process that syncs; "
                "a column renamed or dropped since: op.rename_semantic_index or "
                "op.drop_semantic_index in its migration"
            )
            self.failed.append((unknown, error))
        return bool(self.unread)

    def _canonical(self, conn: Connection, jobs: list[Job]) -> list[Job]:
        """``jobs``, each named by its row's key as the model writes it
        (:func:`~semantic_orm.mapping.canonical_key`), stored so in the claim's transaction: a
        job a migration queued from the reflected table may name it otherwise (its row was read
        as missing; a commit's job for the row did not see it)."""
        mappers: dict[tuple[str, str], Mapper[Any] | None] = {}  # (None: keys kept as they are)
        out = []
        for job in jobs:
            table, column, pk = job.key
            where = (table, column)
            if where not in mappers:
                binding = self.processor.resolve(table, column)
                mapper = None if binding is None else _owner(binding.column)
                mappers[where] = mapper if mapper is not None and rewrites_keys(mapper) else None
            mapper = mappers[where]
            canon = pk if mapper is None else canonical_key(mapper, pk)
            out.append(job if canon == pk else replace(job, key=JobKey(table, column, canon)))
        outbox.rename_keys(
            conn, [job for job, was in zip(out, jobs, strict=True) if job is not was]
        )
        return out

    def read(self, conn: Connection) -> None:
        """Read the current value of the rows :meth:`group` left unread."""
        for binding, pks in self.unread:
            values = read_values(conn, binding.column, pks, binding.fields)
            self.ops.extend(SyncOp.of(binding, pk, values.get(pk)) for pk in pks)
        self.unread = []

    def apply(self, inline: bool = False) -> None:
        """Chunk, embed and write the rows (no database connection); ``inline``: for a
        commit's own sync (see :meth:`Processor.process`)."""
        sync = self.processor.applier.apply(self.ops, inline=inline)
        self.report.sync = sync
        self.failed.extend(([op.key for op in group], error) for group, error in sync.failed)

    def settle(self, conn: Connection) -> None:
        """Delete finished jobs, record failures, queue again the rows whose lease was lost."""
        p, report, by_key = self.processor, self.report, self.by_key
        failed_keys = {key for keys, _ in self.failed for key in keys}
        done = [job for key, jobs in by_key.items() if key not in failed_keys for job in jobs]
        lost = _settle_done(conn, done, p.token, p.policy.lease)
        report.lost = len(lost)
        report.done = len(done) - sum(len(by_key[k]) for k in lost)
        for keys, error in self.failed:
            jobs = [job for key in keys for job in by_key[key]]
            attempts = max(job.attempts for job in jobs) + 1
            dead = outbox.settle_failed(
                conn,
                jobs,
                error,
                token=p.token,
                permanent=not is_transient(error),
                retry_in=p.policy.delay(attempts),
                max_failures=p.policy.max_attempts,
            )
            if dead:
                report.dead += dead
                self.buried.extend(keys)
                log.error("semantic_orm: dead-lettered %s: %s", keys[0], error)
            report.retried += len(jobs) - dead

    def forget(self) -> None:
        """Remove the points of dead-lettered rows (their text could not be indexed)."""
        if not self.buried:
            return
        bindings = {op.key: op.binding for op in self.ops}
        targets: dict[str, list[tuple[str, int]]] = {}
        for key in self.buried:
            binding = bindings.get(key)
            if binding is not None:
                targets.setdefault(binding.target, []).append((key.pk, 0))
        for target, rows in targets.items():
            try:
                self.processor.applier.store.delete_rows(target, rows)
            except Exception as exc:  # the store is the problem: the points go with a rewrite
                log.warning("semantic_orm: could not remove dead-lettered rows' points: %s", exc)
