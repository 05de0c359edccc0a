"""Syncing committed changes to the vector store.

Two halves, kept apart so that a durable outbox can replace the first later:

**Staging** (:class:`SessionTracker`). Listeners on a ``sessionmaker`` or ``Session`` watch each
flush. ``before_flush`` refuses values that cannot be indexed, naming the model and column.
``after_flush`` (primary keys exist by then) records one :class:`SyncOp` per changed
``SemanticText`` attribute, keyed by the transaction that flushed it: the innermost savepoint, or
the session's root transaction. When a savepoint is released its ops move to the enclosing
transaction; when the root commits they are handed to the index. Anything left on a transaction
when it ends without committing (a rollback, a savepoint rollback, an exception inside
``session.begin()``) is dropped. Changing other columns stages nothing.

**Applying** (:class:`Syncer`). For each collection: chunk the new values, embed every chunk of
every row in one batched call, upsert the points (deterministic ids, so a re-save overwrites),
then delete each row's points past its new last chunk, so an update leaves no stale points and a
delete removes them all.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import event, inspect
from sqlalchemy.orm import InstanceState, Session, SessionTransaction, UOWTransaction

from . import signals
from .chunking import Chunk
from .column import check_semantic_value
from .exc import ChunkTooLongWarning
from .mapping import SemanticColumn, row_key, semantic_columns
from .stores.base import VectorPoint, point_id

if TYPE_CHECKING:
    from .index import SemanticIndex

__all__ = ["SessionTracker", "SyncOp", "SyncReport", "Syncer"]

log = logging.getLogger("semantic_orm")

_STAGED = "semantic_orm.staged"


@dataclass(frozen=True, slots=True)
class SyncOp:
    """Make the index hold ``text`` for one row's column; ``text=None`` removes the row."""

    column: SemanticColumn
    pk: str
    text: str | None


@dataclass(slots=True)
class SyncReport:
    """What one :meth:`Syncer.apply` call did."""

    upserted: int = 0
    deleted: int = 0
    points: int = 0
    failed: list[tuple[list[SyncOp], BaseException]] = field(default_factory=list)


# -- staging ------------------------------------------------------------------------------------


def _staged(session: Session) -> dict[SessionTransaction, dict[tuple[str, str], SyncOp]]:
    return session.info.setdefault(_STAGED, {})  # type: ignore[no-any-return]


def _owner(session: Session) -> SessionTransaction | None:
    """The transaction that owns work flushed now: the innermost savepoint, else the root."""
    return session.get_nested_transaction() or session.get_transaction()


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


class SessionTracker:
    """Session listeners that stage ``SemanticText`` changes and hand them over on commit.

    Args:
        on_commit: Called with the ops of each committed root transaction.
        collection: Maps a column to its collection name (used to key staged ops).
    """

    def __init__(
        self,
        on_commit: Callable[[list[SyncOp]], Any],
        collection: Callable[[SemanticColumn], str],
    ) -> None:
        self._on_commit = on_commit
        self._collection = collection
        self.listeners: dict[str, Callable[..., None]] = {
            "before_flush": self.before_flush,
            "after_flush": self.after_flush,
            "after_commit": self.after_commit,
            "after_transaction_end": self.after_transaction_end,
        }

    def install(self, target: Any) -> None:
        """Listen on ``target`` (a sessionmaker, Session subclass or Session)."""
        for name, fn in self.listeners.items():
            if not event.contains(target, name, fn):
                event.listen(target, name, fn)

    def remove(self, target: Any) -> None:
        """Stop listening on ``target``."""
        for name, fn in self.listeners.items():
            if event.contains(target, name, fn):
                event.remove(target, name, fn)

    @staticmethod
    def _semantic(
        objs: Iterable[Any],
    ) -> Iterable[tuple[InstanceState[Any], tuple[SemanticColumn, ...]]]:
        for obj in objs:
            state = inspect(obj)
            columns = semantic_columns(state.mapper)
            if columns:
                yield state, columns

    @staticmethod
    def _keys(state: InstanceState[Any]) -> tuple[str | None, str]:
        """(old key or None for a new row, current key) of a row."""
        new_key = row_key(state.mapper.primary_key_from_instance(state.obj()))
        old_key = row_key(state.identity) if state.identity is not None else None
        return old_key, new_key

    def before_flush(self, session: Session, flush_context: UOWTransaction, instances: Any) -> None:
        """Refuse values that cannot be indexed before any SQL is sent.

        Also loads the semantic values of rows whose primary key changes, so that
        ``after_flush`` can move their points to the new key.
        """
        for state, columns in self._semantic(session.new):
            for col in columns:
                self._check(state, col)
        for state, columns in self._semantic(session.dirty):
            old_key, new_key = self._keys(state)
            for col in columns:
                if old_key is not None and old_key != new_key:
                    getattr(state.obj(), col.key)  # load it if expired
                if state.attrs[col.key].history.has_changes():
                    self._check(state, col)

    @staticmethod
    def _check(state: InstanceState[Any], col: SemanticColumn) -> None:
        value = state.dict.get(col.key)
        if value is not None:
            check_semantic_value(value, where=col.label)

    def after_flush(self, session: Session, flush_context: UOWTransaction) -> None:
        """Stage one op per changed semantic attribute on the owning transaction."""
        owner = _owner(session)
        if owner is None:
            return
        ops: list[SyncOp] = []
        for state, columns in self._semantic(session.new):
            _, key = self._keys(state)
            ops.extend(SyncOp(col, key, state.dict.get(col.key)) for col in columns)
        for state, columns in self._semantic(session.dirty):
            old_key, key = self._keys(state)
            moved = old_key is not None and old_key != key
            for col in columns:
                if moved:  # primary key changed: the old key's points go, the new key's come
                    assert old_key is not None
                    ops.append(SyncOp(col, old_key, None))
                    ops.append(SyncOp(col, key, state.dict.get(col.key)))
                elif state.attrs[col.key].history.has_changes():
                    ops.append(SyncOp(col, key, state.dict.get(col.key)))
        for state, columns in self._semantic(session.deleted):
            key = row_key(_identity(state))
            ops.extend(SyncOp(col, key, None) for col in columns)
        if ops:
            staged = _staged(session).setdefault(owner, {})
            for op in ops:
                staged[(self._collection(op.column), op.pk)] = op

    def after_commit(self, session: Session) -> None:
        """Move a released savepoint's ops outward; hand a root commit's ops to the index."""
        staged = session.info.get(_STAGED)
        if not staged:
            return
        trans = _owner(session)
        if trans is None:
            return
        ops = staged.pop(trans, None)
        if not ops:
            return
        parent = _enclosing(trans)
        if trans.nested and parent is not None:
            staged.setdefault(parent, {}).update(ops)
            return
        self._on_commit(list(ops.values()))

    def after_transaction_end(self, session: Session, trans: SessionTransaction) -> None:
        """Drop whatever a transaction still holds when it ends: it did not commit."""
        staged = session.info.get(_STAGED)
        if staged:
            staged.pop(trans, None)


