"""Backfill, rebuilds and health: ``reindex``, ``rebuild``, ``gc`` and ``status``.

``reindex`` queues a job for every row of a model that has no vectors yet (or for every row with
``all_rows=True``), committing the jobs in batches, then drains them with a progress bar. It is
resumable: rows indexed before an interruption are skipped next time, and queued jobs survive in
the outbox. Unchanged chunks keep their vectors, so re-running it on an indexed table is cheap.

``rebuild`` re-embeds a column whose model or chunk settings changed into a new collection while
searches keep using the old one, then switches over (``semantic-orm reindex ... --rebuild``).
``gc`` finds the collections of dropped or renamed columns and of abandoned rebuilds
(``semantic-orm gc [--dry-run]``). ``status`` reports lag and drift per column.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

from sqlalchemy import Engine, func, inspect, select
from sqlalchemy.orm import Session, sessionmaker

from . import outbox
from .exc import CollectionMismatchError, ConfigurationError, SyncError
from .index import SemanticIndex, drift
from .mapping import SemanticColumn, row_key, semantic_columns
from .stores.edge import EdgeStore
from .sync import SyncOp, is_transient, read_values

__all__ = [
    "REBUILD_MARK",
    "ColumnStatus",
    "Orphan",
    "Progress",
    "RebuildReport",
    "gc",
    "rebuild",
    "rebuild_name",
    "reindex",
    "status",
]

log = logging.getLogger("semantic_orm")


class Progress:
    """A one-line progress bar with rate and ETA, written to a terminal (or any stream)."""

    def __init__(self, total: int, label: str, stream: TextIO | None = None) -> None:
        self.total = total
        self.label = label
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.started = time.monotonic()

    def advance(self, n: int) -> None:
        """Count ``n`` more items done and redraw."""
        self.done += n
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = self.done / elapsed
        remaining = (self.total - self.done) / rate if rate > 0 else float("inf")
        width = 30
        filled = int(width * self.done / self.total) if self.total else width
        eta = f"{remaining:5.0f}s" if remaining != float("inf") else "    ?"
        self.stream.write(
            f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] "
            f"{self.done}/{self.total}  {rate:7.1f}/s  ETA {eta}"
        )
        self.stream.flush()

    def close(self) -> None:
        """End the line."""
        self.stream.write("\n")
        self.stream.flush()


def _indexed_keys(index: SemanticIndex, column: SemanticColumn) -> set[str]:
    return {str(p.payload["pk"]) for p in index.store.points(index.collection_name(column))}


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
        all_rows: Queue every row, not only those without vectors.
        batch_size: Rows per committed batch of jobs.
        process: Drain the queued jobs before returning.
        progress: Show a progress bar (``True`` for stderr, or a stream).

    Returns:
        The number of jobs queued.
    """
    mapper = inspect(model)
    columns = semantic_columns(mapper)
    if not columns:
        raise ConfigurationError(f"{model.__name__} has no SemanticText column")
    engine = index.engine_for(bind)
    for col in columns:
        index.register_column(col)
    queued = 0
    stream = None if progress is False else (sys.stderr if progress is True else progress)
    with engine.begin() as conn:
        index.ensure_outbox(conn)
    # read every key first: on SQLite an open read cursor would block the job writes
    keys = _table_keys(engine, columns[0])
    for col in columns:
        have = set() if all_rows else _indexed_keys(index, col)
        bar = Progress(len(keys), f"queue {col.label}", stream) if stream else None
        for start in range(0, len(keys), batch_size):
            part = keys[start : start + batch_size]
            todo = [(col.table, col.column.name, k) for k in part if k not in have]
            with engine.begin() as writer:
                outbox.enqueue(writer, todo)
            queued += len(todo)
            if bar:
                bar.advance(len(part))
        if bar:
            bar.close()
    if process and queued:
        bar = Progress(queued, f"embed {model.__name__}", stream) if stream else None
        while True:
            report = index.process(engine, limit=batch_size)
            if bar and report.done:
                bar.advance(report.done)
            if report.claimed == 0:
                break
        if bar:
            bar.close()
    return queued


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

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "drift": {k: list(v) for k, v in self.drift.items()},
            "column": self.column,
            "collection": self.collection,
            "rows": self.rows,
            "indexed_rows": self.indexed_rows,
            "pending_jobs": self.pending_jobs,
            "dead_jobs": self.dead_jobs,
            "oldest_pending_age_s": self.oldest_pending_age,
        }


