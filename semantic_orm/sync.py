"""Syncing committed changes to the vector store, through a transactional outbox.

Three steps, each its own unit:

**Staging** (:class:`SessionTracker`). Listeners on a ``sessionmaker`` or ``Session`` watch each
flush. ``before_flush`` refuses values that cannot be indexed, naming the model and column.
``after_flush`` (primary keys exist by then) writes one outbox job per changed ``SemanticText``
attribute *in the flush's own transaction* (:mod:`semantic_orm.outbox`), and remembers the job
keys on the transaction that flushed them: the innermost savepoint, or the root. When a
savepoint is released its keys move to the enclosing transaction; when the root commits they are
handed to the index, which processes them inline or leaves them to a worker. A rollback of any
kind removes the jobs with the rest of the transaction. Changing other columns stages nothing.

**Processing** (:meth:`Syncer.process`). Claims due jobs (``FOR UPDATE SKIP LOCKED`` on
PostgreSQL, plus a per-row advisory lock so two workers never sync the same row at once), reads
each row's *current* committed value, applies it, and deletes the jobs. Failures keep the job
with its attempt count, last error and a backoff; permanent ones are dead-lettered after
``max_attempts``; a poison row is isolated by bisection so the rest of its batch still syncs.

**Applying** (:meth:`Syncer.apply`). For each collection: chunk the values, fetch the row's
existing points, embed only chunks whose text is new (unchanged chunks keep their vectors; moved
ones get a payload update without a model call), upsert in batches (deterministic ids), then
delete each row's points past its new last chunk.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, event, func, inspect, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import (
    InstanceState,
    ORMExecuteState,
    Session,
    SessionTransaction,
    UOWTransaction,
)

from . import keywords, outbox, signals
from .chunking import Chunk, fit_to_window
from .column import check_semantic_value
from .exc import (
    ChunkTooLongWarning,
    ConfigurationError,
    EmbeddingError,
    SemanticTypeError,
    SemanticValueError,
    VectorStoreError,
)
from .keywords import KEYWORDS_VERSION
from .mapping import SemanticColumn, pk_in, row_key, semantic_columns
from .stores.base import SparseVector, VectorPoint, point_id

if TYPE_CHECKING:
    from .index import SemanticIndex

__all__ = ["ProcessReport", "SessionTracker", "SyncOp", "SyncReport", "Syncer", "is_transient"]

log = logging.getLogger("semantic_orm")

_STAGED = "semantic_orm.staged"

JobKey = tuple[str, str, str]  # (table, column, row key)


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
    embedded: int = 0
    reused: int = 0
    failed: list[tuple[list[SyncOp], BaseException]] = field(default_factory=list)


@dataclass(slots=True)
class ProcessReport:
    """What one :meth:`Syncer.process` pass did with outbox jobs."""

    claimed: int = 0
    done: int = 0
    retried: int = 0
    dead: int = 0
    skipped: int = 0
    sync: SyncReport = field(default_factory=SyncReport)


def is_transient(error: BaseException) -> bool:
    """Whether retrying later may succeed (store unreachable, database busy).

    Values that cannot be embedded, and unexpected errors, are permanent: they are retried up to
    ``max_attempts`` times, then dead-lettered. Transient errors are retried with capped backoff
    and never dead-lettered, so an outage does not bury the whole queue.
    """
    if isinstance(error, (SemanticValueError, SemanticTypeError, EmbeddingError)):
        return False
    return isinstance(
        error,
        (VectorStoreError, ConfigurationError, ConnectionError, TimeoutError, OperationalError),
    )


# -- staging ------------------------------------------------------------------------------------


def _staged(session: Session) -> dict[SessionTransaction, set[JobKey]]:
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
    """Session listeners that write outbox jobs in flush and hand them over on commit.

    Args:
        index: The index whose columns, outbox and processing these sessions feed.
    """

    def __init__(self, index: SemanticIndex) -> None:
        self.index = index
        self.listeners: dict[str, Callable[..., None]] = {
            "before_flush": self.before_flush,
            "after_flush": self.after_flush,
            "after_commit": self.after_commit,
            "after_transaction_end": self.after_transaction_end,
            "do_orm_execute": self.do_orm_execute,
        }

    def install(self, target: Any) -> None:
        """Listen on ``target`` (a Session subclass or a Session)."""
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

    @staticmethod
    def _check(state: InstanceState[Any], col: SemanticColumn) -> None:
        value = state.dict.get(col.key)
        if value is not None:
            check_semantic_value(value, where=col.label)

    def before_flush(self, session: Session, flush_context: UOWTransaction, instances: Any) -> None:
        """Refuse values that cannot be indexed before any SQL is sent."""
        for state, columns in self._semantic(session.new):
            for col in columns:
                self._check(state, col)
        for state, columns in self._semantic(session.dirty):
            for col in columns:
                if state.attrs[col.key].history.has_changes():
                    self._check(state, col)

    def after_flush(self, session: Session, flush_context: UOWTransaction) -> None:
        """Write one outbox job per changed semantic attribute, in the flush's transaction."""
        owner = _owner(session)
        if owner is None:
            return
        keys: list[JobKey] = []

        def add(col: SemanticColumn, key: str) -> None:
            self.index.register_column(col)
            keys.append((col.table, col.column.name, key))

        for state, columns in self._semantic(session.new):
            _, key = self._keys(state)
            for col in columns:
                add(col, key)
        for state, columns in self._semantic(session.dirty):
            old_key, key = self._keys(state)
            moved = old_key is not None and old_key != key
            for col in columns:
                if moved:  # primary key changed: the old key's points go, the new key's come
                    assert old_key is not None
                    add(col, old_key)
                    add(col, key)
                elif state.attrs[col.key].history.has_changes():
                    add(col, key)
        for state, columns in self._semantic(session.deleted):
            key = row_key(_identity(state))
            for col in columns:
                add(col, key)
        self._stage(session, keys)

    def _stage(self, session: Session, keys: list[JobKey]) -> None:
        if not keys:
            return
        conn = session.connection()  # begins the session's transaction if needed
        owner = _owner(session)
        assert owner is not None
        self.index.ensure_outbox(conn)
        outbox.enqueue(conn, keys)
        self.index.remember_engine(conn.engine)
        _staged(session).setdefault(owner, set()).update(keys)

    def do_orm_execute(self, state: ORMExecuteState) -> None:
        """Enqueue jobs for bulk ``update()``/``delete()`` statements on semantic models.

        The affected primary keys are read, in the same transaction, just before the statement
        runs. A bulk ``insert()`` without explicit primary keys is refused: its rows could not
        be named, so the index would silently miss them.
        """
        if not (state.is_update or state.is_delete or state.is_insert):
            return
        mapper = state.bind_mapper
        if mapper is None:
            return
        columns = semantic_columns(mapper)
        if not columns:
            return
        for col in columns:
            self.index.register_column(col)
        params = state.parameters
        rows: list[Mapping[str, Any]] = (
            list(params) if isinstance(params, list) else [params] if params else []  # type: ignore[list-item]
        )
        pk_names = [mapper.get_property_by_column(c).key for c in mapper.primary_key]
        where = getattr(state.statement, "whereclause", None)
        by_pk = bool(rows) and all(n in r for r in rows for n in pk_names)
        if state.is_insert or (by_pk and where is None):  # bulk insert, or bulk update by pk
            if not by_pk:
                raise ConfigurationError(
                    f"bulk insert into {mapper.class_.__name__}, which has SemanticText columns, "
                    "without primary key values cannot be synced to the index: use "
                    "session.add_all(), or pass the primary keys"
                )
            keys = [row_key([r[n] for n in pk_names]) for r in rows]
        else:  # update/delete with criteria: read the rows they will touch, before they run
            query = select(*mapper.primary_key)
            if where is not None:
                query = query.where(where)
            keys = [row_key(tuple(row)) for row in state.session.execute(query)]
        self._stage(
            state.session, [(col.table, col.column.name, key) for key in keys for col in columns]
        )

    def after_commit(self, session: Session) -> None:
        """Move a released savepoint's keys outward; hand a root commit's keys to the index."""
        staged = session.info.get(_STAGED)
        if not staged:
            return
        trans = _owner(session)
        if trans is None:
            return
        keys = staged.pop(trans, None)
        if not keys:
            return
        parent = _enclosing(trans)
        if trans.nested and parent is not None:
            staged.setdefault(parent, set()).update(keys)
            return
        bind = session.get_bind()
        engine = bind if isinstance(bind, Engine) else bind.engine
        self.index.committed(engine, sorted(keys))

    def after_transaction_end(self, session: Session, trans: SessionTransaction) -> None:
        """Forget whatever a transaction still holds when it ends: it did not commit."""
        staged = session.info.get(_STAGED)
        if staged:
            staged.pop(trans, None)


