"""What a process forked from this one must do before it touches what it inherited.

A server that loads the application before forking its workers (``gunicorn --preload``,
``multiprocessing`` with ``fork``) hands each worker a copy of the parent's objects: open Qdrant
Edge shards, lease tokens, waiting jobs, locks another thread held at the fork. Modules that own
such state register a callback with :func:`in_forked_child`; a lock that another thread may
hold while a server forks (the retrier's or the settle timer's, in the middle of a write) is a
:class:`RenewedLock`, fresh in every child before any callback runs; a process that loaded or
ran a torch model (:func:`running_torch`) has its children run torch on one thread (PyTorch's
OpenMP threads do not survive a fork). The interpreter's hook is registered with the first
callback or the first lock taken (importing semantic_orm registers nothing) and runs where
Python forks; a fork made from C without it (uWSGI without ``lazy-apps``) skips it.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["RenewedLock", "in_forked_child", "running_torch"]

log = logging.getLogger("semantic_orm")

_callbacks: list[Callable[[], None]] = []
_hooked = False
_hooking = threading.Lock()


def _hook() -> None:
    """Register the interpreter's hook (once)."""
    global _hooked
    with _hooking:
        if not _hooked and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_run)
        _hooked = True


def in_forked_child(callback: Callable[[], None]) -> None:
    """Run ``callback`` in every process forked from this one from now on (once per fork,
    however often it is registered), after the :class:`RenewedLock` objects are renewed."""
    _hook()
    with _hooking:
        if callback not in _callbacks:
            _callbacks.append(callback)


def _run() -> None:
    global _hooking
    _hooking = threading.Lock()
    me = threading.get_ident()  # the thread that forked: the child's only one
    for lock in list(_locks):  # first: a callback may take one
        if not lock._held_by(me):  # one the forking thread holds it still releases itself
            lock._lock = threading.RLock() if lock._reentrant else threading.Lock()
            lock._owner = None
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

    __slots__ = ("__weakref__", "_lock", "_owner", "_reentrant")

    def __init__(self, reentrant: bool = False) -> None:
        self._reentrant = reentrant
        self._lock: Any = threading.RLock() if reentrant else threading.Lock()
        self._owner: int | None = None  # (a plain lock's holder; an RLock knows its own)
        _locks.add(self)  # the hook comes with the first use: a lock made at import adds none

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the lock (as ``threading.Lock.acquire``)."""
        if not _hooked:
            _hook()
        got = bool(self._lock.acquire(blocking, timeout))
        if got and not self._reentrant:
            self._owner = threading.get_ident()
        return got

    def release(self) -> None:
        """Give the lock back."""
        if not self._reentrant:
            self._owner = None
        self._lock.release()

    def _held_by(self, thread: int) -> bool:
        if self._reentrant:
            return bool(self._lock._is_owned())
        return self._owner == thread

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


_torch_ran = False
"""Whether this process has run a torch model (on the CPU its OpenMP threads are then up)."""


def running_torch() -> None:
    """Note that a torch model loads or runs in this process: a process forked from it from
    now on runs torch on one thread (:func:`_one_torch_thread`)."""
    global _torch_ran
    if not _torch_ran:
        in_forked_child(_one_torch_thread)
        _torch_ran = True


def _one_torch_thread() -> None:
    """In a process forked from one that ran a torch model: torch on one thread.

    GNU OpenMP's threads do not survive a fork, and the child's first parallel region waits
    for them for good: a worker forked after the app embedded (a warm-up under ``gunicorn
    --preload``) hung on its first embedding. On one thread no parallel region starts.
    """
    import torch

    if torch.get_num_threads() > 1:
        torch.set_num_threads(1)
        log.warning(
            "semantic_orm: this process was forked from one that had run a torch model; "
            "PyTorch's OpenMP threads do not survive a fork (the next parallel work would wait "
            "for them for good), so torch runs on one thread here. To use more, run the model "
            "only after the fork (no embedding before it, e.g. no warm-up under gunicorn "
            "--preload), or use backend='onnx'"
        )
