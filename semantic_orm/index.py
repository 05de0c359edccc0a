"""``SemanticIndex``: where vectors live, which model makes them, and which sessions sync.

The index is the manager that the ``SemanticText`` marker type leaves the work to. It owns a
vector store and the embedders, and it is installed explicitly on the sessions whose commits
should reach the store::

    index = SemanticIndex(store=EdgeStore("./vectors"))    # default model: all-MiniLM-L6-v2
    SessionLocal = sessionmaker(engine)
    index.install(SessionLocal)       # every session of this factory now syncs on commit
    ...
    index.uninstall(SessionLocal)     # and stops

Installing on a ``sessionmaker`` listens on that factory's private Session subclass only;
installing on one ``Session`` scopes it to that session. Importing semantic_orm registers
nothing. ``Model.semantic_search(session, ...)`` finds the index installed for its session.

Every change is recorded as an outbox job in the writer's own transaction
(:mod:`semantic_orm.outbox`). With ``mode="inline"`` (the default) the jobs of a commit are
processed right after it, in the committing thread; with ``mode="deferred"`` they wait for a
worker (:class:`~semantic_orm.worker.Worker`, ``semantic-orm worker``). If the embedder or the
store fails, the commit has already succeeded and the job stays, with its attempts, last error
and next retry time: nothing is lost, and :meth:`SemanticIndex.drain` or a worker finishes it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import Connection, Engine, inspect, select
from sqlalchemy.orm import Mapper, Session, sessionmaker

from . import __version__, outbox
from .chunking import Chunker
from .embedding import DEFAULT_MODEL, Embedder, SentenceTransformerEmbedder
from .exc import CollectionMismatchError, ConfigurationError, EmbeddingDriftError
from .mapping import SemanticColumn, semantic_columns
from .stores.base import CollectionSpec, VectorStore
from .sync import JobKey, ProcessReport, SessionTracker, Syncer, fingerprint

__all__ = ["SemanticIndex", "index_for"]

log = logging.getLogger("semantic_orm")

DEFAULT_PATH_ENV = "SEMANTIC_ORM_PATH"

_installed: weakref.WeakKeyDictionary[Any, SemanticIndex] = weakref.WeakKeyDictionary()
_installed_lock = threading.Lock()


def _listen_target(target: Any) -> Any:
    """What listeners attach to: a sessionmaker's private class, or the Session itself."""
    if isinstance(target, sessionmaker):
        return target.class_
    if isinstance(target, Session) or (isinstance(target, type) and issubclass(target, Session)):
        return target
    raise ConfigurationError(
        f"install() takes a sessionmaker, a Session subclass or a Session, got {target!r}"
    )


