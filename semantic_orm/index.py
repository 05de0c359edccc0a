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

Sync runs right after commit, in the committing thread. If the embedder or the store fails, the
commit itself has already succeeded: the failed ops are kept in :attr:`SemanticIndex.failed`,
reported through the ``sync-failed`` signal and a log warning, and :meth:`retry_failed` replays
them.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from . import __version__
from .chunking import Chunker
from .embedding import DEFAULT_MODEL, Embedder, SentenceTransformerEmbedder
from .exc import ConfigurationError
from .mapping import SemanticColumn
from .stores.base import CollectionSpec, VectorStore
from .sync import SessionTracker, Syncer, SyncOp, SyncReport

__all__ = ["SemanticIndex", "index_for"]

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
    """

    def __init__(
        self,
        store: VectorStore | None = None,
        embedder: Embedder | None = None,
        *,
        embedders: Mapping[str, Embedder] | None = None,
        collection_prefix: str = "",
    ) -> None:
        if store is None:
            from .stores.edge import EdgeStore

            store = EdgeStore(Path(os.environ.get(DEFAULT_PATH_ENV, ".semantic_orm")))
        self.store = store
        self.embedder: Embedder = embedder or SentenceTransformerEmbedder(DEFAULT_MODEL)
        self._embedders: dict[str, Embedder] = dict(embedders or {})
        self.collection_prefix = collection_prefix
        self.failed: dict[tuple[str, str], tuple[SyncOp, BaseException]] = {}
        self._syncer = Syncer(self)
        self._tracker = SessionTracker(self._on_commit, self.collection_name)
        self._ensured: set[str] = set()
        self._chunkers: dict[int, Chunker] = {}
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

    def ensure_collection(self, column: SemanticColumn) -> None:
        """Create ``column``'s collection if needed; refuse one of another model or dimension."""
        name = self.collection_name(column)
        if name in self._ensured:
            return
        self.store.ensure_collection(self.spec_for(column))
        self._ensured.add(name)

    # -- syncing ------------------------------------------------------------------------------

    def sync(self, ops: Sequence[SyncOp]) -> SyncReport:
        """Apply ``ops`` now; failures are returned and kept in :attr:`failed` for retry.

        A row that syncs successfully clears any older failure for it, so a retry never
        replaces newer content with an older value.
        """
        report = self._syncer.apply(ops)
        failed_keys: set[tuple[str, str]] = set()
        with self._lock:
            for group, exc in report.failed:
                for op in group:
                    key = (self.collection_name(op.column), op.pk)
                    self.failed[key] = (op, exc)
                    failed_keys.add(key)
            for op in ops:
                key = (self.collection_name(op.column), op.pk)
                if key not in failed_keys:
                    self.failed.pop(key, None)
        return report

    def _on_commit(self, ops: list[SyncOp]) -> None:
        self.sync(ops)

    def retry_failed(self) -> SyncReport:
        """Replay the latest failed op of each row; ones that fail again stay in :attr:`failed`."""
        with self._lock:
            pending = [op for op, _ in self.failed.values()]
        return self.sync(pending)

    def close(self) -> None:
        """Close the vector store."""
        self.store.close()
