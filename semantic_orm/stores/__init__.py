"""Vector stores: a small protocol and two real Qdrant adapters.

* :class:`EdgeStore` - Qdrant Edge, in-process and persistent in a directory (the default).
* :class:`QdrantClientStore` - a Qdrant server or cluster by URL, or ``":memory:"`` local mode.

Both are imported lazily: the Qdrant packages load only when a store is used.
"""

from __future__ import annotations

from .base import CollectionSpec, StoreHit, VectorPoint, VectorStore, point_id
from .client import QdrantClientStore
from .edge import EdgeStore

__all__ = [
    "CollectionSpec",
    "EdgeStore",
    "QdrantClientStore",
    "StoreHit",
    "VectorPoint",
    "VectorStore",
    "point_id",
]
