"""What a process forked from this one must do before it touches what it inherited.

A server that loads the application before forking its workers (``gunicorn --preload``,
``multiprocessing`` with ``fork``) hands each worker a copy of the parent's objects: open Qdrant
Edge shards, lease tokens, waiting jobs, locks another thread held at the fork. Modules that own
such state register a callback with :func:`in_forked_child`. The interpreter's hook is
registered with the first callback (importing semantic_orm registers nothing) and runs where
Python forks; a fork made from C without it (uWSGI without ``lazy-apps``) skips it.
"""

from __future__ import annotations

import os
from collections.abc import Callable

__all__ = ["in_forked_child"]

_callbacks: list[Callable[[], None]] = []


def in_forked_child(callback: Callable[[], None]) -> None:
    """Run ``callback`` in every process forked from this one from now on (once per fork,
    however often it is registered)."""
    if callback in _callbacks:
        return
    if not _callbacks and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_run)
    _callbacks.append(callback)


def _run() -> None:
    for callback in list(_callbacks):
        callback()
