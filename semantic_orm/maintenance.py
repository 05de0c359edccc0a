"""Backfill, reconciliation, rebuilds and health: ``reindex``, ``reconcile``, ``rebuild``,
``gc`` and ``status``.

``reindex`` queues a job for every row of a model that has no vectors yet (or for every row with
``all_rows=True``), committing the jobs in batches, then drains them with a progress bar. It is
resumable: rows indexed before an interruption are skipped next time, and queued jobs survive in
the outbox. Unchanged chunks keep their vectors, so re-running it on an indexed table is cheap.

``reconcile`` converges writes no session saw (raw SQL, database cascades, another
application): it compares each row's text hash with the one its points record, queues the rows
that differ or are missing, and queues the keys the index holds that SQL no longer has (their
points go). It pages through both sides in primary-key order (bounded memory on any size),
records its progress in ``semantic_orm_checkpoint`` after every page (an interrupted pass
resumes where it stopped) and reports counts.

``rebuild`` re-embeds a column whose model or chunk settings changed into a new collection while
searches keep using the old one, then switches over (``semantic-orm reindex ... --rebuild``).
``gc`` finds the collections of dropped or renamed columns and of abandoned rebuilds
(``semantic-orm gc [--dry-run]``). ``status`` reports lag, drift and errors per column.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from sqlalchemy import Engine, func, inspect, select
from sqlalchemy.orm import sessionmaker

from . import outbox
from .applying import SyncOp, text_hash
from .binding import ColumnBinding, drift, filter_drift
from .exc import CollectionMismatchError, ConfigurationError, SyncError, is_transient
from .filtering import describe, row_fields
from .index import SemanticIndex, blocking_engine
from .mapping import SemanticColumn, key_values, row_key, rows_page, semantic_columns
from .outbox import JobKey
from .processing import read_values
from .schemas import translated
from .stores.base import Filter, Match, MatchAny, PointPayload
from .stores.edge import EdgeStore

__all__ = [
    "REBUILD_MARK",
    "ColumnStatus",
    "Orphan",
    "RebuildReport",
    "ReconcileReport",
    "gc",
    "present_columns",
    "rebuild",
    "rebuild_name",
    "reconcile",
    "reindex",
    "status",
]

log = logging.getLogger("semantic_orm")

_PAGE = 1000


class _NoBar:
    """What :func:`_bar` gives when no progress is wanted."""

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, n: int) -> None:
        """Nothing to show."""


def _engine(index: SemanticIndex, bind: Any) -> Engine:
    """``bind``'s engine, with this process's finished jobs settled: the outbox as it is.

    Raises:
        ConfigurationError: It is an async driver's (these functions block, and it runs only
            awaited: SQLAlchemy's MissingGreenlet, before).
    """
    engine = blocking_engine(
        index.engine_for(bind),
        "semantic_orm.maintenance",
        "pass an Engine on the same database with a blocking driver (the semantic-orm command "
        "makes one)",
    )
    index.settle(engine)
    return engine


def _bar(total: int | None, label: str, progress: bool | TextIO, *, enabled: bool = True) -> Any:
    """A tqdm progress bar (a context manager) on stderr, or on ``progress`` if it is a stream."""
    if progress is False or not enabled:
        return _NoBar()
    from tqdm import tqdm

    if progress is True:
        return tqdm(total=total, desc=label, file=sys.stderr, unit="row", dynamic_ncols=True)
    # a stream of the caller's: every update is written (no rate limit)
    return tqdm(total=total, desc=label, file=progress, unit="row", mininterval=0, miniters=1)


def _columns(model: type[Any], column: str | None = None) -> list[SemanticColumn]:
    mapper = inspect(model)
    columns = [c for c in semantic_columns(mapper) if column is None or c.key == column]
    if not columns:
        raise ConfigurationError(
            f"{model.__name__} has no SemanticText column"
            + (f" named {column!r}" if column is not None else "")
        )
    return columns


_FIRST_CHUNK = Match(PointPayload.CHUNK_INDEX_KEY, 0)


def _first_chunks(
    index: SemanticIndex, collection: str, pks: Sequence[str]
) -> dict[str, PointPayload]:
    """The payload of each row's first chunk, for the rows of ``pks`` the index holds
    (digests, no chunk metadata)."""
    found: dict[str, PointPayload] = {}
    where = Filter(must=(MatchAny(PointPayload.PK_KEY, tuple(pks)), _FIRST_CHUNK))
    offset: Any = None
    while pks:
        hits, offset = index.store.scroll(collection, offset=offset, limit=_PAGE, where=where)
        for hit in hits:
            payload = PointPayload.from_dict(hit.payload, meta=False)
            found[payload.pk] = payload
        if offset is None:
            return found
    return found


def _indexed_pages(index: SemanticIndex, collection: str) -> Iterator[list[PointPayload]]:
    """The first-chunk payloads of every row the index holds, a page at a time (keys and
    digests, no chunk metadata)."""
    offset: Any = None
    where = Filter(must=(_FIRST_CHUNK,))
    while True:
        hits, offset = index.store.scroll(collection, offset=offset, limit=_PAGE, where=where)
        yield [PointPayload.from_dict(h.payload, meta=False) for h in hits]
        if offset is None:
            return


def _record_refreshed(
    index: SemanticIndex, engine: Engine, binding: ColumnBinding, collection: str
) -> None:
    """Record with ``collection`` the filter fields and the keyword analyser ``binding``
    declares, if the points of every row of the table now carry them (after ``reindex --all``,
    a ``reconcile`` pass or a build): where= then filters on those fields in the store, and the
    keyword warning ends. Each row's first chunk is looked at (a sync writes all of a row's
    chunks with the same payload fields and analysis); points of rows the table no longer has
    do not count (``reconcile`` removes them); a row whose job failed, or waits behind drift,
    keeps the collection as it is recorded, with a warning."""
    recorded = index.store.collection_info(collection)
    if recorded is None:
        return
    unfilled = set(filter_drift(recorded, binding.spec))
    analyser = binding.analyzer.id
    stale = recorded.get("keywords") != analyser  # (or not recorded yet)
    if not unfilled and not stale:
        return
    for page in _indexed_pages(index, collection):
        behind: dict[str, str] = {}  # row key -> what its points lack
        for point in page:
            if unfilled and not unfilled <= point.fields.keys():
                behind[point.pk] = "filter fields"
            elif stale and point.analyzer != analyser:
                behind[point.pk] = "keyword analysis"
        if not behind:
            continue
        with engine.connect() as conn:
            rows = read_values(conn, binding.column, sorted(behind))
        if rows:
            key = min(rows)
            log.warning(
                "semantic_orm: %s: row %s still has points of the earlier %s (its sync failed "
                "or waits); %r is recorded as it was until a later pass syncs it",
                binding.label,
                key,
                behind[key],
                collection,
            )
            return
    changes: dict[str, Any] = {}
    if unfilled:
        changes["filter_by"] = describe(binding.fields)
    if stale:
        changes["keywords"] = analyser
    index.store.update_metadata(collection, changes)
    index.bindings.forget(binding)


def _drain(index: SemanticIndex, engine: Engine, queued: int, label: str, progress: Any) -> None:
    """Process due jobs until none is left, and wait for the ones another processor (a worker,
    the background retrier) holds a lease on; jobs waiting for a retry are left to it."""
    with _bar(queued, label, progress, enabled=bool(queued)) as bar:
        while True:
            report = index.process(engine, limit=_PAGE // 2)
            if report.done:
                bar.update(report.done)
            if report.claimed:
                continue
            with engine.connect() as conn:  # a lease may end between the pass and this look
                if not outbox.leased(conn) and not outbox.has_due(conn):
                    break
            time.sleep(0.05)


def reindex(
    index: SemanticIndex,
    model: type[Any],
    bind: Engine | sessionmaker[Any] | None = None,
    *,
    all_rows: bool = False,
    batch_size: int = 500,
    process: bool = True,
    progress: bool | TextIO = False,
) -> int:
    """Queue (and by default process) jobs for rows of ``model`` that lack vectors.

    Args:
        index: The index to fill.
        model: The mapped class with SemanticText columns.
        bind: Engine or sessionmaker of the database.
        all_rows: Queue every row, not only those without vectors (then, with ``process``,
            record the declared filter fields and keyword analyser with the collection once
            every row's points carry them: see :func:`_record_refreshed`).
        batch_size: Rows per committed batch of jobs.
        process: Drain the queued jobs before returning.
        progress: Show a progress bar (``True`` for stderr, or a stream).

    Returns:
        The number of jobs queued.
    """
    columns = _columns(model)
    engine = _engine(index, bind)
    queued = 0
    index.reach(engine, columns)
    for col in columns:
        binding = index.binding_for(col)
        with _bar(None, f"queue {col.label}", progress) as bar:
            for page in _pages(engine, col, (), batch_size):
                keys = [key for key, _ in page]
                have = {} if all_rows else _first_chunks(index, binding.collection, keys)
                todo = [JobKey(col.table, col.name, k) for k in keys if k not in have]
                with engine.begin() as writer:
                    index.prepare_outbox(writer)
                    outbox.enqueue(writer, todo)
                queued += len(todo)
                bar.update(len(keys))
    if process and queued:
        _drain(index, engine, queued, f"embed {model.__name__}", progress)
    for col in columns:
        binding = index.binding_for(col)
        if all_rows and process:
            _record_refreshed(index, engine, binding, binding.collection)
        if process and index.store.collection_info(binding.collection) is not None:
            index.store.optimize(binding.collection)  # build the vector index once, now
    return queued


# -- reconciliation -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    """What :func:`reconcile` found for one column (and queued to fix it)."""

    column: str
    rows: int
    """Rows compared in this pass."""
    in_sync: int
    missing: int
    """Rows with text but no points: queued."""
    changed: int
    """Rows whose text, settings, filter values or keyword analysis differ from what their
    points record: queued."""
    emptied: int
    """Rows without text that still have points: queued (their points go)."""
    orphans: int
    """Keys the index holds that the table no longer has: queued (their points go)."""
    resumed: bool
    """Whether the pass started from a checkpoint left by an interrupted one."""

    @property
    def queued(self) -> int:
        """Jobs this pass queued."""
        return self.missing + self.changed + self.emptied + self.orphans

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {**dataclasses.asdict(self), "queued": self.queued}


def reconcile(
    index: SemanticIndex,
    model: type[Any] | None = None,
    bind: Engine | sessionmaker[Any] | None = None,
    *,
    batch_size: int = _PAGE,
    process: bool = True,
    restart: bool = False,
    progress: bool | TextIO = False,
) -> list[ReconcileReport]:
    """Compare SQL with the index by primary key and text hash; queue what differs.

    Use it after writes that no installed session saw: raw SQL (``UPDATE ... SET body = ...``),
    ``ON DELETE CASCADE`` / ``ON UPDATE CASCADE`` on a table with a SemanticText column, bulk
    loads, another application writing the same database, or a restore of either side.

    Args:
        index: The application's index.
        model: Only this mapped class (default: every column the index serves).
        bind: Engine or sessionmaker of the database.
        batch_size: Rows per page (and per committed batch of jobs).
        process: Drain the queued jobs before returning (then record the declared filter
            fields and keyword analyser as :func:`reindex` does).
        restart: Ignore the checkpoint of an interrupted pass and start from the beginning.
        progress: Show a progress bar (``True`` for stderr, or a stream).

    Returns:
        One report per column.
    """
    engine = _engine(index, bind)
    columns = _columns(model) if model is not None else present_columns(index, engine)
    with engine.begin() as conn:
        index.prepare_outbox(conn)
    reports = [_reconcile(index, engine, c, batch_size, restart, progress) for c in columns]
    queued = sum(r.queued for r in reports)
    if process and queued:
        _drain(index, engine, queued, "sync", progress)
    if process:  # rows of another analysis or without the new filter fields were synced
        for col in columns:
            binding = index.binding_for(col)
            _record_refreshed(index, engine, binding, binding.collection)
    return reports


def _reconcile(
    index: SemanticIndex,
    engine: Engine,
    col: SemanticColumn,
    batch: int,
    restart: bool,
    progress: bool | TextIO,
) -> ReconcileReport:
    index.reach(engine, (col,))
    binding = index.binding_for(col)
    name = f"reconcile:{col.table}.{col.name}"
    counts = dict.fromkeys(("rows", "in_sync", "missing", "changed", "emptied", "orphans"), 0)
    with engine.connect() as conn:
        saved = None if restart else outbox.checkpoint(conn, name)
    state: dict[str, Any] = json.loads(saved) if saved else {}
    resumed = bool(state)
    counts.update(state.get("counts", {}))

    def save(conn: Any, **extra: Any) -> None:
        outbox.checkpoint(conn, name, json.dumps({"counts": counts, **extra}))

    with _bar(None, f"reconcile {col.label}", progress) as bar:
        # SQL -> index: rows missing, changed or emptied
        if state.get("phase", "rows") == "rows":
            fields = binding.fields
            extra = (col.column, *(f.column for f in fields))
            for page in _pages(engine, col, extra, batch, state.get("after")):
                stored = _first_chunks(index, binding.collection, [k for k, _ in page])
                todo: list[JobKey] = []
                for key, (value, *values) in page:
                    point = stored.get(key)
                    if value:
                        if point is None:
                            counts["missing"] += 1
                        elif (
                            point.text_hash != text_hash(value)
                            or point.config != binding.fingerprint
                            or point.analyzer != binding.analyzer.id
                            or dict(point.fields) != row_fields(fields, values)
                        ):  # the text, the settings, a value that travels with it, or
                            # the keyword analysis
                            counts["changed"] += 1
                        else:
                            counts["in_sync"] += 1
                            continue
                    elif point is not None:
                        counts["emptied"] += 1
                    else:
                        counts["in_sync"] += 1
                        continue
                    todo.append(JobKey(col.table, col.name, key))
                counts["rows"] += len(page)
                with engine.begin() as writer:
                    outbox.enqueue(writer, todo)
                    save(writer, phase="rows", after=page[-1][0])
                bar.update(len(page))
            with engine.begin() as writer:
                save(writer, phase="orphans")
        # index -> SQL: keys the table no longer has
        for payloads in _indexed_pages(index, binding.collection):
            keys = sorted({p.pk for p in payloads if p.pk})
            if not keys:
                continue
            with engine.connect() as conn:
                present = read_values(conn, col, keys)
            gone = [JobKey(col.table, col.name, k) for k in keys if k not in present]
            counts["orphans"] += len(gone)
            if gone:
                with engine.begin() as writer:
                    outbox.enqueue(writer, gone)
        with engine.begin() as writer:
            outbox.checkpoint(writer, name, "")  # finished: the next pass starts afresh
    return ReconcileReport(col.label, resumed=resumed, **counts)


def present_columns(index: SemanticIndex, engine: Engine) -> list[SemanticColumn]:
    """The index's columns whose table ``engine``'s database has (a process may map others)."""
    inspector, options = inspect(engine), engine.get_execution_options()
    return [
        c
        for c in index.columns()
        if inspector.has_table(
            c.column.table.name, schema=translated(c.column.table.schema, options)
        )
    ]


def _pages(
    engine: Engine, col: SemanticColumn, extra: Sequence[Any], batch: int, after: str | None = None
) -> Iterator[list[tuple[str, tuple[Any, ...]]]]:
    """``col``'s table as ``(key, extra values)`` pages after row key ``after``, each page read
    on a fresh connection (no read transaction stays open while the caller writes)."""
    table = col.column.table
    last = None if after is None else key_values(col.mapper, after)
    while True:
        with engine.connect() as conn:
            page = rows_page(conn, table, extra, after=last, limit=batch)
        if not page:
            return
        yield [(row_key(pk), values) for pk, values in page]
        if len(page) < batch:
            return
        last = page[-1][0]


# -- status --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ColumnStatus:
    """How far one semantic column's index is behind its table."""

    column: str
    collection: str
    rows: int
    indexed_rows: int
    pending_jobs: int
    dead_jobs: int
    oldest_pending_age: float | None  # seconds
    drift: dict[str, tuple[Any, Any]] = dataclasses.field(default_factory=dict)
    """Settings changed since the collection was built: ``{setting: (recorded, declared)}``."""
    retrying_jobs: int = 0
    """Pending jobs that failed at least once."""
    errors: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """The last errors of dead and retrying jobs, grouped by cause."""
    index_state: dict[str, int] = dataclasses.field(default_factory=dict)
    """The store's vector index: ``points``, ``indexed`` (in a built index), ``segments``."""
    unfilled_filters: list[str] = dataclasses.field(default_factory=list)
    """``filter_by`` fields not every point carries yet (``reindex --all`` fills them)."""
    stale_keywords: tuple[str, str] | None = None
    """The keyword analyser the collection's points were written with and the one this
    version writes, when they differ (``reindex --all`` rewrites them, embedding nothing)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "drift": {k: list(v) for k, v in self.drift.items()},
            "column": self.column,
            "collection": self.collection,
            "rows": self.rows,
            "indexed_rows": self.indexed_rows,
            "pending_jobs": self.pending_jobs,
            "retrying_jobs": self.retrying_jobs,
            "dead_jobs": self.dead_jobs,
            "oldest_pending_age_s": self.oldest_pending_age,
            "errors": self.errors,
            "index": self.index_state,
            "unfilled_filters": self.unfilled_filters,
            "stale_keywords": None if self.stale_keywords is None else list(self.stale_keywords),
        }


def status(
    index: SemanticIndex, bind: Engine | sessionmaker[Any] | None = None
) -> list[ColumnStatus]:
    """Rows, indexed rows, pending, retrying and dead jobs, lag, drift and errors per column."""
    engine = _engine(index, bind)
    out: list[ColumnStatus] = []
    with engine.connect() as conn:
        has_outbox = outbox.exists(engine)
        jobs = outbox.counts(conn) if has_outbox else {}
        errors = outbox.errors(conn) if has_outbox else []
        now = dt.datetime.now(dt.UTC)
        present = present_columns(index, engine)
        index.reach(engine, present)
        for col in present:
            table = col.column.table
            binding = index.binding_for(col)
            rows = conn.execute(select(func.count()).select_from(table)).scalar_one()
            entry = jobs.get((col.table, col.name), {})
            oldest = entry.get("oldest_pending")
            # no collection yet (nothing synced): nothing to compare, and no model to load (a
            # model that cannot load is what a status may be run to find out)
            built = index.store.collection_info(binding.collection) is not None
            out.append(
                ColumnStatus(
                    column=col.label,
                    collection=binding.collection,
                    rows=int(rows),
                    indexed_rows=(
                        sum(len(p) for p in _indexed_pages(index, binding.collection))
                        if built
                        else 0
                    ),
                    pending_jobs=int(entry.get("pending", 0)),
                    dead_jobs=int(entry.get("dead", 0)),
                    oldest_pending_age=None if oldest is None else (now - oldest).total_seconds(),
                    drift=index.bindings.drift_of(binding) if built else {},
                    retrying_jobs=int(entry.get("retrying", 0)),
                    errors=[
                        e for e in errors if (e["table"], e["column"]) == (col.table, col.name)
                    ],
                    index_state=index.store.index_state(binding.collection) if built else {},
                    unfilled_filters=sorted(index.bindings.untrusted(binding)) if built else [],
                    stale_keywords=index.bindings.stale_keywords(binding) if built else None,
                )
            )
    return out


def unmapped_jobs(
    index: SemanticIndex, bind: Engine | sessionmaker[Any] | None = None
) -> dict[tuple[str, str], int]:
    """Pending jobs naming a table and column that no model this index knows maps."""
    engine = _engine(index, bind)
    if not outbox.exists(engine):
        return {}
    with engine.connect() as conn:
        jobs = outbox.counts(conn)
    return {
        key: entry["pending"] + entry["dead"]
        for key, entry in jobs.items()
        if index.column_for(*key) is None
    }


# -- rebuilds -----------------------------------------------------------------------------------

REBUILD_MARK = "__rebuild_"
"""A rebuild of collection ``c`` is built in ``c + REBUILD_MARK + <config digest>``."""


def rebuild_name(index: SemanticIndex, column: SemanticColumn) -> str:
    """The collection a rebuild of ``column`` with its declared settings is built in.

    It depends on the model, dimension and chunking, so an interrupted rebuild resumes in the
    same collection, and one for other settings starts afresh.
    """
    return _build_name(index.binding_for(column))


def _build_name(binding: ColumnBinding) -> str:
    return f"{binding.collection}{REBUILD_MARK}{binding.fingerprint[:12]}"


@dataclass(frozen=True, slots=True)
class RebuildReport:
    """What :func:`rebuild` did for one column."""

    column: str
    collection: str
    built_in: str
    rows: int
    embedded: int
    reused: int
    failed: tuple[str, ...]
    switched: bool


def rebuild(
    index: SemanticIndex,
    model: type[Any],
    bind: Engine | sessionmaker[Any] | None = None,
    *,
    column: str | None = None,
    batch_size: int = 64,
    switch: bool = True,
    progress: bool | TextIO = False,
) -> list[RebuildReport]:
    """Re-embed ``model``'s semantic columns into new collections, then switch searches over.

    For each column, every row is chunked and embedded with the *declared* settings into a
    separate collection (:func:`rebuild_name`) while searches and writes keep using the current
    one. Then the store switches the column's collection to the new one atomically (a Qdrant
    alias; a directory swap for Qdrant Edge) and deletes the old one; the old collection is
    untouched until the switch has succeeded. Finally every row is queued and synced once more,
    through the outbox, so that writes committed during the rebuild reach the new collection.

    Interrupted, it resumes: chunks already in the new collection with the same text and
    settings are not embedded again.

    Args:
        index: The application's index.
        model: The mapped class.
        bind: Engine or sessionmaker of the database.
        column: Only this semantic attribute (default: all of the model's).
        batch_size: Rows read and embedded per batch.
        switch: ``False`` builds (or resumes) the new collection and stops before switching:
            deploy the code that declares the new settings, then run again to switch.
        progress: Show a progress bar (``True`` for stderr, or a stream).

    Returns:
        One report per column.

    Raises:
        ConfigurationError: The model has no such semantic column.
        SyncError: The store or the embedder failed (run again to resume).
    """
    columns = _columns(model, column)
    engine = _engine(index, bind)
    index.reach(engine, columns)
    reports: list[RebuildReport] = []
    for col in columns:
        binding = index.binding_for(col)
        live = binding.collection
        index.store.collection_info(live)  # Qdrant Edge: fails now if another process holds it
        build = binding.retarget(_build_name(binding))
        target = build.target
        left = index.store.collection_info(target)
        if left is not None and drift(left, build.spec):
            # not a build for these settings (e.g. the old collection a crash left behind)
            index.store.drop_collection(target)
        try:
            index.store.ensure_collection(build.spec)
        except CollectionMismatchError:  # left by another attempt under the same name
            index.store.drop_collection(target)
            index.store.ensure_collection(build.spec)
        embedded = reused = rows = 0
        failed: list[str] = []
        with _bar(None, f"rebuild {col.label}", progress) as bar:
            for page in _pages(engine, col, (), batch_size):
                part = [key for key, _ in page]
                with engine.connect() as conn:
                    values = read_values(conn, col, part, build.fields)
                report = index.applier.apply([SyncOp.of(build, pk, values.get(pk)) for pk in part])
                for group, error in report.failed:
                    if is_transient(error):
                        raise SyncError(
                            f"rebuilding {col.label} into {target!r} failed: {error}; run it again "
                            "to resume"
                        ) from error
                    failed.extend(op.pk for op in group)
                embedded += report.embedded
                reused += report.reused
                rows += len(part)
                bar.update(len(part))
        _record_refreshed(index, engine, build, target)  # (a build left by an earlier release)
        index.store.optimize(target)  # the new collection answers from a built index
        if switch:
            _switch(index, engine, binding, target)
        reports.append(
            RebuildReport(col.label, live, target, rows, embedded, reused, tuple(failed), switch)
        )
    return reports


def _table_keys(engine: Engine, column: SemanticColumn) -> list[str]:
    return [key for page in _pages(engine, column, (), _PAGE) for key, _ in page]


def _stray_keys(index: SemanticIndex, collection: str, keys: list[str]) -> list[str]:
    """Row keys ``collection`` holds points for that are not in ``keys`` (rows deleted since)."""
    held = {p.pk for page in _indexed_pages(index, collection) for p in page}
    return sorted(held - set(keys))


def _queue(engine: Engine, column: SemanticColumn, keys: list[str]) -> None:
    """Queue one job per key for ``column``, committed in batches."""
    for start in range(0, len(keys), _PAGE):
        with engine.begin() as conn:
            part = keys[start : start + _PAGE]
            outbox.enqueue(conn, [JobKey(column.table, column.name, k) for k in part])


def _switch(index: SemanticIndex, engine: Engine, binding: ColumnBinding, target: str) -> None:
    """Switch ``binding``'s collection to the finished ``target``, then reconcile writes made
    meanwhile.

    Writes committed while the rebuild read the table went to the old collection (or waited,
    refused by the drift check), and rows deleted meanwhile may still be in the new one. Every
    row, and every key the new collection holds that the table no longer has, is queued before
    the switch (so a crash right after it still converges) and processed after it, through the
    outbox so that the processing leases apply. Unchanged chunks are compared, not embedded.
    """
    col = binding.column
    live = binding.collection
    keys = _table_keys(engine, col)
    gone = _stray_keys(index, target, keys)
    if gone:
        index.store.delete_rows(target, [(pk, 0) for pk in gone])
    with engine.begin() as conn:
        index.prepare_outbox(conn)
    _queue(engine, col, keys + gone)
    index.store.replace_collection(live, target)
    index.bindings.forget(binding)
    log.info("semantic_orm: %s now searches %s (rebuilt)", col.label, live)
    with engine.begin() as conn:
        outbox.expedite(conn, col.table, col.name)  # jobs held back by the drift check
    # rows deleted or written between the checks above and the switch
    keys = _table_keys(engine, col)
    _queue(engine, col, keys + _stray_keys(index, live, keys))
    try:  # wait for them all, also those a concurrent pass (the background retrier) holds
        index.drain(engine, timeout=120, limit=500)
    except TimeoutError as exc:  # the switch stands; a worker finishes the rest
        log.warning(
            "semantic_orm: %s rebuilt, but its catch-up is not finished: %s", col.label, exc
        )


# -- garbage collection -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Orphan:
    """A collection no declared column uses."""

    collection: str
    reason: str
    points: int
    removable: bool

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "collection": self.collection,
            "reason": self.reason,
            "points": self.points,
            "removable": self.removable,
        }


def gc(
    index: SemanticIndex,
    bind: Engine | sessionmaker[Any] | None = None,
    *,
    dry_run: bool = False,
    force: bool = False,
) -> list[Orphan]:
    """Find (and unless ``dry_run``, drop) collections that no semantic column uses any more.

    Only collections created by semantic_orm under the index's ``collection_prefix`` are
    considered. A collection is removable when its table or column is gone from the database
    (dropped, or renamed: see the README), or when it is an unfinished rebuild for settings no
    column declares any more. One whose recorded table and column still exist is listed but
    kept: its model is probably not imported (pass ``models=`` to the index).

    Args:
        index: The application's index; it must know the models.
        bind: Engine or sessionmaker of the database.
        dry_run: Only list.
        force: Allow an empty ``collection_prefix`` on a Qdrant server (shared servers hold
            other applications' collections too; Qdrant Edge directories are the app's own).

    Returns:
        What was found, removable or not.

    Raises:
        ConfigurationError: The index knows no semantic column (its models are not imported),
            or the prefix is empty on a Qdrant server and ``force`` is false.
    """
    columns = index.columns()
    if not columns:
        raise ConfigurationError(
            "the index knows no SemanticText column, so every collection would look orphaned; "
            "pass models= to SemanticIndex (or import the models) before gc"
        )
    if not index.collection_prefix and not force and not isinstance(index.store, EdgeStore):
        raise ConfigurationError(
            "gc on a Qdrant server with an empty collection_prefix would also see other "
            "applications' collections (any whose table is not in this database looks "
            "orphaned): set SemanticIndex(collection_prefix=...), or pass force=True (--force) "
            "if this server holds only this application's collections"
        )
    engine = _engine(index, bind)
    known = {index.binding_for(c).collection: c for c in columns}
    inspector = inspect(engine)
    found: list[Orphan] = []
    for name in index.store.list_collections():
        if not name.startswith(index.collection_prefix) or name in known:
            continue
        info = index.store.collection_info(name) or {}
        if "layout" not in info:
            continue  # not made by semantic_orm
        base, mark, digest = name.rpartition(REBUILD_MARK)
        if name.endswith(".swap"):
            reason = "left by an interrupted directory swap"
            removable = True
        elif mark and base in known:
            col = known[base]
            if digest == index.binding_for(col).fingerprint[:12]:
                continue  # a rebuild for the declared settings: resumable, keep it
            reason = f"unfinished rebuild of {col.label} for settings no longer declared"
            removable = True
        else:
            table, column = info.get("table"), info.get("column")
            if (
                table is not None
                and column is not None
                and _column_exists(engine, inspector, str(table), str(column))
            ):
                reason = (
                    f"{table}.{column} still exists but no imported model declares it as "
                    "SemanticText: kept (import the model, or pass models= to the index)"
                )
                removable = False
            else:
                reason = f"{table}.{column} is gone from the database (dropped or renamed)"
                removable = True
        found.append(Orphan(name, reason, index.store.count(name), removable))
    if not dry_run:
        for orphan in found:
            if orphan.removable:
                index.store.drop_collection(orphan.collection)
    return found


def _column_exists(engine: Engine, inspector: Any, table: str, column: str) -> bool:
    declared, _, name = table.rpartition(".")
    schema = translated(declared or None, engine.get_execution_options())
    if not inspector.has_table(name, schema=schema):
        return False
    return any(c["name"] == column for c in inspector.get_columns(name, schema=schema))