def index_for(session: Session) -> SemanticIndex | None:
    """The index installed on ``session``, its sessionmaker or its class, if any."""
    found = _installed.get(session)
    if found is not None:
        return found
    for cls in type(session).__mro__:
        found = _installed.get(cls)
        if found is not None:
            return found
    return None


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
        mode: ``"inline"`` processes a commit's jobs right after it, in the committing thread;
            ``"deferred"`` leaves them to a worker.
        models: Declarative base(s) or mapped classes whose SemanticText columns a worker in a
            fresh process must know (columns seen in a flush are known anyway).
        max_attempts: Failed attempts after which a permanently failing job is dead-lettered.
        retry_base: Seconds before the first retry; doubled each attempt.
        retry_cap: Longest wait between retries, in seconds.
        create_outbox: Create the outbox table on first use if it is missing. Set ``False`` when
            your migrations create it.
    """

    def __init__(
        self,
        store: VectorStore | None = None,
        embedder: Embedder | None = None,
        *,
        embedders: Mapping[str, Embedder] | None = None,
        collection_prefix: str = "",
        mode: Literal["inline", "deferred"] = "inline",
        models: Any = None,
        max_attempts: int = 5,
        retry_base: float = 1.0,
        retry_cap: float = 300.0,
        create_outbox: bool = True,
    ) -> None:
        if mode not in ("inline", "deferred"):
            raise ConfigurationError(
                f"SemanticIndex mode must be 'inline' or 'deferred', got {mode!r}"
            )
        if max_attempts < 1:
            raise ConfigurationError(f"SemanticIndex max_attempts must be >= 1, got {max_attempts}")
        if store is None:
            from .stores.edge import EdgeStore

            store = EdgeStore(Path(os.environ.get(DEFAULT_PATH_ENV, ".semantic_orm")))
        self.store = store
        self.embedder: Embedder = embedder or SentenceTransformerEmbedder(DEFAULT_MODEL)
        self._embedders: dict[str, Embedder] = dict(embedders or {})
        self.collection_prefix = collection_prefix
        self.mode = mode
        self.max_attempts = max_attempts
        self.retry_base = retry_base
        self.retry_cap = retry_cap
        self.create_outbox = create_outbox
        self._syncer = Syncer(self)
        self._tracker = SessionTracker(self)
        self._ensured: set[str] = set()
        self._searchable: set[str] = set()  # drifted in chunking only: searchable, not writable
        self._chunkers: dict[int, Chunker] = {}
        self._fingerprints: dict[int, str] = {}
        self._columns: dict[tuple[str, str], SemanticColumn] = {}
        self._models = models
        self._engines: dict[int, Engine] = {}
        self._outbox_ready: set[int] = set()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SemanticIndex(store={self.store!r}, embedder={self.embedder!r})"

    # -- installation -------------------------------------------------------------------------

    def install(self, target: sessionmaker[Any] | type[Session] | Session) -> None:
        """Sync the commits of ``target``'s sessions; installing twice is harmless.

        Raises:
            ConfigurationError: If another index is already installed on ``target``.
        """
        key = _listen_target(target)
        with _installed_lock:
            current = _installed.get(key)
            if current is not None and current is not self:
                raise ConfigurationError(
                    f"another SemanticIndex is already installed on {target!r}; uninstall it first"
                )
            _installed[key] = self
        bind = target.kw.get("bind") if isinstance(target, sessionmaker) else None
        if isinstance(bind, Engine):
            self.remember_engine(bind)
            if self.create_outbox:
                with bind.begin() as conn:
                    self.ensure_outbox(conn)
                self.outbox_committed(bind)
        self._tracker.install(key)

    def uninstall(self, target: sessionmaker[Any] | type[Session] | Session) -> None:
        """Stop syncing ``target``'s sessions."""
        key = _listen_target(target)
        self._tracker.remove(key)
        with _installed_lock:
            if _installed.get(key) is self:
                del _installed[key]

    # -- configuration ------------------------------------------------------------------------

    def collection_name(self, column: SemanticColumn) -> str:
        """The collection holding ``column``'s vectors."""
        return column.collection(self.collection_prefix)

    def embedder_for(self, column: SemanticColumn) -> Embedder:
        """The embedder for ``column``: its declared model, else the index's default."""
        name = column.settings.model
        if name is None or name == self.embedder.name:
            return self.embedder
        with self._lock:
            found = self._embedders.get(name)
            if found is None:
                found = self._embedders[name] = SentenceTransformerEmbedder(name)
        return found

    def chunker_for(self, column: SemanticColumn) -> Chunker:
        """The chunker ``column``'s settings describe (built once)."""
        key = id(column.settings)
        found = self._chunkers.get(key)
        if found is None:
            found = self._chunkers[key] = column.settings.make_chunker()
        return found

    def spec_for(self, column: SemanticColumn) -> CollectionSpec:
        """What ``column``'s collection must hold."""
        embedder = self.embedder_for(column)
        return CollectionSpec(
            name=self.collection_name(column),
            dimension=embedder.dimension,
            model=embedder.name,
            metadata={
                "chunker": self.chunker_for(column).config(),
                "table": column.table,
                "column": column.column.name,
                "semantic_orm": __version__,
            },
        )

    def ensure_collection(self, column: SemanticColumn, *, for_search: bool = False) -> None:
        """Create ``column``'s collection if needed; refuse one its vectors do not fit.

        Args:
            column: The semantic column.
            for_search: Only searching: a collection chunked with other settings still answers
                (its vectors come from the same model), with a warning; writing to it does not.

        Raises:
            EmbeddingDriftError: The collection was built by another model or dimension (or,
                when writing, other chunk settings). The message names each change and the
                command that rebuilds the collection.
        """
        name = self.collection_name(column)
        if name in self._ensured or (for_search and name in self._searchable):
            return
        spec = self.spec_for(column)
        try:
            self.store.ensure_collection(spec)
        except CollectionMismatchError as exc:
            changes = drift(self.store.collection_info(name), spec)
            if not changes:
                raise  # not a setting that changed (e.g. a collection of an older layout)
            raise self._drift_error(column, name, changes) from exc
        changes = drift(self.store.collection_info(name), spec)
        if not changes:
            self._ensured.add(name)
            return
        if for_search and not {"model", "dimension"} & set(changes):
            log.warning("semantic_orm: %s", self._drift_error(column, name, changes))
            self._searchable.add(name)
            return
        raise self._drift_error(column, name, changes)

    @property
    def syncer(self) -> Syncer:
        """The object that applies sync operations (used by maintenance tools)."""
        return self._syncer

    def verify(self) -> None:
        """Check every registered column's collection now, e.g. when the application starts.

        Creates missing collections and raises on the first drifted one, instead of at the
        first search or sync.

        Raises:
            EmbeddingDriftError: A column's model, dimension or chunking differs from what built
                its collection; the message names the change and the command that fixes it.
        """
        for column in self.columns():
            self.ensure_collection(column)

    def forget_collection(self, column: SemanticColumn) -> None:
        """Check ``column``'s collection again on next use (after a rebuild switched it)."""
        name = self.collection_name(column)
        self._ensured.discard(name)
        self._searchable.discard(name)

    def _drift_error(
        self, column: SemanticColumn, name: str, changes: dict[str, tuple[Any, Any]]
    ) -> EmbeddingDriftError:
        listed = "; ".join(f"{key}: {old!r} -> {new!r}" for key, (old, new) in changes.items())
        model = column.model
        if {"model", "dimension"} & set(changes):
            meanwhile = (
                "Searching it with the new model would compare unrelated vectors, so searches and "
                "writes are refused. Rebuild it (a deployment still on the old settings can serve "
                "searches meanwhile)"
            )
        else:
            meanwhile = (
                "Searches still use it (same model); writes wait in the outbox. Rebuild it "
                "(searches keep using the current collection until the switch)"
            )
        return EmbeddingDriftError(
            f"{column.label} has changed since its collection {name!r} was built ({listed}). "
            f"{meanwhile}: semantic-orm reindex MODULE:index "
            f"{model.__module__}:{model.__qualname__} --rebuild (or "
            f"semantic_orm.maintenance.rebuild(index, {model.__qualname__})). To keep the old "
            "vectors instead, restore the previous settings.",
            column=column.label,
            collection=name,
            changes=changes,
        )

    def fingerprint(self, column: SemanticColumn) -> str:
        """Digest of the model and chunking that produce ``column``'s vectors."""
        key = id(column.settings)
        found = self._fingerprints.get(key)
        if found is None:
            embedder = self.embedder_for(column)
            found = fingerprint(
                embedder.name, embedder.dimension, self.chunker_for(column).config()
            )
            self._fingerprints[key] = found
        return found

    # -- columns ------------------------------------------------------------------------------

    def register_column(self, column: SemanticColumn) -> None:
        """Remember ``column`` so that jobs naming its table and column can be processed."""
        self._columns.setdefault((column.table, column.column.name), column)

    def register_models(self, models: Any) -> None:
        """Register the SemanticText columns of a declarative base, registry or classes."""
        for mapper in _mappers(models):
            for column in semantic_columns(mapper):
                self.register_column(column)

    def column_for(self, table: str, column: str) -> SemanticColumn | None:
        """The registered column for an outbox job's ``table`` and ``column``."""
        found = self._columns.get((table, column))
        if found is None and self._models is not None:
            self.register_models(self._models)
            found = self._columns.get((table, column))
        return found

    def columns(self) -> list[SemanticColumn]:
        """Every registered SemanticText column."""
        if self._models is not None:
            self.register_models(self._models)
        return list(self._columns.values())

    # -- the outbox and syncing ---------------------------------------------------------------

    def ensure_outbox(self, conn: Connection) -> None:
        """Create the outbox table on ``conn``'s database if missing, in ``conn``'s transaction.

        The check stops once a transaction that saw the table has committed
        (:meth:`outbox_committed`): a table created in a transaction that rolls back is gone.
        """
        if self.create_outbox and id(conn.engine) not in self._outbox_ready:
            outbox.outbox.create(conn, checkfirst=True)

    def outbox_committed(self, engine: Engine) -> None:
        """Record that ``engine``'s database has the outbox table for good."""
        self._outbox_ready.add(id(engine))

    def remember_engine(self, engine: Engine) -> None:
        """Remember an engine whose sessions wrote jobs (for :meth:`drain` without arguments)."""
        self._engines.setdefault(id(engine), engine)

    def committed(self, engine: Engine, keys: Sequence[JobKey]) -> None:
        """Called after a commit wrote jobs for ``keys``: process them now in inline mode.

        Never raises: the commit has happened, and a failed job stays in the outbox.
        """
        self.outbox_committed(engine)
        if self.mode != "inline":
            return
        try:
            self._syncer.process(engine, keys=keys, limit=max(len(keys) * 2, 16))
        except Exception:
            log.exception("semantic_orm: inline sync failed; the jobs stay in the outbox")

    def engine_for(self, bind: Engine | sessionmaker[Any] | None = None) -> Engine:
        """The engine whose outbox to process: ``bind``'s, or the one installed sessions use.

        Raises:
            ConfigurationError: If ``bind`` is ``None`` and no single engine is known.
        """
        if isinstance(bind, Engine):
            return bind
        if isinstance(bind, sessionmaker):
            engine = bind.kw.get("bind")
            if isinstance(engine, Engine):
                return engine
            raise ConfigurationError("that sessionmaker has no bind=Engine to process jobs with")
        if len(self._engines) == 1:
            return next(iter(self._engines.values()))
        raise ConfigurationError("pass the Engine (or sessionmaker) whose outbox to process")

    def process(
        self, bind: Engine | sessionmaker[Any] | None = None, *, limit: int = 256
    ) -> ProcessReport:
        """Process one batch of due jobs; returns what happened."""
        return self._syncer.process(self.engine_for(bind), limit=limit)

    def drain(
        self,
        bind: Engine | sessionmaker[Any] | None = None,
        *,
        timeout: float | None = 60.0,
        limit: int = 256,
    ) -> ProcessReport:
        """Block until no job is pending (read-your-writes for tests and scripts).

        Jobs waiting for a retry are waited for; dead-lettered jobs are not.

        Raises:
            TimeoutError: If jobs are still pending after ``timeout`` seconds.
        """
        engine = self.engine_for(bind)
        total = ProcessReport()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            report = self._syncer.process(engine, limit=limit)
            for name in ("claimed", "done", "retried", "dead", "skipped"):
                setattr(total, name, getattr(total, name) + getattr(report, name))
            if report.claimed:
                continue
            with engine.connect() as conn:
                with conn.begin():
                    self.ensure_outbox(conn)
                    pending = conn.execute(
                        select(outbox.outbox.c.next_attempt_at)
                        .where(outbox.outbox.c.dead.is_(False))
                        .order_by(outbox.outbox.c.next_attempt_at)
                        .limit(1)
                    ).first()
            if pending is None:
                return total
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"semantic_orm: jobs still pending after {timeout} s")
            time.sleep(0.05)

    def close(self) -> None:
        """Close the vector store."""
        self.store.close()


def drift(recorded: Mapping[str, Any] | None, spec: CollectionSpec) -> dict[str, tuple[Any, Any]]:
    """What differs between a collection's recorded metadata and what ``spec`` would record.

    Compares the model, the dimension and each chunker setting; the library version is not a
    difference. Settings a collection did not record (older servers) are not compared.

    Returns:
        ``{setting: (recorded, declared)}``, empty when nothing changed.
    """
    if not recorded:
        return {}
    changes: dict[str, tuple[Any, Any]] = {}
    for key, declared in (("model", spec.model), ("dimension", spec.dimension)):
        if key in recorded and recorded[key] != declared:
            changes[key] = (recorded[key], declared)
    old = recorded.get("chunker")
    new = spec.metadata.get("chunker")
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        for key in sorted(set(old) | set(new)):
            if old.get(key) != new.get(key):
                changes[f"chunker.{key}"] = (old.get(key), new.get(key))
    return changes


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
