"""Staging: every write of an installed session becomes outbox jobs in its own transaction.

:class:`SessionTracker` listens on a ``sessionmaker``'s private Session class (or one
``Session``) and catches the three ways a session writes a ``SemanticText`` column (or one of
the columns its ``filter_by`` carries into the vector payload):

* **flushes** (``session.add``, attribute changes, ``session.delete`` and the orphans a
  ``delete-orphan`` cascade deletes, primary-key changes):
  ``before_flush`` refuses values that cannot be indexed, naming the model and column;
  ``after_flush`` (primary keys exist by then) writes one job per changed semantic attribute
  (any change of its row, for one derived from the others: ``Computed``, ``onupdate``),
  two when the primary key changed (the old key's points go, the new key's come);
* **statements** the session executes (ORM or Core ``insert()``/``update()``/``delete()`` on a
  table with a semantic column, ``bulk_insert_mappings``, ``bulk_update_mappings``,
  ``bulk_save_objects``, and anything sent through ``session.connection()``, the statements
  of an application's flush listeners too, which run inside the flush: see :func:`_foreign`):
  a listener on each connection the session begins reads the rows a statement will touch
  before it runs (and the new primary keys an update assigns), or the keys an insert creates
  (from its parameters, or ``RETURNING``; an upsert, which may update a row other than the one
  it names, with the rows holding its conflict's values read first, and a one-row one's
  ``RETURNING``), and writes their jobs after it ran. An insert whose new keys cannot be known
  (``from_select``, multi-row ``values()`` without keys) is refused before it runs;
* nothing else: raw SQL, database cascades and other applications are invisible to a session
  (raw SQL in a flush, or after it, has the rows the session wrote read back).
  ``semantic-orm reconcile`` converges those (:func:`semantic_orm.maintenance.reconcile`).

Jobs go to the database of the row's table (per-model ``binds`` work), are remembered on the
transaction that wrote them (the innermost savepoint, or the root), move outward when a
savepoint is released, vanish when it rolls back, and are handed over after the root commits,
once the transaction has ended and its connections are back in the pool. A session that joined
a transaction it does not own (the test recipe that binds a session to an open connection) makes
no durable commit: its jobs wait in the outbox for that transaction's fate. On an
``AUTOCOMMIT`` connection every write is durable at once: its jobs are ordinary pending ones,
synced when the session's transaction ends, with a commit or without. Where jobs are born
leased (SQLite, PostgreSQL), the finished jobs of this process's earlier commits and the jobs
born earlier in the same transaction hold no row back from a birth; on SQLite a transaction
that writes jobs also deletes, through its hooks, those finished jobs, and hands them back if
it, or the savepoint that deleted them, does not commit (once the root transaction has ended:
until then it holds the database).
Each flush also notes the text it wrote to each row where the session knows it
(:attr:`Staged.written`), so that a commit syncing its born-leased jobs need not read them back;
any other statement the session runs afterwards, or a deletion, makes every row of the
transaction read back. Before a flush or a statement writes jobs, the index checks the schema
each written table reaches (``schema_translate_map``, :mod:`semantic_orm.schemas`), for the
root transaction, which keeps that claim if it commits. The tracker writes jobs and calls back;
it never syncs anything itself.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    Column,
    CompoundSelect,
    Connection,
    Engine,
    Index,
    PrimaryKeyConstraint,
    Select,
    Table,
    UniqueConstraint,
    and_,
    event,
    inspect,
    or_,
    select,
)
from sqlalchemy.orm import InstanceState, Mapper, Session, SessionTransaction, UOWTransaction
from sqlalchemy.sql import operators
from sqlalchemy.sql.dml import Insert, Update, UpdateBase
from sqlalchemy.sql.elements import (
    BinaryExpression,
    BindParameter,
    BooleanClauseList,
    ClauseElement,
    ColumnElement,
    Grouping,
    ReleaseSavepointClause,
    RollbackToSavepointClause,
    SavepointClause,
    UnaryExpression,
)

from . import outbox
from .column import SemanticText, check_semantic_value
from .exc import ConfigurationError
from .filtering import filter_fields
from .mapping import SemanticColumn, row_key, semantic_columns, table_name
from .outbox import Job, JobKey

__all__ = ["SessionTracker", "Staged", "StagingHooks"]

_STAGED = "semantic_orm.staged"
_FLUSHING = "semantic_orm.flushing"
_COMPUTED = "semantic_orm.computed"
_FOREIGN = "semantic_orm.foreign"
"""In a flush's attributes: a statement of the application ran during it."""
_MAPPERS = "semantic_orm.mappers"
"""In a flush's attributes: what :func:`_flushing` found."""
_OWN_TABLES = frozenset({outbox.OUTBOX_TABLE, outbox.CHECKPOINT_TABLE})
"""The index's own tables: its writes there in a flush are not the application's."""
_CONNECTIONS = "semantic_orm.connections"
_COMMITTED = "semantic_orm.committed"
_CLAIMED = "semantic_orm.claimed"  # the root transaction whose writes claimed schemas
_KEPT = "semantic_orm.claims_kept"  # ... once it has committed
_UNKNOWN: Any = object()
"""A row's text that a flush does not know (see :func:`_written`)."""
_HARMLESS = (
    Select,
    CompoundSelect,
    SavepointClause,
    ReleaseSavepointClause,
    RollbackToSavepointClause,
)
"""Statements that change no row a flush wrote (a ``ROLLBACK TO SAVEPOINT`` drops the
savepoint's staged jobs, and what they knew, with it)."""


@dataclass(slots=True)
class Staged:
    """What one transaction wrote to one database's outbox."""

    keys: set[JobKey] = field(default_factory=set)
    ids: list[int] = field(default_factory=list)
    born: list[Job] = field(default_factory=list)
    """Jobs born leased to this process's processor (synced without a claim)."""
    carried: list[Job] = field(default_factory=list)
    """Finished jobs of earlier commits that this transaction deletes (given back when its
    database transaction rolls back, or when it ends without a commit)."""
    returned: list[Job] = field(default_factory=list)
    """Jobs a savepoint inside this transaction carried and then rolled back: not deleted,
    given back when the root transaction ends (until then it holds the database, and a settle
    would only wait for it)."""
    written: dict[JobKey, str | None] = field(default_factory=dict)
    """The text each key's row holds as this transaction's last flush of it wrote it, where
    the session knows it (see :func:`_written`); a key missing is read back."""
    trusted_until: float = math.inf
    """When the first birth lease behind :attr:`written` runs out (``time.monotonic()``), with
    a margin: past it another pass may sync these rows, and they are read back."""
    autocommit: bool = False
    """Written on an ``AUTOCOMMIT`` connection: durable at once, synced even if the session
    rolls back."""

    def merge(self, other: Staged) -> None:
        """Add ``other``'s jobs (a released savepoint's: what it wrote comes last)."""
        self.keys |= other.keys
        self.ids.extend(other.ids)
        self.born.extend(other.born)
        self.carried.extend(other.carried)
        self.returned.extend(other.returned)
        self.autocommit = self.autocommit or other.autocommit
        self.note(other.keys, other.written, other.trusted_until)

    def undone(self) -> list[Job]:
        """Remove and return the finished jobs this transaction deleted and no longer does
        (it did not commit): :attr:`carried` and :attr:`returned`."""
        back = [*self.carried, *self.returned]
        self.carried, self.returned = [], []
        return back

    def note(
        self, keys: Iterable[JobKey], written: Mapping[JobKey, str | None], until: float
    ) -> None:
        """Remember the text of ``keys`` where ``written`` knows it, forget it elsewhere."""
        for key in keys:
            if key in written:
                self.written[key] = written[key]
            else:
                self.written.pop(key, None)
        self.trusted_until = min(self.trusted_until, until)

    def known(self) -> Mapping[JobKey, str | None]:
        """:attr:`written`, while it can still be trusted."""
        return self.written if time.monotonic() < self.trusted_until else {}