# -- processing and applying ----------------------------------------------------------------


def _chunk_hash(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=10).hexdigest()


class Syncer:
    """Processes outbox jobs and applies :class:`SyncOp` batches to the store."""

    def __init__(self, index: SemanticIndex) -> None:
        self.index = index
        self._warned: set[str] = set()
        self._lock = threading.RLock()  # one processing pass at a time in this process

    # -- outbox -----------------------------------------------------------------------------

    def process(
        self, engine: Engine, *, keys: Sequence[JobKey] | None = None, limit: int = 256
    ) -> ProcessReport:
        """Claim due jobs (or those of ``keys``), sync their rows' current values, settle them."""
        report = ProcessReport()
        with self._lock, engine.connect() as conn:
            with conn.begin():
                self.index.ensure_outbox(conn)
                jobs = outbox.claim(conn, limit=limit, keys=keys)
                report.claimed = len(jobs)
                if jobs:
                    self._process_claimed(conn, jobs, report)
            self.index.outbox_committed(engine)
        return report

    def _process_claimed(
        self, conn: Connection, jobs: list[outbox.Job], report: ProcessReport
    ) -> None:
        """Sync the rows of claimed jobs and settle the jobs, inside the claiming transaction."""
        jobs = self._lock_rows(conn, jobs, report)
        by_key: dict[JobKey, list[outbox.Job]] = {}
        for job in jobs:
            by_key.setdefault(job.key, []).append(job)
        ops, unknown = self._read_current(conn, list(by_key))
        for key in unknown:
            missing = ConfigurationError(
                f"no mapped SemanticText column for {key[0]}.{key[1]}: import the models "
                "(or pass models= to SemanticIndex) in the process that syncs"
            )
            self._settle_failure(conn, by_key.pop(key), missing, report)
        sync = self.apply(ops)
        report.sync = sync
        failed_keys: set[JobKey] = set()
        for group, error in sync.failed:
            for op in group:
                key = (op.column.table, op.column.column.name, op.pk)
                failed_keys.add(key)
                self._settle_failure(conn, by_key[key], error, report)
        done = [j.id for k, js in by_key.items() if k not in failed_keys for j in js]
        outbox.finish(conn, done)
        report.done += len(done)

    def _lock_rows(
        self, conn: Connection, jobs: list[outbox.Job], report: ProcessReport
    ) -> list[outbox.Job]:
        """On PostgreSQL keep only jobs whose row no other worker is syncing right now."""
        if conn.dialect.name != "postgresql":
            return jobs
        kept: list[outbox.Job] = []
        locked: dict[JobKey, bool] = {}
        for job in jobs:
            if job.key not in locked:
                name = "\x1f".join(job.key)
                locked[job.key] = bool(
                    conn.execute(
                        select(func.pg_try_advisory_xact_lock(func.hashtextextended(name, 0)))
                    ).scalar()
                )
            if locked[job.key]:
                kept.append(job)
            else:
                report.skipped += 1
        return kept

    def _read_current(
        self, conn: Connection, keys: list[JobKey]
    ) -> tuple[list[SyncOp], list[JobKey]]:
        """Ops carrying each row's current committed value (``None`` if the row is gone)."""
        by_column: dict[tuple[str, str], list[str]] = {}
        for table, column, pk in keys:
            by_column.setdefault((table, column), []).append(pk)
        ops: list[SyncOp] = []
        unknown: list[JobKey] = []
        with Session(bind=conn, autoflush=False) as session:
            for (table, column), pks in by_column.items():
                col = self.index.column_for(table, column)
                if col is None:
                    unknown.extend((table, column, pk) for pk in pks)
                    continue
                values = read_values(session, col, pks)
                ops.extend(SyncOp(col, pk, values.get(pk)) for pk in pks)
        return ops, unknown

    def _settle_failure(
        self, conn: Connection, jobs: list[outbox.Job], error: BaseException, report: ProcessReport
    ) -> None:
        transient = is_transient(error)
        attempts = max(job.attempts for job in jobs) + 1
        dead = not transient and attempts >= self.index.max_attempts
        delay = min(self.index.retry_cap, self.index.retry_base * 2 ** (attempts - 1))
        outbox.fail(conn, jobs, error, retry_in=dt.timedelta(seconds=delay), dead=dead)
        if dead:
            report.dead += len(jobs)
            log.error(
                "semantic_orm: dead-lettered %s after %d attempts: %s", jobs[0].key, attempts, error
            )
        else:
            report.retried += len(jobs)

    # -- applying ---------------------------------------------------------------------------

    def apply(self, ops: Sequence[SyncOp], *, into: str | None = None) -> SyncReport:
        """Sync ``ops``; failures are reported in ``failed`` and the rest still syncs.

        A batch that fails with a permanent error is bisected, so one poison row fails alone.
        ``into`` writes to another, already created collection (a rebuild) instead of each
        column's own; point ids stay those of the column's collection, so they survive the
        switch.
        """
        report = SyncReport()
        by_collection: dict[str, list[SyncOp]] = {}
        for op in ops:
            by_collection.setdefault(self.index.collection_name(op.column), []).append(op)
        for collection, group in by_collection.items():
            self._apply_isolating(collection, group, report, into)
        return report

    def _apply_isolating(
        self, collection: str, ops: list[SyncOp], report: SyncReport, into: str | None = None
    ) -> None:
        try:
            self._apply_collection(collection, ops, report, into)
        except Exception as exc:
            if len(ops) > 1 and not is_transient(exc):
                half = len(ops) // 2
                self._apply_isolating(collection, ops[:half], report, into)
                self._apply_isolating(collection, ops[half:], report, into)
                return
            column = ops[0].column
            log.warning("semantic_orm: syncing %s failed: %s", column.label, exc)
            if signals.sync_failed.receivers:
                signals.sync_failed.send(
                    column.model, column=column.key, pks=[op.pk for op in ops], error=exc
                )
            report.failed.append((ops, exc))

    def _apply_collection(
        self, collection: str, ops: list[SyncOp], report: SyncReport, into: str | None = None
    ) -> None:
        column = ops[0].column
        model = column.model
        store = self.index.store
        embedder = self.index.embedder_for(column)
        chunker = self.index.chunker_for(column)
        if into is None:
            self.index.ensure_collection(column)
        target = into or collection
        config = self.index.fingerprint(column)

        rows: list[tuple[str, list[Chunk]]] = []
        spans = getattr(embedder, "token_spans", None)
        window = embedder.max_seq_length
        for op in ops:
            chunks = chunker.chunk(op.text) if op.text else []
            if chunks and spans is not None and window:
                budget = window - int(getattr(embedder, "special_tokens", 0))
                fitted = fit_to_window(chunks, op.text or "", spans, budget)
                if len(fitted) > len(chunks):
                    self._warn_split(column, chunks, spans, budget, len(fitted) - len(chunks))
                chunks = fitted
            rows.append((op.pk, chunks))
            if chunks and signals.chunked.receivers:
                signals.chunked.send(model, column=column.key, pk=op.pk, chunks=chunks)

        # what the store already holds for these rows: vectors to reuse, payloads to compare
        live = [pk for pk, chunks in rows if chunks]
        existing = store.existing(target, live) if live else []
        reusable: dict[tuple[str, str], Any] = {}
        current: dict[tuple[str, int], dict[str, Any]] = {}
        for point in existing:
            stored = point.payload
            if stored.get("cfg") != config:
                continue  # produced by another model or chunking: not comparable
            pk = str(stored["pk"])
            reusable[(pk, str(stored.get("hash")))] = point.vector
            current[(pk, int(stored["chunk_index"]))] = dict(stored)

        table = column.table
        # (id, vector or None, payload, keyword vector): dense vectors are reused when a chunk's
        # text is unchanged; keyword vectors are cheap, so every written point recomputes its own
        slots: list[tuple[str, Any, dict[str, Any], SparseVector]] = []
        to_embed: list[tuple[int, str]] = []
        for pk, chunks in rows:
            for chunk in chunks:
                digest = _chunk_hash(chunk.text)
                payload: dict[str, Any] = {
                    "table": table,
                    "pk": pk,
                    "column": column.column.name,
                    "chunk_index": chunk.index,
                    "start_offset": chunk.start_offset,
                    "end_offset": chunk.end_offset,
                    "total_chunks": chunk.total_chunks,
                    "hash": digest,
                    "cfg": config,
                    "kw": KEYWORDS_VERSION,
                }
                if chunk.metadata:
                    payload["meta"] = dict(chunk.metadata)
                if current.get((pk, chunk.index)) == payload:
                    report.reused += 1
                    continue  # unchanged: nothing to write
                pid = point_id(collection, pk, chunk.index)
                vector = reusable.get((pk, digest))
                if vector is not None:
                    report.reused += 1
                else:
                    to_embed.append((len(slots), chunk.text))
                slots.append((pid, vector, payload, keywords.document_vector(chunk.text)))

        if to_embed:
            texts = [text for _, text in to_embed]
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
            for (slot, _), vector in zip(to_embed, vectors, strict=True):
                pid, _, payload, sparse = slots[slot]
                slots[slot] = (pid, vector, payload, sparse)
            report.embedded += len(texts)
        ready = [VectorPoint(pid, vec, payload, sparse) for pid, vec, payload, sparse in slots]
        if ready:
            store.upsert(target, ready)
            report.points += len(ready)
        store.delete_rows(target, [(pk, len(chunks)) for pk, chunks in rows])
        upserted = [pk for pk, chunks in rows if chunks]
        deleted = [pk for pk, chunks in rows if not chunks]
        report.upserted += len(upserted)
        report.deleted += len(deleted)
        if signals.synced.receivers:
            signals.synced.send(
                model,
                column=column.key,
                upserted=upserted,
                deleted=deleted,
                points=len(ready),
            )

    def _warn_split(
        self,
        column: SemanticColumn,
        chunks: Sequence[Chunk],
        spans: Callable[[str], list[tuple[int, int]]],
        budget: int,
        extra: int,
    ) -> None:
        """Warn once per column that its chunks overflow the model window (and were split)."""
        if column.label in self._warned:
            return
        self._warned.add(column.label)
        embedder = self.index.embedder_for(column)
        longest = max(len(spans(c.text)) for c in chunks)
        size = column.settings.chunk_size
        warnings.warn(
            ChunkTooLongWarning(
                f"{column.label}: chunk_size={size} characters gives chunks of up to {longest} "
                f"tokens, but model {embedder.name!r} reads at most {embedder.max_seq_length} "
                f"tokens per chunk (max_seq_length). Those chunks are split further at token "
                f"boundaries ({extra} more chunks here) so that no text is silently truncated; "
                f"a chunk_size of about {max(1, size * budget // longest)} characters would "
                "avoid the second split."
            ),
            stacklevel=3,
        )

    def _check_window(self, column: SemanticColumn, texts: Sequence[str]) -> None:
        """Warn once per column when chunks exceed the model's window (silent truncation).

        Only for embedders that cannot report token offsets; the others split such chunks.
        """
        embedder = self.index.embedder_for(column)
        if column.label in self._warned or getattr(embedder, "token_spans", None):
            return
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


def read_values(
    session: Session, column: SemanticColumn, pks: Sequence[str]
) -> dict[str, str | None]:
    """``column``'s current value for each row key in ``pks`` that exists, 500 keys a query."""
    mapper = column.mapper
    values: dict[str, str | None] = {}
    for start in range(0, len(pks), 500):
        stmt = select(mapper).where(pk_in(mapper, list(pks[start : start + 500])))
        for obj in session.scalars(stmt):
            values[row_key(mapper.primary_key_from_instance(obj))] = getattr(obj, column.key)
    return values


def fingerprint(model: str, dimension: int, chunker: dict[str, Any]) -> str:
    """Short digest of what makes vectors comparable: model, dimension, chunking settings."""
    blob = json.dumps([model, dimension, chunker], sort_keys=True)
    return hashlib.blake2b(blob.encode("utf-8"), digest_size=6).hexdigest()
