"""``SemanticIndex``: where vectors live, which model makes them, and which sessions sync.

The index is the manager the ``SemanticText`` marker type leaves the work to. It owns a vector
store and the embedders, wires the steps of the save path together, and is installed explicitly
on the sessions whose commits should reach the store::

    index = SemanticIndex(store=EdgeStore("./vectors"))    # default model: all-MiniLM-L6-v2
    SessionLocal = sessionmaker(engine)
    index.install(SessionLocal)       # every session of this factory now syncs on commit
    ...
    index.uninstall(SessionLocal)     # and stops

Installing on a ``sessionmaker`` listens on that factory's private Session subclass only;
installing on one ``Session`` scopes it to that session; a ``scoped_session`` is installed
through its factory, an ``async_sessionmaker`` through a private subclass of its sync session
class. Importing semantic_orm registers no SQLAlchemy listener.
``Model.semantic_search(session, ...)`` finds the index installed for its session.

The save path, one module per step:

1. :mod:`~semantic_orm.staging` writes an outbox job for each changed row in the writer's own
   transaction (:mod:`~semantic_orm.outbox`);
2. after a durable commit, with ``mode="inline"`` (the default), the commit's jobs go to
   :mod:`~semantic_orm.processing` (claim, read, settle): in the committing thread for a sync
   session, as a task on the loop for an ``AsyncSession`` (:meth:`SemanticIndex.adrain` waits
   for it), in a worker thread for a sync session inside a running loop; with
   ``mode="deferred"`` they wait for a worker (:class:`~semantic_orm.worker.Worker`,
   :class:`~semantic_orm.worker.AsyncWorker`, ``semantic-orm worker``).
   Jobs that failed are retried in the background (a thread, or a task on the loop of an
   ``AsyncSession``; a commit whose sync leaves something wakes it), by a worker, or by
   :meth:`SemanticIndex.drain`; the first transaction on a database in a process (``install``
   on a factory bound to it, already) has them look for jobs an earlier run left. An inline
   commit's jobs are born leased to the index on SQLite and on PostgreSQL (in ``READ
   COMMITTED``, for a bounded number of rows a transaction: see
   :func:`~semantic_orm.outbox.enqueue`), which then needs no claim transaction; a sync
   session's finished jobs are deleted a moment later, by the next commit's transaction on
   SQLite, else by a timer for all the commits meanwhile
   (:class:`~semantic_orm.processing.DeferredSettle`), not by a write transaction of their own;
3. :mod:`~semantic_orm.applying` chunks, embeds and writes each row's current text, using the
   column's :class:`~semantic_orm.binding.ColumnBinding` (resolved once per column).

If the embedder or the store fails, the commit has already succeeded and the job stays, with
its attempts, last error and next retry time: nothing is lost.

An index serves each table from one schema: writes, searches, worker passes and the maintenance
tools through an engine whose ``schema_translate_map`` puts a table elsewhere than the index
used it are refused (:mod:`~semantic_orm.schemas`); a schema per tenant takes an index per
schema.

An index created before a fork resets itself in the child (:meth:`SemanticIndex._forked`):
its own lease token, none of the parent's waiting jobs, its own gates and retrier thread.

Columns are discovered lazily, when a flush, a statement, a search or a job first names them,
rather than on ``mapper_configured``: listening to mapper events would be a global hook (every
mapper of the process, at import time), while an index is installed on chosen sessions only, and
a worker in a fresh process finds a job's column from the process's ORM registries (or
``models=``) the first time it needs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import gc
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NoReturn, cast

from sqlalchemy import Connection, Engine, Table, func, inspect, select
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Mapper, Session, scoped_session, sessionmaker
from sqlalchemy.pool import SingletonThreadPool, StaticPool

from . import outbox
from .applying import Applier, Outage
from .binding import Bindings, ColumnBinding
from .embedding import DEFAULT_MODEL, Embedder, SentenceTransformerEmbedder
from .exc import ConfigurationError, first_line
from .forking import RenewedLock, in_forked_child
from .gate import WriteGate
from .mapping import SemanticColumn, all_mappers, semantic_columns, table_name
from .outbox import Job
from .processing import (
    Blocked,
    Processor,
    ProcessReport,
    RetryPolicy,
    async_engine,
    failure_wait,
    running_loop,
)
from .ranking import DEFAULT_FUSION, Fusion
from .rerank import Reranker
from .schemas import (
    Place,
    SchemaClaims,
    check_connection,
    database_of,
    jobs_at,
    translated,
)
from .staging import SessionTracker, Staged, StagingHooks, session_connection
from .stores.base import Store

__all__ = ["SemanticIndex", "index_for"]

log = logging.getLogger("semantic_orm")

DEFAULT_PATH_ENV = "SEMANTIC_ORM_PATH"

_installed: weakref.WeakKeyDictionary[Any, SemanticIndex] = weakref.WeakKeyDictionary()
_installed_lock = RenewedLock()
_open: weakref.WeakSet[SemanticIndex] = weakref.WeakSet()
"""The indexes not closed yet (one dropped unclosed goes with the collector): the last of those
sharing a store closes it."""
_OUTBOX_LOCK = 0x5E3A_0B0C  # PostgreSQL advisory lock serializing the outbox's creation
INLINE_HOLD = 30.0
"""Seconds an inline commit's jobs that are not born leased to it (other databases, a
PostgreSQL transaction that reads an older snapshot) are kept from workers while the
committing process claims and syncs them (after a crash, workers take them once this has
passed)."""
_BORN_LEASED = ("sqlite", "postgresql")
"""Databases where an inline commit's jobs are born leased to the committing process."""
_LEASE_MARGIN = 5.0
"""Seconds before its end a lease is no longer counted on (clocks, a slow statement)."""


def _new_token() -> str:
    """A processor token: host, pid (what finds the leases of dead local processes), nonce."""
    return f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


_live: weakref.WeakSet[SemanticIndex] = weakref.WeakSet()
"""Every index of this process, for :func:`_after_fork`."""


def _after_fork() -> None:
    for index in list(_live):
        index._forked()


def _async_types() -> tuple[type[Any], type[Any], type[Any]] | None:
    try:
        from sqlalchemy.ext.asyncio import AsyncSession, async_scoped_session, async_sessionmaker
    except ImportError:  # pragma: no cover - asyncio extension needs greenlet
        return None
    return AsyncSession, async_sessionmaker, async_scoped_session