def status(
    index: SemanticIndex, bind: Engine | sessionmaker[Any] | None = None
) -> list[ColumnStatus]:
    """Rows, indexed rows, pending and dead jobs, lag and drift for each registered column."""
    engine = index.engine_for(bind)
    out: list[ColumnStatus] = []
    with engine.connect() as conn:
        with conn.begin():
            index.ensure_outbox(conn)
        jobs = outbox.counts(conn)
        now = dt.datetime.now(dt.UTC)
        for col in index.columns():
            rows = conn.execute(
                select(func.count()).select_from(col.mapper.local_table)
            ).scalar_one()
            entry = jobs.get((col.table, col.column.name), {})
            oldest = entry.get("oldest_pending")
            if oldest is not None and oldest.tzinfo is None:
                oldest = oldest.replace(tzinfo=dt.UTC)
            out.append(
                ColumnStatus(
                    column=col.label,
                    collection=index.collection_name(col),
                    rows=int(rows),
                    indexed_rows=len(_indexed_keys(index, col)),
                    pending_jobs=int(entry.get("pending", 0)),
                    dead_jobs=int(entry.get("dead", 0)),
                    oldest_pending_age=None if oldest is None else (now - oldest).total_seconds(),
                    drift=drift(
                        index.store.collection_info(index.collection_name(col)),
                        index.spec_for(col),
                    ),
                )
            )
    return out


# -- rebuilds -----------------------------------------------------------------------------------

REBUILD_MARK = "__rebuild_"
"""A rebuild of collection ``c`` is built in ``c + REBUILD_MARK + <config digest>``."""


def rebuild_name(index: SemanticIndex, column: SemanticColumn) -> str:
    """The collection a rebuild of ``column`` with its declared settings is built in.

    It depends on the model, dimension and chunking, so an interrupted rebuild resumes in the
    same collection, and one for other settings starts afresh.
    """
    return f"{index.collection_name(column)}{REBUILD_MARK}{index.fingerprint(column)[:12]}"


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
    mapper = inspect(model)
    columns = [c for c in semantic_columns(mapper) if column is None or c.key == column]
    if not columns:
        raise ConfigurationError(
            f"{model.__name__} has no SemanticText column"
            + (f" named {column!r}" if column is not None else "")
        )
    engine = index.engine_for(bind)
    stream = None if progress is False else (sys.stderr if progress is True else progress)
    keys = _table_keys(engine, columns[0])
    reports: list[RebuildReport] = []
    for col in columns:
        index.register_column(col)
        live = index.collection_name(col)
        index.store.collection_info(live)  # Qdrant Edge: fails now if another process holds it
        target = rebuild_name(index, col)
        spec = dataclasses.replace(index.spec_for(col), name=target)
        left = index.store.collection_info(target)
        if left is not None and drift(left, spec):
            # not a build for these settings (e.g. the old collection a crash left behind)
            index.store.drop_collection(target)
        try:
            index.store.ensure_collection(spec)
        except CollectionMismatchError:  # left by another attempt under the same name
            index.store.drop_collection(target)
            index.store.ensure_collection(spec)
        embedded = reused = 0
        failed: list[str] = []
        bar = Progress(len(keys), f"rebuild {col.label}", stream) if stream else None
        for start in range(0, len(keys), batch_size):
            part = keys[start : start + batch_size]
            with Session(engine) as session:
                values = read_values(session, col, part)
            ops = [SyncOp(col, pk, values.get(pk)) for pk in part]
            report = index.syncer.apply(ops, into=target)
            for group, error in report.failed:
                if is_transient(error):
                    raise SyncError(
                        f"rebuilding {col.label} into {target!r} failed: {error}; run it again "
                        "to resume"
                    ) from error
                failed.extend(op.pk for op in group)
            embedded += report.embedded
            reused += report.reused
            if bar:
                bar.advance(len(part))
        if bar:
            bar.close()
        if switch:
            _switch(index, engine, col, live, target)
        reports.append(
            RebuildReport(
                col.label, live, target, len(keys), embedded, reused, tuple(failed), switch
            )
        )
    return reports