# -- applying -----------------------------------------------------------------------------------


class Syncer:
    """Applies :class:`SyncOp` batches: chunk, embed in one batch, upsert, prune stale points."""

    def __init__(self, index: SemanticIndex) -> None:
        self.index = index
        self._warned: set[str] = set()

    def apply(self, ops: Sequence[SyncOp]) -> SyncReport:
        """Sync ``ops``; a failing collection is reported in ``failed``, the others still sync."""
        report = SyncReport()
        by_collection: dict[str, list[SyncOp]] = {}
        for op in ops:
            by_collection.setdefault(self.index.collection_name(op.column), []).append(op)
        for collection, group in by_collection.items():
            try:
                self._apply_collection(collection, group, report)
            except Exception as exc:  # reported to the caller, which keeps the ops for retry
                column = group[0].column
                log.warning("semantic_orm: syncing %s failed: %s", column.label, exc)
                if signals.sync_failed.receivers:
                    signals.sync_failed.send(
                        column.model, column=column.key, pks=[op.pk for op in group], error=exc
                    )
                report.failed.append((group, exc))
        return report

    def _apply_collection(self, collection: str, ops: list[SyncOp], report: SyncReport) -> None:
        column = ops[0].column
        model = column.model
        store = self.index.store
        embedder = self.index.embedder_for(column)
        chunker = self.index.chunker_for(column)
        self.index.ensure_collection(column)

        rows: list[tuple[str, list[Chunk]]] = []
        for op in ops:
            chunks = chunker.chunk(op.text) if op.text else []
            rows.append((op.pk, chunks))
            if chunks and signals.chunked.receivers:
                signals.chunked.send(model, column=column.key, pk=op.pk, chunks=chunks)

        texts = [c.text for _, chunks in rows for c in chunks]
        if texts:
            self._check_window(column, texts)
            started = time.perf_counter()
            vectors = embedder.encode(texts)
            if signals.embedded.receivers:
                signals.embedded.send(
                    model,
                    column=column.key,
                    count=len(texts),
                    model=embedder.name,
                    seconds=time.perf_counter() - started,
                )
            table = column.table
            points: list[VectorPoint] = []
            n = 0
            for pk, chunks in rows:
                for chunk in chunks:
                    payload: dict[str, Any] = {
                        "table": table,
                        "pk": pk,
                        "column": column.column.name,
                        "chunk_index": chunk.index,
                        "start_offset": chunk.start_offset,
                        "end_offset": chunk.end_offset,
                        "total_chunks": chunk.total_chunks,
                    }
                    if chunk.metadata:
                        payload["meta"] = dict(chunk.metadata)
                    points.append(
                        VectorPoint(point_id(collection, pk, chunk.index), vectors[n], payload)
                    )
                    n += 1
            store.upsert(collection, points)
            report.points += len(points)
        store.delete_rows(collection, [(pk, len(chunks)) for pk, chunks in rows])
        upserted = [pk for pk, chunks in rows if chunks]
        deleted = [pk for pk, chunks in rows if not chunks]
        report.upserted += len(upserted)
        report.deleted += len(deleted)
        if signals.synced.receivers:
            signals.synced.send(
                model, column=column.key, upserted=upserted, deleted=deleted, points=len(texts)
            )

    def _check_window(self, column: SemanticColumn, texts: Sequence[str]) -> None:
        """Warn once per column when chunks exceed the model's window (silent truncation)."""
        if column.label in self._warned:
            return
        embedder = self.index.embedder_for(column)
        limit = embedder.max_seq_length
        if not limit:
            return
        counts = embedder.count_tokens(texts)
        if not counts or max(counts) <= limit:
            return
        self._warned.add(column.label)
        over = sum(1 for c in counts if c > limit)
        longest, size = max(counts), column.settings.chunk_size
        warnings.warn(
            ChunkTooLongWarning(
                f"{column.label}: chunk_size={size} characters gives chunks of up to {longest} "
                f"tokens ({over} of {len(counts)} over the limit), but model {embedder.name!r} "
                f"reads at most {limit} tokens per chunk (max_seq_length); the rest of those "
                f"chunks is ignored when embedding. Lower chunk_size (about "
                f"{size * limit // longest} characters would fit)."
            ),
            stacklevel=2,
        )