@dataclass(frozen=True, slots=True)
class StagingHooks:
    """What the tracker asks of its index.

    Attributes:
        register: Called with each semantic column a write touches (discovery).
        prepare: Called with each connection a session begins (create the outbox if needed).
        born_leased: The token to lease a connection's new jobs to at birth, or ``None``.
        lease: Seconds a birth lease lasts.
        carry: Called, where new jobs are born leased, with the connection of a flush (a
            savepoint's too): deletes the finished jobs of earlier commits in its transaction
            (where that is safe); returns them and the keys to queue again (their lease was
            lost).
        finished: This process's finished jobs not deleted yet in a connection's database
            whose birth leases still hold (they hold no row back from a birth).
        restore: Called with the jobs ``carry`` deleted in a transaction that did not commit,
            once the database transaction around it has rolled back or the session's has
            ended (a root still holds the database after a savepoint rolls back).
        hold: Seconds a connection's new unleased jobs wait before workers may take them (the
            committing process syncs them meanwhile).
        on_commit: Called with the engine and what it staged once a durable root commit has
            ended (its connections are back in the pool).
        begin: Called when a session's root transaction begins on an engine, with the
            connection and whether the session joined a transaction it does not own.
        end: Called when that transaction ends (same arguments).
        mapper_for: The mapper of a table, for statements on a bare ``Table``.
        reach: Called before jobs are written, with each connection and table written (and the
            column or table to name in messages), a statement's own execution options and the
            session's root transaction: refuses a schema the index cannot follow (see
            :mod:`semantic_orm.schemas`).
        ended: Called when a root transaction that ``reach`` was given ends, and whether it
            committed.
    """

    register: Callable[[SemanticColumn], None]
    prepare: Callable[[Connection], None]
    born_leased: Callable[[Connection], str | None]
    lease: float
    carry: Callable[[Connection], tuple[list[Job], list[JobKey]]]
    finished: Callable[[Connection], list[Job]]
    restore: Callable[[Engine, list[Job]], None]
    hold: Callable[[Connection], float]
    on_commit: Callable[[Engine, Staged], None]
    begin: Callable[[Engine, Connection, bool], None]
    end: Callable[[Engine, Connection, bool], None]
    mapper_for: Callable[[Table], Mapper[Any] | None]
    reach: Callable[
        [Sequence[tuple[Connection, Table, str]], Mapping[str, Any] | None, object | None], None
    ]
    ended: Callable[[object, bool], None]


def session_connection(session: Session, engine: Engine) -> Connection | None:
    """The connection ``session``'s transaction holds on ``engine``, if it began one there
    (as the tracker of an installed index recorded it)."""
    found = session.info.get(_CONNECTIONS, {}).get(engine)
    return None if found is None else found[0]


def _staged(session: Session) -> dict[SessionTransaction, dict[Engine, Staged]]:
    return session.info.setdefault(_STAGED, {})  # type: ignore[no-any-return]


def _owner(session: Session) -> SessionTransaction | None:
    """The transaction that owns work done now: the innermost savepoint, else the root."""
    return session.get_nested_transaction() or session.get_transaction()


def _claimant(session: Session) -> SessionTransaction | None:
    """The root transaction that a write's schema claims belong to (kept if it commits, given
    back when it ends otherwise: :attr:`StagingHooks.ended`); ``None`` (claims kept at once)
    for a session that joined a transaction it does not own, whose fate it cannot tell."""
    conns: dict[Engine, tuple[Connection, bool]] = session.info.get(_CONNECTIONS, {})
    root = session.get_transaction()
    if root is None or any(joined for _, joined in conns.values()):
        return None
    session.info[_CLAIMED] = root
    return root


def _enclosing(trans: SessionTransaction) -> SessionTransaction | None:
    """The savepoint or root transaction around ``trans`` (skipping flush subtransactions)."""
    parent = trans.parent
    while parent is not None and not parent.nested and parent.parent is not None:
        parent = parent.parent
    return parent


def _identity(state: InstanceState[Any]) -> tuple[Any, ...]:
    if state.identity is not None:
        return tuple(state.identity)
    return tuple(state.mapper.primary_key_from_instance(state.obj()))


def _autocommit(conn: Connection) -> bool:
    """Whether each statement on ``conn`` commits at once (``isolation_level="AUTOCOMMIT"`` on
    the engine or the connection)."""
    check = getattr(conn, "_is_autocommit_isolation", None)  # SQLAlchemy 2's own test
    if check is not None:
        return bool(check())
    return conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT"


def _user_connection(session: Session, connection: Connection) -> bool:
    """Whether ``connection`` was handed to the session (it joins a transaction it does not own)."""
    if session.bind is connection:
        return True
    binds = getattr(session, "_Session__binds", None) or {}  # Session(binds={...}) values
    return any(bind is connection for bind in binds.values())


