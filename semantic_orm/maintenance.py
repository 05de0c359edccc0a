"""Backfill and health: ``reindex()`` queues rows for embedding, ``status()`` reports lag.

``reindex`` queues a job for every row of a model that has no vectors yet (or for every row with
``all_rows=True``), committing the jobs in batches, then drains them with a progress bar. It is
resumable: rows indexed before an interruption are skipped next time, and queued jobs survive in
the outbox. Unchanged chunks keep their vectors, so re-running it on an indexed table is cheap.
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

from sqlalchemy import Engine, func, inspect, select
from sqlalchemy.orm import sessionmaker

from . import outbox
from .exc import ConfigurationError
from .index import SemanticIndex
from .mapping import SemanticColumn, row_key, semantic_columns

__all__ = ["ColumnStatus", "Progress", "reindex", "status"]


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
        keys = [
            row_key(tuple(row))
            for row in conn.execute(select(*mapper.primary_key).order_by(*mapper.primary_key))
        ]
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

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
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
    """Rows, indexed rows, pending and dead jobs, and lag for each registered column."""
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
                )
            )
    return out
