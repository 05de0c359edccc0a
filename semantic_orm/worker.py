"""Workers that drain the outbox: a thread, an asyncio task, or ``semantic-orm worker``.

A worker repeatedly claims due jobs and syncs them (:meth:`SemanticIndex.process`). Retries back
off exponentially up to ``retry_cap``; transient errors (the store is unreachable) are retried
until they succeed, permanent ones (a value that cannot be embedded) are dead-lettered after
``max_attempts`` and never block the others. An idle worker only reads: it takes no write lock
until a job is due.

On PostgreSQL run as many workers as you like, in as many processes: jobs are leased in short
transactions (``FOR UPDATE SKIP LOCKED``, one row synced by one worker at a time). On SQLite run
one, in the application's process (where it waits for the application's own transactions
instead of failing them). With Qdrant Edge, the store directory belongs to one process: run the
worker in the application's process, or use a Qdrant server::

    worker = Worker(index, engine).start()        # a daemon thread
    ...
    worker.stop()

    worker = AsyncWorker(index, async_engine)     # an asyncio task (FastAPI's lifespan)
    worker.start()
    ...
    await worker.stop()

Both count what they did (:attr:`Worker.totals`, a
:class:`~semantic_orm.processing.ProcessReport`), which ``semantic-orm worker`` prints at an
interval. A pass that fails as a whole (the database is down, or the index refuses the
engine) is tried again after a wait that doubles up to :data:`FAILURE_WAIT_CAP` seconds; the
first failure is logged with its traceback, the same failure again once in a while, the
recovery once.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from typing import Any

from .index import SemanticIndex
from .processing import FAILURE_WAIT_CAP, ProcessReport, failure_wait

__all__ = ["FAILURE_WAIT_CAP", "AsyncWorker", "Worker"]

log = logging.getLogger("semantic_orm")


class _Drainer:
    """What both workers hold: the index, where its outbox lives, the pace, the totals."""

    def __init__(
        self,
        index: SemanticIndex,
        bind: Any = None,
        *,
        batch_size: int = 256,
        poll_interval: float = 1.0,
    ) -> None:
        self.index = index
        self.bind = bind
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.totals = ProcessReport()
        self.failures = 0
        """Passes failed in a row (0 once one succeeds)."""
        self._last_error = ""
        self._setup()

    def _setup(self) -> None:
        """Create what the worker's loop runs with (a thread's event, or a task's)."""

    def _failed(self) -> float:
        """Count and log the failure of the pass being handled; the seconds to wait."""
        exc = sys.exc_info()[1]
        error = f"{type(exc).__name__}: {exc}"
        self.failures += 1
        wait = failure_wait(self.poll_interval, self.failures)
        if error != self._last_error:  # a new failure: in full
            log.exception("semantic_orm worker: processing failed; trying again in %.3g s", wait)
        elif self.failures & (self.failures - 1) == 0:  # the same: at 2, 4, 8, ... in a row
            log.warning(
                "semantic_orm worker: processing still failing (%d passes in a row): %s; "
                "trying again in %.3g s",
                self.failures,
                error,
                wait,
            )
        self._last_error = error
        return wait

    def _succeeded(self) -> None:
        """A pass went through: log the recovery from failed ones."""
        if self.failures:
            log.warning(
                "semantic_orm worker: processing works again after %d failed passes",
                self.failures,
            )
        self.failures = 0
        self._last_error = ""

    @property
    def processed(self) -> int:
        """Jobs done so far."""
        return self.totals.done


class Worker(_Drainer):
    """Drains an index's outbox in this thread (:meth:`run`) or a daemon thread (:meth:`start`).

    Args:
        index: The index whose jobs to process.
        bind: The engine (or sessionmaker) whose database holds the outbox.
        batch_size: Jobs claimed per pass.
        poll_interval: Seconds to sleep when no job is due.
    """

    def _setup(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> ProcessReport:
        """Process one batch of due jobs."""
        report = self.index.process(self.bind, limit=self.batch_size)
        self.totals.add(report)
        return report

    def run(self, *, stop_when_idle: bool = False) -> None:
        """Process jobs until :meth:`stop` is called (or, optionally, until none is due)."""
        while not self._stop.is_set():
            try:
                report = self.run_once()
            except Exception:  # the database failed, or the index refused this engine (a
                # schema it does not serve): log, wait longer each time, try again
                self._stop.wait(self._failed())
                continue
            self._succeeded()
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


class AsyncWorker(_Drainer):
    """Drains an index's outbox as an asyncio task, never blocking the event loop.

    SQL is awaited on the loop; embedding and store calls run in worker threads.

    Args:
        index: The index whose jobs to process.
        bind: The ``AsyncEngine`` (or ``async_sessionmaker``) whose database holds the outbox.
        batch_size: Jobs claimed per pass.
        poll_interval: Seconds to sleep when no job is due.
    """

    def _setup(self) -> None:
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def run_once(self) -> ProcessReport:
        """Process one batch of due jobs."""
        report = await self.index.aprocess(self.bind, limit=self.batch_size)
        self.totals.add(report)
        return report

    async def run(self, *, stop_when_idle: bool = False) -> None:
        """Process jobs until :meth:`stop` is called (or, optionally, until none is due)."""
        while not self._stop.is_set():
            try:
                report = await self.run_once()
            except Exception:  # the database failed, or the index refused this engine (a
                # schema it does not serve): log, wait longer each time, try again
                await self._pause(self._failed())
                continue
            self._succeeded()
            if report.claimed == 0:
                if stop_when_idle:
                    return
                await self._pause(self.poll_interval)

    async def _pause(self, seconds: float) -> None:
        """Wait ``seconds``, or until :meth:`stop` is called."""
        try:
            await asyncio.wait_for(self._stop.wait(), seconds)
        except TimeoutError:
            pass

    def start(self) -> asyncio.Task[None]:
        """Run as a task of the running event loop; returns the task."""
        if self._task is None or self._task.done():
            self._stop.clear()
            self._task = asyncio.get_running_loop().create_task(self.run())
        return self._task

    async def stop(self) -> None:
        """Stop after the current batch, and wait for it; then delete the finished jobs of the
        application's commits that wait to be (:meth:`SemanticIndex.asettle
        <semantic_orm.index.SemanticIndex.asettle>`: a shutdown leaves none leased)."""
        self._stop.set()
        if self._task is not None:
            await self._task
            self._task = None
        await self.index.asettle(self.bind)