def is_async_session(session: Any) -> bool:
    """Whether ``session`` is an ``AsyncSession`` or an ``async_scoped_session``."""
    found = _async_types()
    return found is not None and isinstance(session, (found[0], found[2]))


def blocking_engine(engine: Engine, call: str, instead: str) -> Engine:
    """``engine``, for a blocking ``call``; an async driver's is refused, ``instead`` saying
    what to do (it runs only awaited: SQLAlchemy raised MissingGreenlet).

    Raises:
        ConfigurationError: ``engine`` is an async driver's.
    """
    if engine.dialect.is_async:
        raise ConfigurationError(
            f"{call} blocks; {engine.url.render_as_string(hide_password=True)} is an async "
            f"engine, whose driver runs only awaited: {instead}"
        )
    return engine


def _listen_target(target: Any) -> Any:
    """What listeners attach to: a sessionmaker's private class, or the Session itself."""
    if isinstance(target, scoped_session):
        return _listen_target(target.session_factory)
    if isinstance(target, sessionmaker):
        return target.class_
    if isinstance(target, Session) or (isinstance(target, type) and issubclass(target, Session)):
        return target
    found = _async_types()
    if found is not None:
        async_session, async_maker, async_scoped = found
        if isinstance(target, async_scoped):
            return _listen_target(target.session_factory)
        if isinstance(target, async_session):
            return target.sync_session
        if isinstance(target, async_maker):
            sync_class = target.kw.get("sync_session_class") or Session
            if not getattr(sync_class, "_semantic_orm_private", False):
                # a private subclass, as sessionmaker makes for itself, so that listening is
                # scoped to this factory's sessions
                sync_class = type(
                    f"SemanticSync{sync_class.__name__}",
                    (sync_class,),
                    {"_semantic_orm_private": True},
                )
                target.kw["sync_session_class"] = sync_class
            return sync_class
        if isinstance(target, type) and issubclass(target, async_session):
            raise ConfigurationError(
                "install() takes an async_sessionmaker (or one AsyncSession), not the "
                "AsyncSession class: installing on the class would sync every async session"
            )
    raise ConfigurationError(
        "install() takes a sessionmaker, async_sessionmaker, scoped_session, a Session "
        f"subclass, a Session or an AsyncSession, got {target!r}"
    )


def _refuse_sharing(index: SemanticIndex, key: Any, other: Any, by: SemanticIndex) -> NoReturn:
    """Raise: ``index`` is to be installed on ``key``, which shares sessions with ``other``,
    where ``by`` is installed."""
    if by is index:
        whose, why = "this SemanticIndex", "every write would be queued twice"
    else:
        whose, why = (
            "another SemanticIndex",
            "both would queue every write, and only one would sync it",
        )
    raise ConfigurationError(
        f"{whose} is already installed on {_shown(other)}, which shares the sessions of "
        f"{_shown(key)}: {why}. A session is synced by one index, installed on one of the "
        "targets its sessions come from (uninstall the other first)."
    )


def _sharing(key: Any) -> tuple[Any, SemanticIndex] | None:
    """An installed target, other than ``key``, that shares sessions with it, and its index."""
    for other, by in list(_installed.items()):
        if other is not key and _overlap(key, other):
            return other, by
    return None


def _overlap(a: Any, b: Any) -> bool:
    """Whether two listen targets (Session subclasses or Sessions) share sessions: a class and
    its subclass, or a class and one of its sessions."""
    if isinstance(a, type) and isinstance(b, type):
        return issubclass(a, b) or issubclass(b, a)
    if isinstance(a, type):
        return isinstance(b, a)
    if isinstance(b, type):
        return isinstance(a, b)
    return False


def _shown(key: Any) -> str:
    """A listen target, as an error message names it."""
    if not isinstance(key, type):
        return f"one Session ({key!r})"
    if key is Session:
        return "the Session class (every session)"
    if getattr(key, "_semantic_orm_private", False):
        return "an async_sessionmaker"
    base = key.__mro__[1]
    if key.__name__ == base.__name__:  # the private subclass a sessionmaker makes
        return f"a sessionmaker (of {base.__qualname__})"
    return f"the Session subclass {key.__qualname__}"


def _sync_session(session: Any) -> Session:
    """The ``Session`` behind an ``AsyncSession``, a ``scoped_session`` or an
    ``async_scoped_session``."""
    if isinstance(session, scoped_session) or type(session).__name__ == "async_scoped_session":
        session = session()
    found = getattr(session, "sync_session", None)
    if isinstance(found, Session):
        return found
    return cast(Session, session)


def index_for(session: Any) -> SemanticIndex | None:
    """The index installed on ``session``, its factory or its class, if any.

    ``session`` may be a ``Session``, an ``AsyncSession`` or a ``scoped_session``.
    """
    session = _sync_session(session)
    try:
        found = _installed.get(session)
    except TypeError:  # not weak-referenceable (None, a mock): not a session of ours
        return None
    if found is not None:
        return found
    for cls in type(session).__mro__:
        found = _installed.get(cls)
        if found is not None:
            return found
    return None


def _mappers(models: Any) -> Iterable[Mapper[Any]]:
    """Mappers of a declarative base, a registry, a mapped class, or an iterable of those."""
    registry = getattr(models, "registry", None)
    if registry is not None and hasattr(registry, "mappers"):
        return list(registry.mappers)
    if hasattr(models, "mappers"):
        return list(models.mappers)
    if isinstance(models, type):
        return [inspect(models)]
    out: list[Mapper[Any]] = []
    for item in models:
        out.extend(_mappers(item))
    return out