class SessionTracker:
    """Session and connection listeners that write outbox jobs (see the module docstring).

    Args:
        hooks: What to call for discovery, outbox creation, leases and commits.
    """

    def __init__(self, hooks: StagingHooks) -> None:
        self.hooks = hooks
        # (event, listener, whether it goes ahead of the application's)
        self.listeners: list[tuple[str, Callable[..., None], bool]] = [
            ("after_begin", self.after_begin, True),
            ("before_flush", self.before_flush, False),
            ("after_flush", self.after_flush, False),
            ("after_flush_postexec", self.after_flush_postexec, False),
            ("after_commit", self.after_commit, True),
            ("after_rollback", self.after_rollback, True),
            ("after_transaction_end", self.after_transaction_end, True),
        ]
        self._sessions: weakref.WeakKeyDictionary[Connection, weakref.ref[Session]] = (
            weakref.WeakKeyDictionary()
        )
        self._pending: weakref.WeakKeyDictionary[Connection, list[_Plan]] = (
            weakref.WeakKeyDictionary()
        )
        self._targets: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
        """What :meth:`install` listens on."""

    def install(self, target: Any) -> None:
        """Listen on ``target`` (a Session subclass or a Session).

        The transaction listeners go first, ahead of the application's: one of those that
        raises in ``after_commit`` (the database has committed by then) must not keep the
        commit from being seen, synced and its schema claims kept. The flush listeners take
        their turn in the order of registration.
        """
        if target in self._targets:
            return
        for name, fn, first in self.listeners:  # not event.contains(): SQLAlchemy keys its
            # record by id(target), which a dead factory's class leaves to a new one
            event.listen(target, name, fn, insert=first)
        self._targets[target] = True

    def remove(self, target: Any) -> None:
        """Stop listening on ``target``."""
        if self._targets.pop(target, None) is None:
            return
        for name, fn, _ in self.listeners:
            if event.contains(target, name, fn):
                event.remove(target, name, fn)

    # -- transactions ------------------------------------------------------------------------

    def after_begin(
        self, session: Session, transaction: SessionTransaction, connection: Connection
    ) -> None:
        """Prepare a connection the session begins: outbox, statement listeners, gate."""
        conns: dict[Engine, tuple[Connection, bool]] = session.info.setdefault(_CONNECTIONS, {})
        engine = connection.engine
        if engine not in conns:
            joined = _user_connection(session, connection)
            conns[engine] = (connection, joined)
            self.hooks.begin(engine, connection, joined)
        self.hooks.prepare(connection)
        self._sessions[connection] = weakref.ref(session)
        if not event.contains(connection, "before_execute", self.before_execute):
            event.listen(connection, "before_execute", self.before_execute, retval=True)
            event.listen(connection, "after_execute", self.after_execute)

    def after_commit(self, session: Session) -> None:
        """Move a released savepoint's jobs outward; keep a durable root commit's for its end."""
        claimed = session.info.get(_CLAIMED)
        if claimed is not None and claimed is session.get_transaction():
            if session.get_nested_transaction() is None:  # the root, not a savepoint
                session.info[_KEPT] = claimed
        staged = session.info.get(_STAGED)
        trans = _owner(session)
        if not staged or trans is None:
            return
        mine = staged.pop(trans, None)
        if not mine:
            return
        parent = _enclosing(trans)
        if trans.nested and parent is not None:
            into = staged.setdefault(parent, {})
            for engine, part in mine.items():
                into.setdefault(engine, Staged()).merge(part)
            return
        conns: dict[Engine, tuple[Connection, bool]] = session.info.get(_CONNECTIONS, {})
        durable = {}
        for engine, part in mine.items():
            if part.returned:  # the root has committed: the database is free for a settle
                self.hooks.restore(engine, part.returned)
                part.returned = []
            if not part.keys:  # it only held those: nothing to sync
                continue
            conn, joined = conns.get(engine, (None, False))
            if joined and conn is not None and conn.in_transaction():
                continue  # an external transaction: it may still roll back; jobs wait in it
            durable[engine] = part
        session.info[_COMMITTED] = durable

    def after_rollback(self, session: Session) -> None:
        """A database's transaction has rolled back (a failed flush's, at once; its session's
        own transaction ends only with ``rollback()`` or ``close()``): give back at once the
        finished jobs its flushes deleted, which are in the database again (a savepoint's
        rollback leaves the database held by the root: those wait for its end)."""
        staged = session.info.get(_STAGED)
        if not staged:
            return
        conns: dict[Engine, tuple[Connection, bool]] = session.info.get(_CONNECTIONS, {})
        for engine, (conn, _joined) in conns.items():
            if conn.in_transaction():  # a savepoint rolled back, or another database did
                continue
            back = [
                job
                for parts in staged.values()
                if engine in parts
                for job in parts[engine].undone()
            ]
            if back:
                self.hooks.restore(engine, back)

    def after_transaction_end(self, session: Session, trans: SessionTransaction) -> None:
        """Forget what a transaction that did not commit still holds; release the gate; hand a
        committed root's jobs over once its connections are back in the pool."""
        session.info.pop(_FLUSHING, None)
        staged = session.info.get(_STAGED)
        left = staged.pop(trans, None) if staged else None
        parent = _enclosing(trans) if trans.nested else None
        root = trans.parent is None and not trans.nested
        # what AUTOCOMMIT wrote stands: a root that ends without a commit still syncs it
        standing = (
            {e: p for e, p in (left or {}).items() if p.autocommit and p.keys} if root else {}
        )
        for engine, part in (left or {}).items():  # not committed: its deletions are undone
            back = part.undone()
            if back and parent is not None and staged is not None:  # a savepoint: the root
                # still holds the database, so they go back when it ends
                staged.setdefault(parent, {}).setdefault(engine, Staged()).returned.extend(back)
            elif back:
                self.hooks.restore(engine, back)
        if root:
            kept = session.info.pop(_KEPT, None) is trans
            if session.info.pop(_CLAIMED, None) is trans:
                self.hooks.ended(trans, kept)
            for engine, (conn, joined) in session.info.pop(_CONNECTIONS, {}).items():
                self.hooks.end(engine, conn, joined)
            for engine, part in {**standing, **session.info.pop(_COMMITTED, {})}.items():
                self.hooks.on_commit(engine, part)

    # -- flushes -----------------------------------------------------------------------------

    @staticmethod
    def _semantic(
        objs: Iterable[Any],
    ) -> Iterable[tuple[InstanceState[Any], tuple[SemanticColumn, ...]]]:
        """The states of ``objs`` (objects or their states) whose mappers have semantic
        columns, with those columns."""
        for obj in objs:
            state = inspect(obj)
            columns = semantic_columns(state.mapper)
            if columns:
                yield state, columns

    @staticmethod
    def _check(state: InstanceState[Any], col: SemanticColumn) -> None:
        if col.settings.filter_by:
            filter_fields(col)  # a misdeclared filter_by fails here, naming the column
        value = state.dict.get(col.key)
        if value is not None and not isinstance(value, ClauseElement):  # an SQL expression:
            # the database computes it in the flush (read back after the commit)
            check_semantic_value(value, where=col.label)

    def before_flush(self, session: Session, flush_context: UOWTransaction, instances: Any) -> None:
        """Refuse values that cannot be indexed before any SQL is sent; then mark the session
        as flushing (its statements until after_flush_postexec are the flush's own)."""
        for state, columns in self._semantic(session.new):
            for col in columns:
                self._check(state, col)
        computed: dict[InstanceState[Any], set[str]] = {}
        for state, columns in self._semantic(session.dirty):
            for col in columns:
                if state.attrs[col.key].history.has_changes() or _filters_changed(state, col):
                    self._check(state, col)
                    names = (col.key, *col.settings.filter_by)
                    if any(isinstance(state.dict.get(n), ClauseElement) for n in names):
                        computed.setdefault(state, set()).add(col.key)
        # SQL expressions: the flush expires them, after_flush would not see them changed
        flush_context.attributes[_COMPUTED] = computed
        session.info[_FLUSHING] = flush_context

    def after_flush_postexec(self, session: Session, flush_context: UOWTransaction) -> None:
        """The flush is over: statements are the user's again."""
        session.info.pop(_FLUSHING, None)

    def after_flush(self, session: Session, flush_context: UOWTransaction) -> None:
        """Write one job per changed semantic attribute, in the flush's transaction."""
        if _owner(session) is None:
            return
        by_mapper: dict[Mapper[Any], list[JobKey]] = {}
        seen: set[SemanticColumn] = set()
        written: dict[JobKey, str | None] = {}
        # what the flush deleted: ``session.deleted`` (a row replaced by a new object of the
        # same key too: the flush made it an UPDATE) and the orphans a ``delete-orphan``
        # cascade found during the flush (listed only in the flush's own states)
        deleted: list[Any] = list(session.deleted)
        known = {inspect(obj) for obj in deleted}
        deleted.extend(
            state
            for state, (isdelete, listonly) in flush_context.states.items()
            if isdelete and not listonly and state not in known
        )
        # a deletion or a new primary key may cascade in the database to rows staged earlier;
        # a statement of the application inside this flush may have rewritten a flushed row
        rewritten = bool(deleted) or flush_context.attributes.pop(_FOREIGN, False)

        def add(
            state: InstanceState[Any], col: SemanticColumn, key: str, value: Any = _UNKNOWN
        ) -> None:
            if col not in seen:
                seen.add(col)
                self.hooks.register(col)
            job = JobKey(col.table, col.name, key)
            by_mapper.setdefault(state.mapper, []).append(job)
            if value is not _UNKNOWN:
                written[job] = value

        for state, columns in self._semantic(session.new):
            key = row_key(state.mapper.primary_key_from_instance(state.obj()))
            for col in columns:
                add(state, col, key, _written(state, col))
        computed: dict[InstanceState[Any], set[str]] = flush_context.attributes.get(_COMPUTED, {})
        dirty = [inspect(obj) for obj in session.dirty]
        listed = set(dirty)
        dirty += [state for state in computed if state not in listed]
        for state, columns in self._semantic(dirty):
            key = row_key(state.mapper.primary_key_from_instance(state.obj()))
            old = row_key(state.identity) if state.identity is not None else None
            for col in columns:
                if old is not None and old != key:  # primary key changed: old points go
                    rewritten = True
                    add(state, col, old)
                    add(state, col, key)
                elif state.attrs[col.key].history.has_changes() or _filters_changed(state, col):
                    add(state, col, key, _written(state, col))
                elif _rederived(col) or col.key in computed.get(state, ()):
                    add(state, col, key)  # computed by the database: read after the commit
        for state, columns in self._semantic(deleted):
            key = row_key(_identity(state))
            for col in columns:
                add(state, col, key)
        if rewritten:
            _forget_written(session)
            written.clear()
        writes = [
            (session.connection(bind_arguments={"mapper": mapper}), mapper, keys)
            for mapper, keys in by_mapper.items()
        ]
        if writes:
            self.hooks.reach(
                [
                    (conn, c.column.table, c.label)
                    for conn, m, _ in writes
                    for c in semantic_columns(m)
                ],
                None,
                _claimant(session),
            )
        for conn, _, keys in writes:
            self._stage(session, conn, keys, written)

    def _stage(
        self,
        session: Session,
        conn: Connection,
        keys: Sequence[JobKey],
        written: Mapping[JobKey, str | None] | None = None,
    ) -> None:
        """Write the jobs of ``keys`` in ``conn``'s transaction and remember them on the
        session's transaction (with the text ``written`` of the rows whose flush knows it)."""
        if not keys:
            return
        owner = _owner(session)
        if owner is None:  # pragma: no cover - a flush always runs in a transaction
            return
        conns: dict[Engine, tuple[Connection, bool]] = session.info.get(_CONNECTIONS, {})
        # jobs of a transaction the session does not own, or written in AUTOCOMMIT (durable
        # at once, whatever the session does next), are ordinary pending jobs: a rollback
        # leaves them, leased to no one, for the next pass
        autocommit = _autocommit(conn)
        plain = conns.get(conn.engine, (None, False))[1] or autocommit
        token = None if plain else self.hooks.born_leased(conn)
        hold = 0.0 if plain else self.hooks.hold(conn)
        part = _staged(session).setdefault(owner, {}).setdefault(conn.engine, Staged())
        part.autocommit = part.autocommit or autocommit
        if token is not None:  # earlier commits' finished jobs go too (given back on a rollback,
            # this flush's failure included: they are the transaction's from here)
            carried, lost = self.hooks.carry(conn)
            part.carried.extend(carried)
            if lost:
                keys = [*keys, *(k for k in dict.fromkeys(lost) if k not in keys)]
        jobs = outbox.enqueue(
            conn,
            keys,
            claimed_by=token,
            lease=self.hooks.lease,
            hold=hold,
            ours=self._ours(session, conn, keys) if token is not None else (),
            returning=bool(token or hold or autocommit),  # ids only matter to an inline sync
        )
        part.keys.update(keys)
        # the birth leases end ``lease`` s from their birth: trust what the flush wrote for half
        born = [job for job in jobs if token is not None and job.claimed_by == token]
        ends = [job.lease_end for job in born if job.lease_end is not None]
        half = self.hooks.lease / 2
        part.note(keys, written or {}, min(ends) - half if ends else time.monotonic() + half)
        part.ids.extend(job.id for job in jobs)
        part.born.extend(born)

    def _ours(self, session: Session, conn: Connection, keys: Sequence[JobKey]) -> list[int]:
        """The jobs of ``keys`` leased to this process that hold no row back from their birth
        on ``conn``: its finished jobs not deleted yet, and those born earlier in this
        session's transaction (synced in the same pass after its commit)."""
        wanted = set(keys)
        ours = self.hooks.finished(conn)
        for parts in _staged(session).values():
            part = parts.get(conn.engine)
            if part is not None:
                ours.extend(part.born)
        return [job.id for job in ours if job.key in wanted]

    # -- statements --------------------------------------------------------------------------

    def _tracked(self, conn: Connection) -> Session | None:
        """The installed session whose transaction ``conn`` belongs to, if it still lives."""
        ref = self._sessions.get(conn)
        return ref() if ref is not None else None

    def _session_of(
        self, conn: Connection, statement: Any, options: Mapping[str, Any] | None
    ) -> Session | None:
        """The installed session whose transaction ``conn`` belongs to, unless ``statement``
        (executed with ``options``) is its flush's own: after_flush stages those."""
        session = self._tracked(conn)
        if session is None:
            return None
        flush = session.info.get(_FLUSHING)
        if flush is not None:
            # A flush that ended without after_flush_postexec (a before_flush listener raised,
            # or it found no work) left the mark behind: SQLAlchemy's own flag says whether a
            # flush is running
            if not getattr(session, "_flushing", True):
                session.info.pop(_FLUSHING, None)
            elif not _foreign(session, flush, conn, statement, options):
                return None
            elif getattr(flush, "transaction", None) is not None:  # (not in before_flush)
                # an application's statement once the flush writes: the texts it wrote to its
                # rows are not trusted (it is staged as any statement of the session)
                flush.attributes[_FOREIGN] = True
        return session

    def before_execute(
        self,
        conn: Connection,
        clauseelement: Any,
        multiparams: Sequence[Mapping[str, Any]],
        params: Mapping[str, Any],
        execution_options: Mapping[str, Any],
    ) -> tuple[Any, Sequence[Mapping[str, Any]], Mapping[str, Any]]:
        """Plan the jobs of a DML statement on a semantic table: read keys before it runs.

        Any statement but a ``SELECT`` may change rows a flush wrote (an update, a trigger, a
        procedure): the rows staged so far are then read back after the commit."""
        if isinstance(clauseelement, _HARMLESS):
            return clauseelement, multiparams, params
        session = self._session_of(conn, clauseelement, execution_options)
        if session is None:
            return clauseelement, multiparams, params
        _forget_written(session)
        if not isinstance(clauseelement, UpdateBase):
            return clauseelement, multiparams, params
        table = _target(clauseelement)
        if table is None or not hasattr(table, "columns"):
            return clauseelement, multiparams, params
        semantic = _semantic_of(table)
        if not semantic:
            return clauseelement, multiparams, params
        rows = list(multiparams) if multiparams else [params] if params else [{}]
        _check_values(clauseelement, rows, semantic, table)
        what = ", ".join(f"{table_name(table)}.{c.name}" for c in semantic)
        self.hooks.reach([(conn, table, what)], execution_options, _claimant(session))
        plan = _plan(conn, clauseelement, rows, table, semantic, self._filter_keys(table, semantic))
        if plan is None:
            return clauseelement, multiparams, params
        self._pending.setdefault(conn, []).append(plan)
        return plan.statement, multiparams, params

    def _filter_keys(self, table: Any, semantic: Sequence[Any]) -> set[str]:
        """The keys of ``table``'s columns that travel in a semantic column's payload."""
        mapper = self.hooks.mapper_for(table)
        keys: set[str] = set()
        for col in semantic:
            for name in col.type.filter_by:
                prop = mapper.column_attrs.get(name) if mapper is not None else None
                if prop is None:
                    keys.add(name)
                else:
                    keys.update(c.key for c in prop.columns)
        return keys

    def after_execute(
        self,
        conn: Connection,
        clauseelement: Any,
        multiparams: Any,
        params: Any,
        execution_options: Any,
        result: Any,
    ) -> None:
        """Write the jobs a statement planned, now that it ran."""
        pending = self._pending.get(conn)
        if not pending:
            return
        plan = None
        while pending:
            candidate = pending.pop()
            if candidate.statement is clauseelement:
                plan = candidate
                break
        session = self._tracked(conn)  # (planned: its session's, inside a flush too)
        if plan is None or session is None:
            return
        keys = plan.keys(result)
        mapper = self.hooks.mapper_for(plan.table)
        columns = semantic_columns(mapper) if mapper is not None else ()
        for col in columns:
            self.hooks.register(col)
        names = [c.name for c in plan.semantic]
        self._stage(
            session,
            conn,
            [JobKey(table_name(plan.table), name, key) for key in keys for name in names],
        )


