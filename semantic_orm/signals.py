"""Signals sent by semantic_orm, for logging, metrics and tests.

Signals use `blinker <https://blinker.readthedocs.io>`_ through a private namespace. The sender is
always the model class, and every payload is passed as keyword arguments::

    from semantic_orm import signals

    @signals.synced.connect_via(KnowledgeArticle)
    def on_synced(sender, **kw):
        print(sender.__name__, kw["column"], kw["upserted"], kw["deleted"])

=================  ==========================================================================
signal             keyword payload
=================  ==========================================================================
``chunked``        ``column`` (str), ``pk`` (str key), ``chunks`` (list[Chunk])
``embedded``       ``column``, ``count`` (number of vectors), ``model`` (embedder name),
                   ``seconds`` (float)
``synced``         ``column``, ``upserted`` (list of pk keys), ``deleted`` (list of pk keys),
                   ``points`` (number of points written)
``sync-failed``    ``column``, ``pks`` (list of pk keys), ``error`` (the exception)
``searched``       ``column``, ``query`` (str), ``hits`` (list[SearchHit]), ``seconds`` (float)
=================  ==========================================================================

Payloads are only built when a receiver is connected, so unused signals cost nothing.
"""

from __future__ import annotations

from blinker import Namespace

__all__ = ["chunked", "embedded", "searched", "sync_failed", "synced"]

_signals = Namespace()

chunked = _signals.signal("chunked", doc="A row's semantic value was split into chunks.")
embedded = _signals.signal("embedded", doc="A batch of chunks was embedded.")
synced = _signals.signal("synced", doc="Committed changes reached the vector store.")
sync_failed = _signals.signal("sync-failed", doc="Committed changes could not be synced.")
searched = _signals.signal("searched", doc="A semantic search returned results.")
