"""What a process forked from this one must do before it touches what it inherited.

A server that loads the application before forking its workers (``gunicorn --preload``,
``multiprocessing`` with ``fork``) hands each worker a copy of the parent's objects: open Qdrant
Edge shards, lease tokens, waiting jobs, locks another thread held at the fork. Modules that own
such state register a callback with :func:`in_forked_child`; a lock that another thread may
hold while a server forks (the retrier's or the settle timer's, in the middle of a write) is a
:class:`RenewedLock`, fresh in every child before any callback runs. The interpreter's hook is
registered with the first callback or the first lock taken (importing semantic_orm registers
nothing) and runs where Python forks; a fork made from C without it (uWSGI without
``lazy-apps``) skips it.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["RenewedLock", "in_forked_child"]

_callbacks: list[Callable[[], None]] = []
_hooked = False


def _hook() -> None:
    """Register the interpreter's hook (once)."""
    global _hooked
    if not _hooked and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_run)
    _hooked = True


def in_forked_child(callback: Callable[[], None]) -> None:
    """Run ``callback`` in every process forked from this one from now on (once per fork,
    however often it is registered), after the :class:`RenewedLock` objects are renewed."""
    if callback in _callbacks:
        return
    _hook()
    _callbacks.append(callback)


def _run() -> None:
    for lock in list(_locks):  # first: a callback may take one
        lock._lock = threading.RLock() if lock._reentrant else threading.Lock()
    for callback in list(_callbacks):
        callback()


_locks: weakref.WeakSet[RenewedLock] = weakref.WeakSet()


class RenewedLock:
    """A ``threading.Lock`` (an ``RLock`` with ``reentrant``) that every forked child gets
    anew: a child inherits each lock as it was at the fork, and one another thread of the
    parent held then would stay held in the child for good (its first use would hang).

    Args:
        reentrant: Make it an ``RLock``.
    """

    __slots__ = ("__weakref__", "_lock", "_reentrant")

    def __init__(self, reentrant: bool = False) -> None:
        self._reentrant = reentrant
        self._lock: Any = threading.RLock() if reentrant else threading.Lock()
        _locks.add(self)  # the hook comes with the first use: a lock made at import adds none

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the lock (as ``threading.Lock.acquire``)."""
        if not _hooked:
            _hook()
        return bool(self._lock.acquire(blocking, timeout))

    def release(self) -> None:
        """Give the lock back."""
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
