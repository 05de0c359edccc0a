"""Vector stores: two small protocols and two real Qdrant adapters.

* :class:`EdgeStore` - Qdrant Edge, in-process and persistent in a directory (the default).
* :class:`QdrantClientStore` - a Qdrant server or cluster by URL, or ``":memory:"`` local mode.

The protocols (:class:`VectorStore` for syncing and searching, :class:`StoreAdmin` for tools,
:class:`Store` for both) and the values that cross them live in :mod:`.base`; what the two
adapters share lives in :mod:`.qdrant`. Both import their Qdrant package lazily.
"""

from __future__ import annotations

from .base import (
    CollectionSpec,
    PointPayload,
    SearchRequest,
    Store,
    StoreAdmin,
    StoreHit,
    VectorPoint,
    VectorStore,
    point_id,
)
from .client import QdrantClientStore
from .edge import EdgeStore

__all__ = [
    "CollectionSpec",
    "EdgeStore",
    "PointPayload",
    "QdrantClientStore",
    "SearchRequest",
    "Store",
    "StoreAdmin",
    "StoreHit",
    "VectorPoint",
    "VectorStore",
    "point_id",
]