class SemanticIndex:
    """Syncs ``SemanticText`` columns to a vector store and answers semantic searches.

    Args:
        store: The vector store. Defaults to an :class:`~semantic_orm.stores.EdgeStore` in the
            directory named by ``$SEMANTIC_ORM_PATH``, else ``./.semantic_orm``.
        embedder: The default embedder, for columns that name no model. Defaults to
            all-MiniLM-L6-v2 (loaded on first use).
        embedders: Embedders by model name, for columns declared with
            ``SemanticText(model=...)``. A name not listed is loaded with sentence-transformers.
        collection_prefix: Prepended to every collection name (to share one Qdrant server
            between applications).
        mode: ``"inline"`` syncs a commit's rows right after it, in the committing thread;
            ``"deferred"`` leaves them to a worker.
        models: Declarative base(s) or mapped classes whose SemanticText columns this index
            serves. By default, the columns of every mapped class of the process are found
            when a job, a flush or a search first names them.
        max_attempts: Permanent failures after which a job is dead-lettered.
        retry_base: Seconds before the first retry; doubled each attempt.
        retry_cap: Longest wait between retries, in seconds.
        lease: Seconds a processor may take over claimed jobs before others may take them.
        create_outbox: Create the outbox table on first use if it is missing. Set ``False`` when
            your migrations create it.
        fusion: How hybrid searches combine the dense and keyword rankings unless a search says
            otherwise (default :class:`~semantic_orm.ranking.ScoreFusion`); recorded with each
            collection the index creates.
        reranker: A :class:`~semantic_orm.rerank.Reranker` every search through this index
            uses unless it passes ``rerank=`` (``rerank=False`` turns it off).
    """

    def __init__(
        self,
        store: Store | None = None,
        embedder: Embedder | None = None,
        *,
        embedders: Mapping[str, Embedder] | None = None,
        collection_prefix: str = "",
        mode: Literal["inline", "deferred"] = "inline",
        models: Any = None,
        max_attempts: int = 5,
        retry_base: float = 1.0,
        retry_cap: float = 300.0,
        lease: float = 300.0,
        create_outbox: bool = True,
        fusion: Fusion | None = None,
        reranker: Reranker | None = None,
    ) -> None:
        if mode not in ("inline", "deferred"):
            raise ConfigurationError(
                f"SemanticIndex mode must be 'inline' or 'deferred', got {mode!r}"
            )
        if max_attempts < 1:
            raise ConfigurationError(f"SemanticIndex max_attempts must be >= 1, got {max_attempts}")
        for name, value in (("retry_base", retry_base), ("retry_cap", retry_cap)):
            if not value >= 0:
                raise ConfigurationError(f"SemanticIndex {name} must be >= 0, got {value}")
        if not lease > 0:
            raise ConfigurationError(f"SemanticIndex lease must be > 0 seconds, got {lease}")
        if reranker is not None and not isinstance(reranker, Reranker):
            raise ConfigurationError(
                "SemanticIndex reranker must be a Reranker (a name and score(query, passages)), "
                f"got {reranker!r}"
            )
        if store is None:
            from .stores.edge import EdgeStore

            store = EdgeStore(Path(os.environ.get(DEFAULT_PATH_ENV, ".semantic_orm")))
        self.store: Store = store
        with _installed_lock:
            _open.add(self)
        self.embedder: Embedder = embedder or SentenceTransformerEmbedder(DEFAULT_MODEL)
        self._embedders: dict[str, Embedder] = dict(embedders or {})
        self.collection_prefix = collection_prefix
        self.mode = mode
        self.create_outbox = create_outbox
        self.reranker = reranker
        self.policy = RetryPolicy(max_attempts, retry_base, retry_cap, lease)
        self.token = _new_token()
        self.fusion: Fusion = fusion or DEFAULT_FUSION
        self.bindings = Bindings(
            store, collection_prefix, self._embedder_named, self.fusion.describe()
        )
        self.applier = Applier(store, self.bindings.check, Outage(retry_base, min(retry_cap, 30.0)))
        self._schemas = SchemaClaims()
        self.processor = Processor(
            self._resolve,
            self.applier,
            self.policy,
            token=self.token,
            gate_for=self.gate_for,
            blocked=self._blocked,
            requeued=self._requeued,
            reach=self.reach,
        )
        self._tracker = SessionTracker(
            StagingHooks(
                register=self.bindings.register,
                prepare=self.prepare_outbox,
                born_leased=self._born_leased,
                lease=lease,
                carry=self.processor.later.carry,
                finished=self._finished,
                restore=self.processor.later.give_back,
                hold=self._hold,
                on_commit=self._on_commit,
                begin=self._begin,
                end=self._end,
                mapper_for=self._mapper_for,
                reach=self._reach_writing,
                ended=self._schemas.end,
            )
        )
        self._models = models
        self._discovered = False
        self._engines: weakref.WeakValueDictionary[str, Engine] = weakref.WeakValueDictionary()
        self._async_binds: weakref.WeakValueDictionary[str, Engine] = weakref.WeakValueDictionary()
        self._remembered: weakref.WeakSet[Engine] = weakref.WeakSet()  # (URLs rendered once)
        self._outbox_ready: weakref.WeakSet[Engine] = weakref.WeakSet()
        self._looked: weakref.WeakSet[Engine] = weakref.WeakSet()  # (see _first_look)
        self._gates: weakref.WeakKeyDictionary[Engine, WriteGate] = weakref.WeakKeyDictionary()
        self._joined: weakref.WeakKeyDictionary[Engine, weakref.WeakSet[Connection]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = RenewedLock(reentrant=True)
        self._retry = _Retrier(self)
        self._tasks: set[asyncio.Future[Any]] = set()
        self._aretrying: dict[Engine, tuple[asyncio.Task[None], asyncio.Event]] = {}
        _live.add(self)
        in_forked_child(_after_fork)

    def _forked(self) -> None:
        """In a process forked from this one's (a server that loads the app before forking its
        workers): a token of its own (leases, and the release of a dead process's, go by
        pid), none of the parent's finished jobs, fresh write gates and a retrier of its own
        (threads do not survive a fork; its locks are renewed by :mod:`semantic_orm.forking`),
        and none of the parent's pooled connections on the engines it used (install's look at
        the outbox, the retrier's passes): every process forked from one would otherwise talk
        through the same driver connection, reading each other's results."""
        for engine in list(self._remembered):
            if not _shared_pool(engine):  # (a database in memory: the child's copy is its own)
                engine.dispose(close=False)  # (not closed: they stay the parent's)
        self.token = _new_token()
        self.processor.forked(self.token)
        self._gates = weakref.WeakKeyDictionary()
        closed = self._retry.stopped()
        self._retry = _Retrier(self)
        if closed:
            self._retry.stop()
        self._tasks = set()  # the parent's event loop's
        self._aretrying = {}
        self._looked = weakref.WeakSet()  # each process looks for itself

    def __repr__(self) -> str:
        return f"SemanticIndex(store={self.store!r}, embedder={self.embedder!r})"

    # -- installation -------------------------------------------------------------------------

    def install(self, target: Any) -> None:
        """Sync the commits of ``target``'s sessions; installing twice is harmless.

        ``target`` is a ``sessionmaker``, an ``async_sessionmaker``, a ``scoped_session``, a
        ``Session`` subclass, or one ``Session`` or ``AsyncSession``.

        Raises:
            ConfigurationError: If another index is already installed on ``target``, or any
                index on a target sharing its sessions (a sessionmaker and one of its sessions,
                a Session class and a subclass).
        """
        key = _listen_target(target)
        for collected in (False, True):
            with _installed_lock:
                current = _installed.get(key)
                if current is not None and current is not self:
                    raise ConfigurationError(
                        f"another SemanticIndex is already installed on {_shown(key)}; "
                        "uninstall it first"
                    )
                found = _sharing(key)
                if found is None:
                    _installed[key] = self
                    break
                if collected:
                    _refuse_sharing(self, key, *found)
            # a factory dropped without uninstall may only await the collector (its class is
            # in reference cycles): not a conflict once collected
            del found
            gc.collect()
        bind = _factory_bind(target)
        if isinstance(getattr(bind, "sync_engine", None), Engine):  # an async factory's (for
            # the commands, before any transaction: see async_engine_for)
            self._async_binds.setdefault(_url_of(bind.sync_engine), bind.sync_engine)
        if isinstance(bind, Engine):
            self.remember_engine(bind)
            if self.create_outbox and not bind.dialect.is_async:  # async: at first use
                try:
                    with bind.begin() as conn:
                        self.prepare_outbox(conn)
                except (OperationalError, InterfaceError) as exc:  # not reachable yet (a
                    # service started before its database): the first transaction makes it
                    log.warning(
                        "semantic_orm: the outbox could not be checked at install, the "
                        "database failing (%s); the first transaction or worker pass will",
                        first_line(exc),
                    )
                else:
                    self._outbox_ready.add(bind)
            if self.mode == "inline":
                self._first_look(bind)
        self._tracker.install(key)

    def uninstall(self, target: Any) -> None:
        """Stop syncing ``target``'s sessions (and, once nothing is installed, retrying)."""
        key = _listen_target(target)
        self._tracker.remove(key)
        with _installed_lock:
            if _installed.get(key) is self:
                del _installed[key]
            still = any(index is self for index in _installed.values())
        if not still:
            self._retry.stop()
            self._retry = _Retrier(self)
        self.settle()  # what its last commits left, while the engines are known

    # -- columns and bindings -----------------------------------------------------------------

    def _embedder_named(self, name: str | None) -> Embedder:
        if name is None or name == self.embedder.name:
            return self.embedder
        with self._lock:
            found = self._embedders.get(name)
            if found is None:
                found = self._embedders[name] = SentenceTransformerEmbedder(name)
        return found

    def binding_for(self, column: SemanticColumn) -> ColumnBinding:
        """``column`` as this index resolves it: collection, embedder, chunker, fingerprint."""
        return self.bindings.binding_for(column)

    def register_models(self, models: Any) -> None:
        """Register the SemanticText columns of a declarative base, registry or classes."""
        for mapper in _mappers(models):
            for column in semantic_columns(mapper):
                self.bindings.register(column)

    def _discover(self) -> None:
        """Register the columns of ``models=``, or of every mapper of the process."""
        if self._models is not None:
            self.register_models(self._models)
        else:
            for mapper in all_mappers():
                for column in semantic_columns(mapper):
                    try:
                        self.bindings.register(column)
                    except ConfigurationError as exc:
                        log.warning("semantic_orm: %s", exc)

    def column_for(self, table: str, column: str) -> SemanticColumn | None:
        """The column an outbox job's ``table`` and ``column`` name (``None``: not mapped)."""
        found = self.bindings.column(table, column)
        if found is None:
            self._discover()
            found = self.bindings.column(table, column)
        return found

    def columns(self) -> list[SemanticColumn]:
        """Every SemanticText column this index serves (``models=``, else all it found)."""
        self._discover()
        return self.bindings.columns()

    def _resolve(self, table: str, column: str) -> ColumnBinding | None:
        found = self.column_for(table, column)
        return None if found is None else self.bindings.binding_for(found)

    def reach(self, bind: Any, columns: Iterable[SemanticColumn]) -> None:
        """Refuse to use ``columns``' rows through ``bind`` (an engine or connection) in
        another database or schema than this index already used them in (a database per
        tenant, or ``schema_translate_map``: see :mod:`semantic_orm.schemas`).

        Raises:
            ConfigurationError: Naming the column, both databases or schemas, and the fix.
        """
        claims = []
        for c in columns:
            place = _place(bind, c.column.table.schema)
            if place is None:  # an async engine, not asked yet (it cannot be asked here):
                return  # the first transaction or async search claims
            claims.append((c.table, place, c.label, None))
        self._schemas.claim(claims)

    def reach_session(self, session: Any, column: SemanticColumn) -> None:
        """:meth:`reach` through what ``session`` loads ``column``'s rows with (a search): its
        bind, and the connection its transaction holds there, if any."""
        sync = _sync_session(session)
        try:
            bind = sync.get_bind(mapper=column.mapper)
        except Exception:  # no bind: loading the rows fails on its own
            return
        conn = bind if isinstance(bind, Connection) else session_connection(sync, bind)
        if conn is not None:
            check_connection(conn, (column.column.table.schema,), column.label, None)
        self.reach(bind if conn is None else conn, (column,))

    def _reach_writing(
        self,
        writes: Sequence[tuple[Connection, Table, str]],
        options: Mapping[str, Any] | None,
        owner: object | None,
    ) -> None:
        """Writes of tables (each with what to call it) on connections (``options``: a
        statement's own), in transaction ``owner``: each connection translates as its engine
        does, this index keeps every table in one database and schema, and each engine's
        outbox in one schema (see :mod:`semantic_orm.schemas`); nothing is claimed unless all
        pass, and the claims go if ``owner`` does not commit."""
        claims = []
        for conn, table, what in writes:
            check_connection(conn, (table.schema, outbox.outbox.schema), what, options)
            place = _place(conn, table.schema)
            assert place is not None  # (asked through the connection)
            claims.append((table_name(table), place, what, jobs_at(conn, outbox.outbox)))
        self._schemas.claim(claims, owner)

    def _mapper_for(self, table: Table) -> Mapper[Any] | None:
        name = table_name(table)
        for col in self.bindings.columns():
            if col.table == name:
                return col.mapper
        for mapper in all_mappers():
            if any(table_name(t) == name for t in mapper.tables):
                return mapper
        return None

    def verify(self) -> None:
        """Check every column's collection now, e.g. when the application starts.

        Creates missing collections and raises on the first drifted one, instead of at the
        first search or sync.

        Raises:
            EmbeddingDriftError: A column's model, dimension or chunking differs from what built
                its collection; the message names the change and the command that fixes it.
        """
        for column in self.columns():
            self.bindings.check(self.binding_for(column))

    # -- engines and the outbox ---------------------------------------------------------------

    def remember_engine(self, engine: Engine) -> None:
        """Remember an engine whose sessions write jobs (for :meth:`drain` without arguments)."""
        if engine not in self._remembered:  # every transaction calls this: render the URL once
            self._remembered.add(engine)
            self._engines.setdefault(_url_of(engine), engine)

    def engine_for(self, bind: Engine | sessionmaker[Any] | Any = None) -> Engine:
        """The engine whose outbox to process: ``bind``'s, or the one installed sessions use.

        ``bind`` may be an ``Engine``, an ``AsyncEngine``, or a (async) sessionmaker bound to
        one.

        Raises:
            ConfigurationError: If ``bind`` is ``None`` and no single engine is known.
        """
        if isinstance(bind, Engine):
            return bind
        sync = getattr(bind, "sync_engine", None)
        if isinstance(sync, Engine):
            return sync
        if bind is not None:
            engine = _factory_bind(bind, ask=True)
            if engine is not None:
                return self.engine_for(engine)
            raise ConfigurationError(
                f"{bind!r} has no bind=Engine to process jobs with: pass the Engine"
            )
        if len(self._engines) == 1:
            return next(iter(self._engines.values()))
        raise ConfigurationError("pass the Engine (or sessionmaker) whose outbox to process")

    def async_engine_for(self) -> Engine | None:
        """The engine of the one async factory this index is installed on (its sync face), for
        a tool with no engine of its own to use (:meth:`engine_for` knows only the engines
        that wrote: an async one once a transaction ran); ``None`` if none or several."""
        found = list(self._async_binds.values())
        return found[0] if len(found) == 1 else None

    def gate_for(self, engine: Engine) -> WriteGate | None:
        """The write gate of a SQLite engine (``None`` for other databases)."""
        if engine.dialect.name != "sqlite":
            return None
        with self._lock:
            gate = self._gates.get(engine)
            if gate is None:
                gate = self._gates[engine] = WriteGate()
            return gate

    def _begin(self, engine: Engine, conn: Connection, joined: bool) -> None:
        if engine not in self._looked and self.mode == "inline":
            self._first_look(engine)
        self.remember_engine(engine)
        gate = self.gate_for(engine)
        if gate is not None:
            gate.enter()
        if joined:
            self._joined.setdefault(engine, weakref.WeakSet()).add(conn)

    def _end(self, engine: Engine, conn: Connection, joined: bool) -> None:
        gate = self.gate_for(engine)
        if gate is not None:
            gate.leave()

    def _blocked(self, engine: Engine) -> bool:
        """Whether a pass on ``engine`` would share an open transaction's driver connection."""
        if not _shared_pool(engine):
            return False
        gate = self.gate_for(engine)
        if gate is not None and gate.open_transactions():
            return True
        return any(c.in_transaction() for c in self._joined.get(engine, ()))

    def _born_leased(self, conn: Connection) -> str | None:
        """Jobs of an inline commit on SQLite or PostgreSQL are born leased to this index (no
        claim needed; on PostgreSQL where its isolation allows, see :func:`outbox.enqueue`)."""
        if self.mode == "inline" and conn.dialect.name in _BORN_LEASED:
            return self.token
        return None

    def _finished(self, conn: Connection) -> list[Job]:
        """This index's synced jobs in ``conn``'s database that wait to be deleted, while their
        birth leases hold (one that ran out may have been claimed again, even by this index)."""
        return [job for job in self.processor.later.waiting(conn.engine) if self._holds(job)]

    def _holds(self, job: Job) -> bool:
        """Whether ``job``'s birth lease holds for a while yet (a margin of a quarter of the
        lease, at most :data:`_LEASE_MARGIN` s, for clocks and a slow statement)."""
        return job.holds(min(_LEASE_MARGIN, self.policy.lease / 4))

    def _hold(self, conn: Connection) -> float:
        """Jobs of an inline commit elsewhere wait a moment for this process to claim them."""
        return INLINE_HOLD if self.mode == "inline" else 0.0

    def prepare_outbox(self, conn: Connection) -> None:
        """Make sure ``conn``'s database has the outbox, without failing the caller's work.

        The table is created in a transaction of its own (serialized on PostgreSQL), so that
        concurrent first commits cannot collide and a caller's rollback cannot undo it. Where
        the pool would hand back the caller's own driver connection (SQLite in memory), it is
        created in the caller's transaction instead, and checked again until a commit made it
        durable.
        """
        engine = conn.engine
        if not self.create_outbox or engine in self._outbox_ready:
            return
        if _shared_pool(engine):  # a second checkout would be this very driver connection
            outbox.create_tables(conn)
            return
        reading = _reading_locks(conn)
        if not reading and outbox.current(conn):  # found through the caller's connection: a
            # second one, for each of a burst of first transactions, could wait for the pool
            # they all hold
            self._outbox_ready.add(engine)
            return
        # SQLite whose driver has begun nothing (pysqlite begins at the first write): a
        # transaction of its own on the caller's connection, no second one needed either
        # (its BEGIN IMMEDIATE serializes concurrent first ones)
        aside = reading or conn.dialect.name != "sqlite"
        other = engine.connect() if aside else None  # (failing to connect is the database
        try:  # failing: raised as is)
            if other is None:
                _own_sqlite_transaction(conn, outbox.create_tables)
            else:
                with other, other.begin():
                    if other.dialect.name == "postgresql":
                        other.execute(select(func.pg_advisory_xact_lock(_OUTBOX_LOCK)))
                    outbox.create_tables(other)
        except Exception as exc:
            if not outbox.exists(conn):
                raise ConfigurationError(
                    f"semantic_orm could not create its outbox table {outbox.OUTBOX_TABLE!r} "
                    f"on {engine.url.render_as_string(hide_password=True)}: {exc}. Create it "
                    "with your migrations (semantic_orm.outbox.metadata) and pass "
                    "create_outbox=False"
                ) from exc
        self._outbox_ready.add(engine)

    # -- processing ---------------------------------------------------------------------------

    def _on_commit(self, engine: Engine, staged: Staged) -> None:
        """After a durable commit: sync its jobs inline, never blocking an event loop.

        A commit of an ``AsyncSession`` (an async driver) is synced by a task on its event loop
        (SQL awaited, embedding in a worker thread); a sync session used inside an event loop
        hands the work to a thread; anywhere else the committing thread syncs. Never raises.
        """
        self._outbox_ready.add(engine)
        self.remember_engine(engine)
        if self.mode != "inline":
            return
        loop = running_loop()
        if engine.dialect.is_async and loop is not None:
            self._track(loop.create_task(self._async_commit(engine, staged)))
        elif loop is not None:
            self._track(loop.run_in_executor(None, self._sync_commit, engine, staged))
        else:
            self._sync_commit(engine, staged)

    def _sync_commit(self, engine: Engine, staged: Staged) -> None:
        reports: list[ProcessReport] = []
        try:
            # born jobs whose lease ran out (a long transaction) are claimed like the others
            held = [job for job in staged.born if self._holds(job)]
            if held:  # deleted a moment later (see settle())
                defer = not _shared_pool(engine)  # one connection: a timer would wait for it
                born = self.processor.process(
                    engine, claimed=held, defer=defer, written=staged.known(), inline=True
                )
                reports.append(born)
            rest = _unborn(staged, held)
            if rest:
                reports.append(
                    self.processor.process(engine, ids=rest, limit=len(rest), inline=True)
                )
        except Exception:
            log.exception("semantic_orm: inline sync failed; the jobs stay in the outbox")
            reports.append(ProcessReport(blocked=True))
        if _troubled(reports):
            self._retry.poke(engine)

    def _first_look(self, engine: Engine) -> None:
        """At install or the first transaction on ``engine`` in this process: have the
        retrier look for jobs an earlier run left (a process killed between a commit and its
        sync), even if this process only reads or writes other rows. (Not in a database in
        memory: none outlives its process.)"""
        if _shared_pool(engine):
            self._looked.add(engine)
        elif not engine.dialect.is_async:
            self._looked.add(engine)
            self._retry.poke(engine)
        else:
            loop = running_loop()  # (an async engine's first look needs its event loop)
            if loop is not None:
                self._looked.add(engine)
                self._awake(engine, loop)

    def _requeued(self, engine: Engine) -> None:
        """A deferred settle queued rows again: have the retrier process them (an async
        driver's: the retrier on the loop that settled them)."""
        loop = running_loop()
        if engine.dialect.is_async and loop is not None:
            self._awake(engine, loop)
        else:
            self._retry.poke(engine)

    async def _async_commit(self, engine: Engine, staged: Staged) -> None:
        aengine = self.async_engine(engine)
        reports: list[ProcessReport] = []
        try:
            held = [job for job in staged.born if self._holds(job)]
            if held:  # deleted a moment later (see settle()), on this loop
                defer = not _shared_pool(engine)
                born = await self.processor.aprocess(
                    aengine, claimed=held, defer=defer, written=staged.known(), inline=True
                )
                reports.append(born)
            rest = _unborn(staged, held)
            if rest:
                reports.append(
                    await self.processor.aprocess(aengine, ids=rest, limit=len(rest), inline=True)
                )
        except Exception:
            log.exception("semantic_orm: inline sync failed; the jobs stay in the outbox")
            reports.append(ProcessReport(blocked=True))
        if _troubled(reports):
            self._awake(engine, asyncio.get_running_loop())

    def _awake(self, engine: Engine, loop: asyncio.AbstractEventLoop) -> None:
        """Have the async retrier of ``engine`` (an async driver's) look for due jobs now,
        started on ``loop`` if none runs there."""
        if self._retry.stopped():
            return
        running = self._aretrying.get(engine)
        if running is not None and not running[0].done() and running[0].get_loop() is loop:
            running[1].set()
            return
        wake = asyncio.Event()
        task = loop.create_task(self._aretry(engine, wake))
        self._aretrying[engine] = (task, wake)

    async def _aretry(self, engine: Engine, wake: asyncio.Event) -> None:
        """The async retrier: process an async engine's due jobs until none is pending,
        sleeping until the next is due or a commit's sync leaves something (``wake``).

        Like :class:`_Retrier`, on the event loop. What it waits for may be the lease of a
        commit's sync in flight (300 s by default): a commit that leaves something wakes it.
        """
        aengine = self.async_engine(engine)
        failures = 0
        try:
            while not self._retry.stopped():
                wake.clear()
                try:
                    if self._blocked(engine):  # (see _Retrier._pass)
                        raise Blocked
                    async with aengine.connect() as conn:
                        due = await conn.run_sync(_next_due)
                    if due is None:
                        return
                    wait = (due - outbox.utcnow()).total_seconds()
                    if wait <= 0 or self.processor.wanted(engine):
                        report = await self.processor.aprocess(aengine, limit=64)
                        if report.claimed and not report.blocked:
                            continue
                    failures = 0
                except Blocked:
                    wait = self._retry.interval
                except Exception:
                    failures += 1
                    log.debug("semantic_orm: background retry failed", exc_info=True)
                    wait = failure_wait(self._retry.interval, failures + 1)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), min(max(wait, 0.05), 60.0))
        finally:
            if self._aretrying.get(engine, (None,))[0] is asyncio.current_task():
                del self._aretrying[engine]

    def _track(self, task: asyncio.Future[Any]) -> None:
        """Keep a background task alive until it ends (``adrain`` waits for them)."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def async_engine(self, engine: Any) -> Any:
        """The ``AsyncEngine`` of ``engine`` (one of an async driver): the application's if it
        is alive (SQLAlchemy keeps a weak reference from one to the other), else a new one."""
        return async_engine(engine)

    def settle(self, bind: Any = None) -> None:
        """Delete the finished jobs of this process's inline commits now (``bind``'s, or all).

        A commit's synced jobs are deleted a moment later, on SQLite by the next commit's
        transaction, else (and elsewhere) by a timer
        (:class:`~semantic_orm.processing.DeferredSettle`); until then they hold their rows'
        leases. :meth:`drain`, :meth:`close`, :meth:`uninstall` and the maintenance
        functions settle first, so that they see the outbox as it is.
        """
        self.processor.later.flush(None if bind is None else self.engine_for(bind))

    async def asettle(self, bind: Any = None) -> None:
        """:meth:`settle` for an ``AsyncEngine`` (``bind``: one, or an async_sessionmaker
        bound to one), awaited on the running loop (:meth:`settle` only starts it there):
        :meth:`adrain` and :meth:`AsyncWorker.stop <semantic_orm.worker.AsyncWorker.stop>` do
        it, so that an application's shutdown leaves no finished job leased."""
        await self.processor.later.aflush(self.engine_for(bind))

    def process(self, bind: Any = None, *, limit: int = 256) -> ProcessReport:
        """Process one batch of due jobs; returns what happened.

        Raises:
            ConfigurationError: ``bind`` is (or the index's one engine is) an async engine:
                ``await`` :meth:`aprocess` instead.
        """
        engine = self._sync_engine(bind, "process", "aprocess")
        self._ready(engine)
        return self.processor.process(engine, limit=limit)

    def _sync_engine(self, bind: Any, name: str, awaited: str) -> Engine:
        """:meth:`engine_for` for a blocking call (``name``), refusing an async engine
        (:func:`blocking_engine`; ``awaited``: the method to await instead)."""
        return blocking_engine(
            self.engine_for(bind), f"{name}()", f"use await index.{awaited}(...)"
        )

    def _ready(self, engine: Engine) -> None:
        """Make sure a worker's database has the outbox (once per engine)."""
        if engine in self._outbox_ready or engine.dialect.is_async:
            return
        if not (self.create_outbox and _shared_pool(engine)):  # (in memory: commits make it)
            with engine.connect() as conn:
                self._check_outbox(conn)

    async def _aready(self, aengine: Any) -> None:
        """:meth:`_ready` for an ``AsyncEngine`` (an async worker, :meth:`adrain`)."""
        if aengine.sync_engine not in self._outbox_ready:
            async with aengine.connect() as conn:
                await conn.run_sync(self._check_outbox)

    def _check_outbox(self, conn: Connection) -> None:
        """Create the outbox if missing (``create_outbox``), else make sure it is there.

        Raises:
            ConfigurationError: No outbox and ``create_outbox=False``, naming the migration.
        """
        if self.create_outbox:
            self.prepare_outbox(conn)
            return
        if not outbox.exists(conn):
            raise ConfigurationError(
                f"the database has no {outbox.OUTBOX_TABLE} table and the index was made "
                "with create_outbox=False: run the migration that creates it "
                "(semantic_orm.outbox.metadata)"
            )
        self._outbox_ready.add(conn.engine)

    def drain(
        self, bind: Any = None, *, timeout: float | None = 60.0, limit: int = 256
    ) -> ProcessReport:
        """Block until no job is pending (read-your-writes for tests and scripts).

        Jobs waiting for a retry are waited for; dead-lettered jobs are not.

        Raises:
            TimeoutError: Jobs are still pending after ``timeout`` seconds; the message names
                them, with their attempts and last error.
            ConfigurationError: ``bind`` is (or the index's one engine is) an async engine:
                ``await`` :meth:`adrain` instead.
        """
        engine = self._sync_engine(bind, "drain", "adrain")
        self._ready(engine)
        total = ProcessReport()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            report = self.processor.process(engine, limit=limit)
            total.add(report)
            expired = deadline is not None and time.monotonic() > deadline
            if report.claimed and not expired:
                continue
            self.settle(engine)
            with engine.connect() as conn:
                due = _next_due(conn)
                if due is None:
                    return total
                if expired:
                    raise TimeoutError(_stuck(conn, timeout))
            wait = (due - outbox.utcnow()).total_seconds()
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
            time.sleep(min(max(wait, 0.01), 0.25))

    async def aprocess(self, bind: Any = None, *, limit: int = 256) -> ProcessReport:
        """:meth:`process` for an ``AsyncEngine`` (or an ``async_sessionmaker`` bound to one)."""
        aengine = self.async_engine(self.engine_for(bind))
        await self._aready(aengine)
        return await self.processor.aprocess(aengine, limit=limit)

    async def adrain(
        self, bind: Any = None, *, timeout: float | None = 60.0, limit: int = 256
    ) -> ProcessReport:
        """:meth:`drain` for async applications: waits for the syncs that commits started, then
        processes every pending job, without blocking the event loop.

        Raises:
            TimeoutError: Jobs are still pending after ``timeout`` seconds (the message names
                them).
        """
        aengine = self.async_engine(self.engine_for(bind))
        await self._aready(aengine)
        deadline = None if timeout is None else time.monotonic() + timeout
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            await asyncio.wait(pending, timeout=left)
        total = ProcessReport()
        while True:
            report = await self.processor.aprocess(aengine, limit=limit)
            total.add(report)
            expired = deadline is not None and time.monotonic() > deadline
            if report.claimed and not expired:
                continue
            await self.asettle(aengine)  # (as drain() settles)
            async with aengine.connect() as conn:
                due = await conn.run_sync(_next_due)
                if due is None:
                    return total
                if expired:
                    raise TimeoutError(await conn.run_sync(_stuck, timeout))
            wait = (due - outbox.utcnow()).total_seconds()
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
            await asyncio.sleep(min(max(wait, 0.01), 0.25))

    def close(self) -> None:
        """Delete the finished jobs of inline commits, stop background retries and close the
        vector store, unless another open index uses it (an index per tenant on one shared
        store: the last one's close closes it)."""
        self.processor.later.close()
        self._retry.stop()
        with _installed_lock:
            _open.discard(self)
            shared = any(other.store is self.store for other in _open)
        if not shared:
            self.store.close()