def _foreign(
    session: Session,
    flush: UOWTransaction,
    conn: Connection,
    statement: Any,
    options: Mapping[str, Any] | None,
) -> bool:
    """Whether ``statement``, executed during ``session``'s ``flush`` (not a ``SELECT``), is
    the application's, not the flush's own: staged (and the flush's texts not trusted) as any
    statement of the session outside a flush is.

    Outside SQLAlchemy's unit of work (its ``before_flush`` listeners come before it, its
    ``after_flush`` and ``after_flush_postexec`` ones after), every statement is an
    application's flush listener's (an ``after_flush`` that keeps a summary up to date, say),
    but the index's own outbox writes. While the unit of work runs, so is every statement a
    mapper event's listener runs (raw SQL too). The unit of work's own statements run with the
    flushing mappers' compiled cache (the flush's rows, staged by ``after_flush``) or write the
    rows of their relationships' many-to-many tables. Those it writes to a table with a
    semantic column are no states ``after_flush`` sees, so they are staged as statements too,
    but an insertion whose new keys could not be read back (no ``INSERT ... RETURNING``).
    """
    table = _target(statement) if isinstance(statement, UpdateBase) else None
    if table is not None and getattr(table, "name", None) in _OWN_TABLES:
        return False
    if not getattr(session, "_warn_on_events", True):  # (set while the unit of work runs;
        return True  # were it gone, every statement would be judged as one of it)
    if table is None:
        return True
    caches, secondaries = _flushing(flush)
    if id((options or {}).get("compiled_cache")) in caches:
        return False
    if table not in secondaries:
        return True
    if not _semantic_of(table):
        return False
    return not (isinstance(statement, Insert) and not conn.dialect.insert_returning)


