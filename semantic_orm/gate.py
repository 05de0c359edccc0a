"""In-process coordination of SQLite writers: the sync's short writes wait for the app's work.

SQLite has one writer, and in WAL mode a transaction that has read cannot write once another
connection has committed since its read began (``database is locked``, at once, whatever the
busy timeout). An application's own read-then-write transactions would then fail whenever the
sync (a worker thread, or inline processing) committed its bookkeeping in between. The
:class:`WriteGate` of an engine prevents that inside one process:

* every transaction of an installed session on a SQLite engine *enters* the gate when it
  begins and *leaves* it when it ends (:meth:`WriteGate.enter`, :meth:`WriteGate.leave`);
* the sync runs each of its short write transactions inside :meth:`WriteGate.writing`, which
  waits until no other thread has a transaction open. While it waits, new transactions wait at
  their start (writer preference), so it gets its turn under steady traffic.

All waits are bounded (``max_wait``): a session left open for minutes delays the sync by at most
that long, never forever. A thread never waits for itself (its own open transaction does not
block its sync), and a thread running an event loop never blocks in :meth:`enter`.
Processes other than this one are not coordinated: on SQLite, run the worker in the
application's process (as Qdrant Edge requires anyway).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["WriteGate"]


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class WriteGate:
    """Lets one writer in between the open transactions of the other threads.

    Args:
        max_wait: Longest wait, in seconds, on either side.
    """

    def __init__(self, max_wait: float = 2.0) -> None:
        self.max_wait = max_wait
        self._cond = threading.Condition()
        self._active: dict[int, int] = {}
        self._waiting = 0
        self._writing = 0

    def enter(self) -> None:
        """A transaction begins on this thread."""
        me = threading.get_ident()
        with self._cond:
            if not self._active.get(me) and not _in_event_loop():
                deadline = time.monotonic() + self.max_wait
                while self._writing or self._waiting:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
            self._active[me] = self._active.get(me, 0) + 1

    def leave(self) -> None:
        """A transaction of this thread ended."""
        me = threading.get_ident()
        with self._cond:
            count = self._active.get(me, 0) - 1
            if count > 0:
                self._active[me] = count
            else:
                self._active.pop(me, None)
                self._cond.notify_all()

    def _others_active(self, me: int) -> bool:
        return any(count for tid, count in self._active.items() if tid != me)

    def open_transactions(self) -> int:
        """Transactions open now, in every thread."""
        with self._cond:
            return sum(self._active.values())

    def busy(self) -> bool:
        """Whether another thread has a transaction open (for callers that must not block)."""
        with self._cond:
            return bool(self._writing) or self._others_active(threading.get_ident())

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Hold the gate for one short write transaction of the sync."""
        me = threading.get_ident()
        with self._cond:
            self._waiting += 1
            deadline = time.monotonic() + self.max_wait
            try:
                while self._writing or self._others_active(me):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
            finally:
                self._waiting -= 1
            self._writing += 1
        try:
            yield
        finally:
            with self._cond:
                self._writing -= 1
                self._cond.notify_all()