def _place(bind: Engine | Connection, schema: str | None) -> Place | None:
    """Where a table declared in ``schema`` is through ``bind``: the schema its engine
    translates ``schema`` into (the connection's own map is checked apart), and that schema's
    database (``None``: an async engine that cannot be asked here)."""
    reached = translated(schema, bind.engine.get_execution_options())
    found = database_of(bind, reached)
    return None if found is None else Place(found[0], reached, found[1])


def _unborn(staged: Staged, held: Sequence[Job]) -> list[int]:
    """The ids of a commit's jobs but those it holds (born leased to this index, their leases
    holding yet)."""
    born = {job.id for job in held}
    return [i for i in staged.ids if i not in born]


def _troubled(reports: list[ProcessReport]) -> bool:
    """Whether a sync left something to retry."""
    return any(r.retried or r.lost or r.skipped or r.blocked or r.unknown for r in reports)


def _next_due(conn: Connection) -> dt.datetime | None:
    if not outbox.exists(conn):
        return None
    return outbox.next_due(conn)


def _stuck(conn: Connection, timeout: float | None) -> str:
    rows = outbox.pending(conn, limit=5)
    total = sum(c["pending"] for c in outbox.counts(conn).values())
    listed = "; ".join(
        f"{r['table_name']}.{r['column_name']} {r['row_pk']} (attempts {r['attempts']}"
        + (f", last error: {r['last_error'][:200]}" if r["last_error"] else "")
        + (", claimed by another processor" if r["claimed_by"] and not r["last_error"] else "")
        + ")"
        for r in rows
    )
    return f"semantic_orm: {total} jobs still pending after {timeout} s: {listed}"