def _table_keys(engine: Engine, column: SemanticColumn) -> list[str]:
    """Every row key of ``column``'s table, in primary-key order."""
    pk = column.mapper.primary_key
    with engine.connect() as conn:
        return [row_key(tuple(row)) for row in conn.execute(select(*pk).order_by(*pk))]


def _stray_keys(index: SemanticIndex, collection: str, keys: list[str]) -> list[str]:
    """Row keys ``collection`` holds points for that are not in ``keys`` (rows deleted since)."""
    return sorted({str(p.payload["pk"]) for p in index.store.points(collection)} - set(keys))


def _queue(engine: Engine, index: SemanticIndex, column: SemanticColumn, keys: list[str]) -> None:
    """Queue one job per key for ``column``, committed in batches."""
    for start in range(0, len(keys), 1000):
        with engine.begin() as conn:
            index.ensure_outbox(conn)
            part = keys[start : start + 1000]
            outbox.enqueue(conn, [(column.table, column.column.name, k) for k in part])


def _switch(
    index: SemanticIndex, engine: Engine, col: SemanticColumn, live: str, target: str
) -> None:
    """Switch ``live`` to the finished ``target``, then reconcile writes made meanwhile.

    Writes committed while the rebuild read the table went to the old collection (or waited,
    refused by the drift check), and rows deleted meanwhile may still be in the new one. Every
    row, and every key the new collection holds that the table no longer has, is queued before
    the switch (so a crash right after it still converges) and processed after it, through the
    outbox so that workers' row locks apply. Unchanged chunks are compared, not embedded.
    """
    keys = _table_keys(engine, col)
    gone = _stray_keys(index, target, keys)
    if gone:
        index.store.delete_rows(target, [(pk, 0) for pk in gone])
    _queue(engine, index, col, keys + gone)
    index.store.replace_collection(live, target)
    index.forget_collection(col)
    log.info("semantic_orm: %s now searches %s (rebuilt)", col.label, live)
    with engine.begin() as conn:
        outbox.expedite(conn, col.table, col.column.name)  # jobs held back by the drift check
    # rows deleted or written between the checks above and the switch
    keys = _table_keys(engine, col)
    _queue(engine, index, col, keys + _stray_keys(index, live, keys))
    while index.process(engine, limit=500).claimed:
        pass


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
        index: The application's index; it must know the models (``models=``).
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
    engine = index.engine_for(bind)
    known = {index.collection_name(c): c for c in columns}
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
            if digest == index.fingerprint(col)[:12]:
                continue  # a rebuild for the declared settings: resumable, keep it
            reason = f"unfinished rebuild of {col.label} for settings no longer declared"
            removable = True
        else:
            table, column = info.get("table"), info.get("column")
            if (
                table is not None
                and column is not None
                and _column_exists(inspector, str(table), str(column))
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


def _column_exists(inspector: Any, table: str, column: str) -> bool:
    schema, _, name = table.rpartition(".")
    if not inspector.has_table(name, schema=schema or None):
        return False
    return any(c["name"] == column for c in inspector.get_columns(name, schema=schema or None))