def _semantic_of(table: Any) -> list[Any]:
    """The columns of ``table`` (a ``Table``, or anything a statement targets) whose type is
    :class:`~semantic_orm.column.SemanticText`."""
    return [c for c in getattr(table, "columns", ()) if isinstance(c.type, SemanticText)]


def _flushing(flush: UOWTransaction) -> tuple[set[int], set[Any]]:
    """The compiled caches of ``flush``'s mappers (by id) and their relationships'
    many-to-many tables, found once per flush (its mappers are all known when its first
    statement runs)."""
    known: tuple[set[int], set[Any]] | None = flush.attributes.get(_MAPPERS)
    if known is None:
        mappers = list(flush.mappers)
        known = (
            {id(m.base_mapper._compiled_cache) for m in mappers},
            {r.secondary for m in mappers for r in m.relationships if r.secondary is not None},
        )
        flush.attributes[_MAPPERS] = known
    return known


def _forget_written(session: Session) -> None:
    """Have every row staged in ``session``'s transaction read back after the commit."""
    for parts in session.info.get(_STAGED, {}).values():
        for part in parts.values():
            part.written.clear()


def _written(state: InstanceState[Any], col: SemanticColumn) -> Any:
    """The text a flush just wrote to ``col`` of ``state``'s row, or :data:`_UNKNOWN`.

    Known when the attribute still holds a plain ``str`` (or ``None``) after the flush: the
    value sent, as SQLAlchemy's identity map keeps it. A server-generated value the flush did
    not fetch is expired (unknown); a ``str`` subclass may convert itself, and a subclass or a
    variant of the column type may change what is stored (unknown).
    """
    if type(col.settings) is not SemanticText or col.settings._variant_mapping:
        return _UNKNOWN
    value = state.dict.get(col.key, _UNKNOWN)
    return value if value is None or type(value) is str else _UNKNOWN