def _reading_locks(conn: Connection) -> bool:
    """Whether a read through ``conn`` would hold a lock that keeps another connection from
    creating a table until ``conn``'s transaction ends: SQLite's shared lock, once its driver
    has begun a transaction (an explicit ``BEGIN``; pysqlite's default begins at the first
    write, so its reads before that hold nothing once done)."""
    if conn.dialect.name != "sqlite":
        return False
    raw = conn.connection.dbapi_connection
    raw = getattr(raw, "_connection", raw)  # aiosqlite's, under SQLAlchemy's adapter
    return bool(getattr(raw, "in_transaction", True))


def _own_sqlite_transaction(conn: Connection, work: Callable[[Connection], None]) -> None:
    """Run ``work`` on ``conn`` (SQLite, its driver in no transaction) in a transaction of its
    own, committed before returning: the caller's transaction begins after it, at its first
    write, as it would have."""
    conn.exec_driver_sql("BEGIN IMMEDIATE")
    try:
        work(conn)
    except BaseException:
        conn.exec_driver_sql("ROLLBACK")
        raise
    conn.exec_driver_sql("COMMIT")


def _shared_pool(engine: Engine) -> bool:
    """Whether ``engine``'s pool hands callers the same driver connection (SQLite in memory)."""
    return isinstance(engine.pool, (StaticPool, SingletonThreadPool))


