"""Workers that drain the outbox: in a background thread, or as ``semantic-orm worker``.

A worker repeatedly claims due jobs and syncs them (:meth:`SemanticIndex.process`). Retries back
off exponentially up to ``retry_cap``; transient errors (the store is unreachable) are retried
until they succeed, permanent ones (a value that cannot be embedded) are dead-lettered after
``max_attempts`` and never block the others.

On PostgreSQL run as many workers as you like, in as many processes: jobs are claimed with
``FOR UPDATE SKIP LOCKED`` and each row is synced by one worker at a time. On SQLite run one.
With Qdrant Edge, the store directory belongs to one process: run the worker in the
application's process (:meth:`Worker.start`), or use a Qdrant server.

    worker = Worker(index, engine).start()   # background thread
    ...
    worker.stop()
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import sessionmaker

from .index import SemanticIndex
from .processing import ProcessReport

__all__ = ["Worker"]

log = logging.getLogger("semantic_orm")


class Worker:
    """Drains an index's outbox.

    Args:
        index: The index whose jobs to process.
        bind: The engine (or sessionmaker) whose database holds the outbox.
        batch_size: Jobs claimed per pass.
        poll_interval: Seconds to sleep when no job is due.
    """

    def __init__(
        self,
        index: SemanticIndex,
        bind: Engine | sessionmaker[Any] | None = None,
        *,
        batch_size: int = 256,
        poll_interval: float = 1.0,
    ) -> None:
        self.index = index
        self.bind = bind
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.processed = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> ProcessReport:
        """Process one batch of due jobs."""
        report = self.index.process(self.bind, limit=self.batch_size)
        self.processed += report.done
        return report

    def run(self, *, stop_when_idle: bool = False) -> None:
        """Process jobs until :meth:`stop` is called (or, optionally, until none is due)."""
        while not self._stop.is_set():
            try:
                report = self.run_once()
            except Exception:  # the database itself failed: log, wait, try again
                log.exception("semantic_orm worker: processing failed")
                self._stop.wait(self.poll_interval)
                continue
            if report.claimed == 0:
                if stop_when_idle:
                    return
                self._stop.wait(self.poll_interval)

    def start(self) -> Worker:
        """Run in a daemon thread; returns ``self``."""
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name="semantic-orm-worker", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 30.0) -> None:
        """Ask the loop to stop and wait for the current batch to finish."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