def _derived(column: Any) -> bool:
    """Whether ``column`` is computed from the row's other columns (``Computed``) or changes on
    any update of the row (``onupdate``, ``server_onupdate``): a write to any column may
    change it."""
    return any(x is not None for x in (column.computed, column.onupdate, column.server_onupdate))


def _rederived(col: SemanticColumn) -> bool:
    """Whether any write to a row may change what ``col`` syncs: its text or one of the values
    that travel with its vectors (``filter_by``) is :func:`_derived`."""
    attrs = col.mapper.column_attrs
    return _derived(col.column) or any(
        _derived(c) for name in col.settings.filter_by if name in attrs for c in attrs[name].columns
    )


def _filters_changed(state: InstanceState[Any], col: SemanticColumn) -> bool:
    """Whether a value that travels with ``col``'s vectors (``filter_by``) changed."""
    attrs = state.attrs
    return any(
        name in attrs and attrs[name].history.has_changes() for name in col.settings.filter_by
    )


# -- statement analysis -------------------------------------------------------------------------


@dataclass(slots=True)
class _Plan:
    """The jobs one DML statement will need: keys read before, or returned after, it runs."""

    statement: Any
    table: Any
    semantic: list[Any]
    before: list[str]
    returned: bool = False

    def keys(self, result: Any) -> list[str]:
        """Every key the statement touched (read before it, or returned by it)."""
        keys = list(self.before)
        if self.returned:
            for row in _returned_keys(result, self.table):
                if row is not None and all(v is not None for v in row):
                    keys.append(row_key(tuple(row)))
        return list(dict.fromkeys(keys))


def _returned_keys(result: Any, table: Any) -> list[Any]:
    """The primary keys of the rows an insert wrote, as its ``RETURNING`` gave them (an upsert
    that updated another row returns that row's key, while ``inserted_primary_key`` repeats a
    key given in the parameters)."""
    pk_cols = list(table.primary_key.columns)
    if result.context.executemany:
        rows = result.returned_defaults_rows
    else:
        rows = [result.returned_defaults] if result.returned_defaults is not None else None
    if rows and all(c in rows[0]._mapping for c in pk_cols):
        return [tuple(row._mapping[c] for c in pk_cols) for row in rows]
    return list(result.inserted_primary_key_rows or [])


def _check_values(
    stmt: Any, rows: Sequence[Mapping[str, Any]], semantic: Sequence[Any], table: Any
) -> None:
    """Refuse values a statement would write to a semantic column that cannot be indexed."""
    where = f"{table_name(table)}.{{}}"
    values = _statement_values(stmt)
    for col in semantic:
        for r in rows:
            value = _literal(_given(r, values, col.key))  # (None for an SQL expression)
            if value is not None:
                check_semantic_value(value, where=where.format(col.key))


def _statement_values(stmt: Any) -> dict[str, Any]:
    """The ``values()`` of a DML statement, by column key (SQLAlchemy keeps them privately)."""
    raw = getattr(stmt, "_values", None) or {}
    if isinstance(raw, Mapping):
        items: Iterable[tuple[Any, Any]] = raw.items()
    else:  # ordered_values(): a sequence of pairs
        items = raw
    return {getattr(k, "key", k): v for k, v in items}


def _pk_binds(stmt: Any, table: Any) -> dict[str, str] | None:
    """``{pk column key: bind name}`` when the WHERE clause pins every primary-key column."""
    where = getattr(stmt, "whereclause", None)
    if where is None:
        return None
    pk = {c.key for c in table.primary_key.columns}
    found: dict[str, str] = {}
    for node in _conjuncts(where):  # not inside an OR: its other branch names other rows
        if isinstance(node, BinaryExpression) and node.operator is operators.eq:
            left, right = node.left, node.right
            if isinstance(right, BindParameter) and getattr(left, "key", None) in pk:
                if getattr(getattr(left, "table", None), "name", None) == table.name:
                    found[str(left.key)] = right.key
    return found if set(found) == pk else None


def _conjuncts(clause: Any) -> Iterable[Any]:
    """The terms a WHERE clause ANDs together (through nested ANDs and parentheses)."""
    while isinstance(clause, Grouping):
        clause = clause.element
    if isinstance(clause, BooleanClauseList) and clause.operator is operators.and_:
        for part in clause.clauses:
            yield from _conjuncts(part)
    else:
        yield clause


def _plan(
    conn: Connection,
    stmt: Any,
    rows: list[Mapping[str, Any]],
    table: Any,
    semantic: list[Any],
    filters: set[str],
) -> _Plan | None:
    pk_cols = list(table.primary_key.columns)
    if not pk_cols:
        raise ConfigurationError(
            f"{table_name(table)} has a SemanticText column but no primary key: its rows cannot "
            "be named in the index"
        )
    if isinstance(stmt, Insert):
        return _plan_insert(conn, stmt, rows, table, semantic, pk_cols)
    values = _statement_values(stmt)
    if isinstance(stmt, Update) and not (
        any(_derived(c) for c in semantic)
        or any(_derived(c) for c in table.columns if c.key in filters)
    ):
        changed = set(values) | {k for r in rows for k in r}
        relevant = {c.key for c in semantic} | {c.key for c in pk_cols} | filters
        if not changed & relevant:
            return None  # other columns only: nothing to sync
    moved = [c for c in pk_cols if c.key in values or any(c.key in r for r in rows)]
    moves = isinstance(stmt, Update) and bool(moved)
    binds = _pk_binds(stmt, table)
    keys: list[str] = []
    if binds is not None and not moves and any(r for r in rows):
        # executemany by primary key (bulk updates): the keys are in the parameters
        for r in rows:
            if all(b in r for b in binds.values()):
                keys.append(row_key(tuple(r[binds[c.key]] for c in pk_cols)))
            else:
                keys.extend(_read_keys(conn, stmt, r, pk_cols, table, values, moves))
    else:
        for r in rows:
            keys.extend(_read_keys(conn, stmt, r, pk_cols, table, values, moves))
    return _Plan(stmt, table, semantic, keys)