def _url_of(engine: Engine) -> str:
    """``engine``'s URL as the index keys its engines (no password)."""
    return engine.url.render_as_string(hide_password=True)


def _factory_bind(target: Any, *, ask: bool = False) -> Any:
    """The ``bind`` of a (scoped / async) sessionmaker or a session, if any.

    With ``ask``, a scoped session with no configured bind is asked for its session's
    (Flask-SQLAlchemy chooses the engine in ``get_bind()``, inside an application context).
    """
    factory = getattr(target, "session_factory", None)  # scoped_session, async_scoped_session
    if factory is not None:
        found = _factory_bind(factory)
        return found if found is not None or not ask else _factory_bind(target())
    kw = getattr(target, "kw", None)
    if isinstance(kw, dict):
        return kw.get("bind")
    if isinstance(target, Session) or hasattr(target, "sync_session"):
        session = _sync_session(target)
        try:
            return session.get_bind()  # Flask-SQLAlchemy picks the engine in get_bind()
        except Exception:
            return None
    return None


class _Retrier:
    """Retries failed jobs in a background thread, so inline mode needs no worker.

    The first transaction on an engine in this process pokes it (jobs an earlier run left
    behind; ``install`` on a factory bound to it, already), and so does every commit whose
    sync failed. It then processes due jobs until none is left and sleeps
    until the next retry is due, for as long as jobs are pending. It never runs in the
    committing thread, so a backlog never slows a commit.
    """

    def __init__(self, index: SemanticIndex, interval: float = 1.0) -> None:
        self._index = weakref.ref(index)
        self.interval = interval
        self._wake = threading.Event()
        self._stopped = threading.Event()
        weakref.finalize(index, self.stop)  # an index dropped without close(): the thread ends
        self._engines: weakref.WeakSet[Engine] = weakref.WeakSet()
        self._thread: threading.Thread | None = None
        self._lock = RenewedLock()

    def poke(self, engine: Engine) -> None:
        """Look for due jobs on ``engine`` soon (a first look, or a sync that failed)."""
        if self._stopped.is_set():
            return
        self._engines.add(engine)
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="semantic-orm-retry", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        sleep: float | None = None
        failures: weakref.WeakKeyDictionary[Engine, int] = weakref.WeakKeyDictionary()
        while not self._stopped.is_set():
            self._wake.wait(sleep)
            self._wake.clear()
            sleep = self._round(failures)
            if self._index() is None:
                return

    def _round(self, failures: weakref.WeakKeyDictionary[Engine, int]) -> float | None:
        """A pass on each engine; seconds until the next is due (``None``: nothing pending).
        (A method of its own: the index and the engines are not held while the thread waits,
        so that they can go meanwhile.)"""
        sleep: float | None = None
        for engine in list(self._engines):
            index = self._index()
            if index is None or self._stopped.is_set():
                return None
            try:
                left = self._pass(index, engine)
                failures.pop(engine, None)
            except Exception:
                log.debug("semantic_orm: background retry failed", exc_info=True)
                failures[engine] = failures.get(engine, 0) + 1
                left = failure_wait(self.interval, failures[engine] + 1)
            if left is not None:  # wake up when the next retry is due
                left = min(max(left, self.interval / 20), 60.0)
                sleep = left if sleep is None else min(sleep, left)
        return sleep

    def _pass(self, index: SemanticIndex, engine: Engine) -> float | None:
        """Process ``engine``'s due jobs; seconds until the next is due (``None``: none is
        pending, or the database has no outbox yet)."""
        processor = index.processor
        if processor.blocked(engine):  # (a checkout would be a session's driver connection,
            return self.interval  # and its return would roll the session's transaction back)
        with engine.connect() as conn:
            due = _next_due(conn)
        if due is not None and (due <= outbox.utcnow() or processor.wanted(engine)):
            while not self._stopped.is_set():
                report = processor.process(engine, limit=64)
                if report.blocked and processor.wanted(engine):
                    return self.interval
                if not report.claimed or report.blocked:
                    break
            with engine.connect() as conn:
                due = _next_due(conn)
        return None if due is None else (due - outbox.utcnow()).total_seconds()

    def stopped(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stopped.is_set()

    def stop(self) -> None:
        """Stop the thread (at the end of its current pass)."""
        self._stopped.set()
        self._wake.set()