def _read_keys(
    conn: Connection,
    stmt: Any,
    params: Mapping[str, Any],
    pk_cols: list[Any],
    table: Any,
    values: Mapping[str, Any],
    moves: bool,
) -> list[str]:
    """The keys of the rows an update or delete will touch (and, for an update that changes
    the primary key, the keys it will give them), read in the same transaction before it runs."""
    new: list[Any] = []
    if moves:
        for c in pk_cols:
            if c.key in params:
                new.append(BindParameter(None, params[c.key], type_=c.type))
            elif c.key in values:
                new.append(values[c.key])
            else:
                new.append(c)
    query = select(*pk_cols, *new)
    where = getattr(stmt, "whereclause", None)
    if where is not None:
        query = query.where(where)
    keys: list[str] = []
    n = len(pk_cols)
    for row in conn.execute(query, dict(params)):
        keys.append(row_key(tuple(row)[:n]))
        if moves:
            keys.append(row_key(tuple(row)[n:]))
    return keys


def _plan_insert(
    conn: Connection,
    stmt: Insert,
    rows: list[Mapping[str, Any]],
    table: Any,
    semantic: list[Any],
    pk_cols: list[Any],
) -> _Plan:
    values = _statement_values(stmt)
    name = table_name(table)
    if getattr(stmt, "_select_names", None):
        raise ConfigurationError(
            f"insert into {name} from a SELECT cannot be synced to the semantic index: its new "
            "rows' keys are unknown. Insert the rows with session.add_all() or "
            "session.execute(insert(...), [rows]), or run semantic-orm reconcile afterwards"
        )
    if getattr(stmt, "_multi_values", None):
        keyed: list[dict[str, Any]] = [
            {str(getattr(k, "key", k)): v for k, v in p.items()}
            if isinstance(p, Mapping)
            else {c.key: v for c, v in zip(table.columns, p, strict=False)}
            for group in stmt._multi_values
            for p in group
        ]
        if all(all(_literal(r.get(c.key)) is not None for c in pk_cols) for r in keyed):
            given = [row_key(tuple(_literal(r[c.key]) for c in pk_cols)) for r in keyed]
            upsert = _upsert_clause(stmt)
            if upsert is not None:
                given.extend(_upsert_keys(conn, upsert, table, pk_cols, keyed, {}, False) or ())
            return _Plan(stmt, table, semantic, given)
        raise ConfigurationError(
            f"insert into {name} with a multi-row values() and no primary keys cannot be synced "
            "to the semantic index: pass the primary keys, or the rows as parameters: "
            "session.execute(insert(...), [dict(...), ...])"
        )
    keys: list[str] = []
    known = True
    for r in rows:
        found = [_literal(_given(r, values, c.key)) for c in pk_cols]
        if all(v is not None for v in found):
            keys.append(row_key(tuple(found)))
        else:
            known = False
    returning = bool(getattr(stmt, "_returning", ())) or not conn.dialect.insert_returning
    upsert = _upsert_clause(stmt)
    if upsert is not None:
        # one row, and RETURNING free: the keys it wrote come back too (a row a concurrent
        # transaction inserted after the read below included); several rows stay one
        # statement each (in one multi-row statement, two rows updating one row would fail)
        tells = known and len(rows) <= 1 and not returning
        others = _upsert_keys(conn, upsert, table, pk_cols, rows, values, tells)
        keys.extend(others or ())
        if tells and others is not None:
            returns = stmt.return_defaults(supplemental_cols=pk_cols)  # given keys too
            return _Plan(returns, table, semantic, keys, returned=True)
    if known:
        return _Plan(stmt, table, semantic, keys)
    if getattr(stmt, "_return_defaults", False):  # the caller asked for the keys already
        return _Plan(stmt, table, semantic, [], returned=True)
    if getattr(stmt, "_returning", ()):
        raise ConfigurationError(
            f"insert into {name} without primary key values, with a returning() of its own, "
            "cannot be synced to the semantic index: the index reads the new keys back with a "
            "RETURNING of its own, which SQLAlchemy cannot add to a statement's returning(). "
            "Leave returning() out and read the keys from the objects (session.add_all(), "
            "session.flush(), then obj.id), or pass the primary keys"
        )
    if returning:
        raise ConfigurationError(
            f"insert into {name} without primary key values cannot be synced to the semantic "
            f"index on {conn.dialect.name}, which has no INSERT ... RETURNING to read the new "
            "keys back: use session.add_all(), or pass the primary keys"
        )
    return _Plan(stmt.return_defaults(*pk_cols), table, semantic, [], returned=True)


def _upsert_clause(stmt: Insert) -> Any:
    """The ``ON CONFLICT DO UPDATE`` (or MySQL ``ON DUPLICATE KEY UPDATE``) of an insert;
    ``None`` for a plain insert or ``DO NOTHING`` (which writes only the rows it names)."""
    clause = getattr(stmt, "_post_values_clause", None)
    if not any(hasattr(clause, a) for a in ("update_values_to_set", "update")):
        return None  # (MySQL's update clause is "update")
    return clause


def _upsert_keys(
    conn: Connection,
    clause: Any,
    table: Any,
    pk_cols: list[Any],
    rows: Sequence[Mapping[str, Any]],
    values: Mapping[str, Any],
    returned: bool,
) -> list[str] | None:
    """The keys of the existing rows an upsert may update instead of inserting the ones it
    names (on a conflict over another unique key than the primary key, or with a ``set_``
    that moves the primary key), read before it runs; ``None`` when it writes only the rows
    it names (a conflict on the primary key).

    ``returned``: the statement can return the keys it wrote, which is enough unless the
    primary key moves. Refuses an upsert whose rows cannot be told otherwise.
    """
    pk = {c.key for c in pk_cols}
    moves = bool(pk & _set_keys(clause))
    targets = _conflict_targets(conn, clause, table)
    if targets is not None and not moves and all(set(t) == pk for t in targets):
        return None
    if returned and not moves:
        return []
    found = _conflicting_keys(conn, table, pk_cols, targets, rows, values) if targets else None
    if found is None:
        raise ConfigurationError(
            f"an upsert into {table_name(table)} cannot be synced to the semantic index: the "
            "rows it may update instead of inserting cannot be told before it runs (its "
            "conflict target is an expression or a constraint neither its Table nor the "
            "database names, or a value of it is an SQL expression or a server default), and "
            "it cannot return them (several rows, a returning() of its own, or an update that "
            "moves the primary key). Name the conflict's columns with index_elements= and give "
            "them plain values"
        )
    return found


def _set_keys(clause: Any) -> set[str]:
    """The column keys an upsert's update part assigns."""
    raw = getattr(clause, "update_values_to_set", None)
    if raw is None:
        raw = getattr(clause, "update", None) or {}
    items = raw.items() if isinstance(raw, Mapping) else raw
    return {k if isinstance(k, str) else str(getattr(k, "key", k)) for k, _ in items}


def _conflict_targets(conn: Connection, clause: Any, table: Any) -> list[list[str]] | None:
    """The column keys of each unique key an upsert's conflict may be on; ``None`` when one
    cannot be told (an expression index, a constraint name found nowhere). A named constraint
    the Table does not declare is looked up in the database; without a target (MySQL, a bare
    SQLite ``ON CONFLICT``), every unique key the Table or the database declares."""
    elements = getattr(clause, "inferred_target_elements", None)
    named = getattr(clause, "constraint_target", None)

    def told(targets: list[list[str]]) -> list[list[str]] | None:
        # a part that is no mapped column (an expression's "") cannot be told
        return targets if all(k in table.c for keys in targets for k in keys) else None

    if elements:
        keys = [
            e if isinstance(e, str) else e.key if isinstance(e, Column) else "" for e in elements
        ]
        return told([keys])
    declared: list[tuple[str | None, list[str]]] = [
        (
            None if c.name is None else str(c.name),
            [_index_part(e) for e in c.expressions]
            if isinstance(c, Index)
            else [col.key for col in c.columns],
        )
        for c in (*table.constraints, *table.indexes)  # (the primary key among them)
        if isinstance(c, (PrimaryKeyConstraint, UniqueConstraint))
        or (isinstance(c, Index) and c.unique)
    ]  # an expression index's part is "": a conflict there cannot be told
    if named is not None:
        for name, keys in declared:
            if name == named:
                return told([keys])
    reflected = _unique_keys(conn, table)
    if named is not None:
        found = [keys for name, keys in reflected if name == named]
        return found if found and told(found[:1]) else None
    return told([keys for _, keys in (*declared, *reflected) if keys])


def _unique_keys(conn: Connection, table: Any) -> list[tuple[str | None, list[str]]]:
    """The database's unique keys of ``table`` (in the schema the statement writes): name and
    column keys (an expression's part, or a column the Table does not map, as ``""``). Read
    for each statement that needs them (a constraint the Table does not name, or no target):
    a migration may add one while the application runs."""
    translate = conn.get_execution_options().get("schema_translate_map") or {}
    schema = translate.get(table.schema, table.schema)
    by_name = {c.name: c.key for c in table.columns}
    found = _reflect_unique_keys(conn, table.name, schema)
    return [(name, [by_name.get(c, "") for c in cols]) for name, cols in found]


def _reflect_unique_keys(
    conn: Connection, name: str, schema: str | None
) -> list[tuple[str | None, list[str]]]:
    inspector = inspect(conn)
    out: list[tuple[str | None, list[str]]] = []
    try:
        pk = inspector.get_pk_constraint(name, schema=schema)
        out.append((pk.get("name"), list(pk.get("constrained_columns") or ())))
        for u in inspector.get_unique_constraints(name, schema=schema):
            out.append((u.get("name"), list(u.get("column_names") or ())))
        for i in inspector.get_indexes(name, schema=schema):
            if i.get("unique"):
                names = list(i.get("column_names") or ())
                if i.get("expressions") or not names:  # an expression index
                    names = [*names, ""]
                out.append((i.get("name"), [c or "" for c in names]))
    except NotImplementedError:  # a dialect that cannot say
        pass
    return out


def _index_part(expr: Any) -> str:
    """The column key of one part of a unique index (``""`` for an expression)."""
    element = getattr(expr, "element", None) if isinstance(expr, UnaryExpression) else expr
    return str(element.key) if isinstance(element, Column) else ""


def _conflicting_keys(
    conn: Connection,
    table: Any,
    pk_cols: list[Any],
    targets: list[list[str]],
    rows: Sequence[Mapping[str, Any]],
    values: Mapping[str, Any],
) -> list[str] | None:
    """The keys of the rows holding, on some unique key in ``targets``, the values an upsert
    gives (its rows, or the ``values()``); ``None`` when a value cannot be known before it
    runs. A column it leaves out takes its default (a server-side or computed one matches any
    value: more rows are read, never fewer; NULL conflicts with nothing)."""
    matches = []
    for r in rows:
        for t in targets:
            terms = []
            for k in t:
                col = table.c[k]
                value = _given(r, values, k) if k in r or k in values else _DEFAULT
                if value is _DEFAULT:
                    default = col.default
                    if default is not None and getattr(default, "is_scalar", False):
                        value = default.arg
                    elif default is None and col.server_default is None:
                        value = None
                    else:
                        continue  # known only once it runs: any value
                elif isinstance(value, BindParameter):
                    value = value.effective_value  # None: a NULL
                elif isinstance(value, ColumnElement):
                    return None  # an SQL expression: known only once it runs
                if value is None:
                    break  # NULL conflicts with nothing
                terms.append(col == value)
            else:
                if not terms:
                    return None  # nothing known of this key: every row
                matches.append(and_(*terms))
    found: list[str] = []
    for at in range(0, len(matches), _MATCHES_PER_READ):  # one read per few hundred rows
        query = select(*pk_cols).where(or_(*matches[at : at + _MATCHES_PER_READ]))
        found.extend(row_key(tuple(row)) for row in conn.execute(query))
    return found


_MATCHES_PER_READ = 200
"""Rows an upsert's read of conflicting keys matches per statement (its ORs stay a size any
database parses quickly, and under SQLite's 32,766 parameters)."""


_DEFAULT = object()


def _given(row: Mapping[str, Any], values: Mapping[str, Any], key: str) -> Any:
    """What a statement gives column ``key`` in one parameter set: the parameter of that name,
    else its ``values()`` entry, a bound parameter taking its value from the set by its own
    name (``values(id=bindparam("pid"))``)."""
    if key in row:
        return row[key]
    value = values.get(key)
    if isinstance(value, BindParameter) and value.key in row:
        return row[value.key]
    return value


def _literal(value: Any) -> Any:
    """The Python value of a bound literal (``None`` for SQL expressions and missing values)."""
    if isinstance(value, BindParameter):
        value = value.effective_value  # (a callable_ bind's value, computed)
        return None if callable(value) else value
    if isinstance(value, ColumnElement):
        return None
    return value


def _target(statement: UpdateBase) -> Any:
    """The table ``statement`` writes. An ORM bulk ``insert(Sub)`` / ``update(Sub)`` of a
    joined-inheritance subclass runs one statement per table, each still naming the subclass's
    table as ``.table``: the table it really writes is in its annotations."""
    notes = getattr(statement, "_annotations", None) or {}
    for key in ("_emit_insert_table", "_emit_update_table"):
        found = notes.get(key)
        if found is not None:
            return found
    return getattr(statement, "table", None)
