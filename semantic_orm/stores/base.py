"""The vector-store protocol and the values that cross it.

A store keeps one *collection* per semantic column. Each chunk of a row is one *point*:

* its id is derived deterministically from ``(collection, primary key, chunk index)``
  (:func:`point_id`), so writing the same row twice overwrites the same points;
* its payload holds ``table``, ``pk`` (the row's key as a string), ``column``, ``chunk_index``,
  ``start_offset``, ``end_offset`` and ``total_chunks``, so a hit says which passage matched.

Each point carries two named vectors: ``"dense"`` (the embedding, cosine) and ``"bm25"`` (a
sparse keyword vector from :mod:`semantic_orm.keywords`, scored with Qdrant's IDF modifier).
:meth:`VectorStore.search` ranks by either, or fuses both rankings with reciprocal rank fusion
(``mode="hybrid"``): Qdrant runs the two searches as *prefetches* and merges them, each point
scoring ``sum(1 / (k + rank))`` over the lists it appears in (ranks from 0).

Collections record what produced their vectors (model name, dimension, chunker settings, library
version). Opening a collection whose model or dimension differs from the column's configuration
raises :class:`~semantic_orm.exc.CollectionMismatchError`: mixing vector spaces gives meaningless
scores, never an error, so we refuse it up front. A collection written by semantic_orm before
hybrid search (one unnamed dense vector, no ``layout`` in its metadata) is refused the same way:
drop it and re-index.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from ..exc import CollectionMismatchError

__all__ = [
    "COLLECTION_LAYOUT",
    "DEFAULT_BATCH_SIZE",
    "DENSE_VECTOR",
    "RRF_K",
    "SPARSE_VECTOR",
    "CollectionSpec",
    "SearchMode",
    "SparseVector",
    "StoreHit",
    "VectorPoint",
    "VectorStore",
    "check_collection_matches",
    "point_id",
]

DEFAULT_BATCH_SIZE = 256
DENSE_VECTOR = "dense"
SPARSE_VECTOR = "bm25"
COLLECTION_LAYOUT = "dense+bm25"
"""Recorded as ``layout`` in collection metadata; older collections have none."""
RRF_K = 60
"""Reciprocal rank fusion constant (the value of the original RRF paper)."""
SearchMode = Literal["hybrid", "dense", "keyword"]
_POINT_NAMESPACE = uuid.UUID("6f1c3c9e-6a52-4b7e-9a1d-5e0d3c2b9a41")


def point_id(collection: str, pk: str, chunk_index: int) -> str:
    """Deterministic point id (a UUID string) for one chunk of one row."""
    return str(uuid.uuid5(_POINT_NAMESPACE, f"{collection}\x1f{pk}\x1f{chunk_index}"))


@dataclass(frozen=True, slots=True)
class CollectionSpec:
    """What a collection must hold: vectors of ``dimension`` from ``model``.

    ``metadata`` is recorded with the collection when it is created (chunker settings, library
    version); only ``model`` and ``dimension`` are checked when it is opened again.
    """

    name: str
    dimension: int
    model: str
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """The metadata stored with the collection."""
        return {
            **self.metadata,
            "model": self.model,
            "dimension": self.dimension,
            "layout": COLLECTION_LAYOUT,
        }


@dataclass(frozen=True, slots=True)
class SparseVector:
    """A sparse vector: sorted, distinct ``indices`` and their ``values``."""

    indices: tuple[int, ...]
    values: tuple[float, ...]

    def __bool__(self) -> bool:
        return bool(self.indices)


@dataclass(frozen=True, slots=True)
class VectorPoint:
    """One chunk's dense vector, optional keyword vector and payload, ready to upsert."""

    id: str
    vector: npt.NDArray[np.float32]
    payload: Mapping[str, Any]
    sparse: SparseVector | None = None


@dataclass(frozen=True, slots=True)
class StoreHit:
    """A point returned by a store query: its id, score, payload and (if asked) vector."""

    id: str
    score: float
    payload: Mapping[str, Any]
    vector: npt.NDArray[np.float32] | None = None


@runtime_checkable
class VectorStore(Protocol):
    """What semantic_orm needs from a vector database."""

    def ensure_collection(self, spec: CollectionSpec) -> None:
        """Create the collection if missing; refuse one built by another model or dimension."""
        ...

    def upsert(self, collection: str, points: Sequence[VectorPoint]) -> None:
        """Insert or overwrite points, in batches."""
        ...

    def delete_rows(self, collection: str, rows: Sequence[tuple[str, int]]) -> None:
        """For each ``(pk, from_index)``, delete points with ``chunk_index >= from_index``.

        ``from_index=0`` removes the row entirely; ``from_index=n`` prunes what an update to ``n``
        chunks left behind. Done in batched filter deletes, not one call per row.
        """
        ...

    def search(
        self,
        collection: str,
        vector: npt.NDArray[np.float32] | None,
        limit: int,
        *,
        sparse: SparseVector | None = None,
        mode: SearchMode = "dense",
        score_threshold: float | None = None,
    ) -> list[StoreHit]:
        """The ``limit`` best points, best first.

        ``mode="dense"`` ranks by cosine to ``vector``; ``"keyword"`` by BM25 score against
        ``sparse``; ``"hybrid"`` fuses both rankings (RRF, scores ``sum(1 / (RRF_K + rank))``).
        ``score_threshold`` bounds the cosine in dense and hybrid mode (in hybrid mode it filters
        the dense candidates before fusion) and the BM25 score in keyword mode.
        """
        ...

    def points(self, collection: str, pk: str | None = None) -> list[StoreHit]:
        """Every point of the collection, or of one row; score is 0. For tests and tools."""
        ...

    def existing(self, collection: str, pks: Sequence[str]) -> list[StoreHit]:
        """The points of rows ``pks``, with payloads and vectors (for incremental updates)."""
        ...

    def count(self, collection: str) -> int:
        """Number of points in the collection (0 if it does not exist)."""
        ...

    def drop_collection(self, collection: str) -> None:
        """Delete the collection and its points, if it exists."""
        ...

    def collection_info(self, collection: str) -> dict[str, Any] | None:
        """The metadata recorded when the collection was created; ``None`` if it is missing."""
        ...

    def list_collections(self) -> list[str]:
        """Names of the collections (as searched: aliases rather than what they point to)."""
        ...

    def replace_collection(self, collection: str, source: str) -> None:
        """Make ``collection`` serve what ``source`` holds, atomically for searches.

        ``source`` is a finished collection (e.g. a rebuild). Until the switch, ``collection``
        keeps answering with its old points; after it, ``source`` no longer exists under its own
        name and the old points are deleted. Qdrant servers switch an alias; Qdrant Edge swaps
        directories.
        """
        ...

    def close(self) -> None:
        """Release connections and files."""
        ...


def check_collection_matches(
    spec: CollectionSpec,
    found_dimension: int | None,
    found: Mapping[str, Any] | None,
    *,
    found_layout: str | None = COLLECTION_LAYOUT,
) -> None:
    """Raise if an existing collection's vectors do not match ``spec``.

    Args:
        spec: What the column is configured to produce.
        found_dimension: The collection's vector size, as the store reports it.
        found: The metadata recorded when the collection was created (``None`` if absent).
        found_layout: The collection's vector layout as the store sees it (``None``: the
            pre-hybrid single unnamed vector).

    Raises:
        CollectionMismatchError: Naming both the stored and the configured model and dimension,
            or saying the collection predates the dense + keyword layout.
    """
    if found is not None and "model" in found:
        found_layout = found.get("layout")
    if found_layout != COLLECTION_LAYOUT:
        raise CollectionMismatchError(
            f"collection {spec.name!r} was created by an older semantic_orm with a single unnamed "
            f"vector; this version stores named {DENSE_VECTOR!r} and {SPARSE_VECTOR!r} (keyword) "
            "vectors for hybrid search. Drop the collection and re-index "
            "(semantic-orm reindex ... --all), or point the column at a new collection."
        )
    found_model = (found or {}).get("model")
    if found_dimension == spec.dimension and (found_model is None or found_model == spec.model):
        return
    raise CollectionMismatchError(
        f"collection {spec.name!r} holds {found_dimension}-dimensional vectors from model "
        f"{found_model or 'unknown'!r}, but its column is configured for "
        f"{spec.dimension}-dimensional vectors from model {spec.model!r}. Searching would compare "
        "unrelated vector spaces. Use the original model, point the column at a new collection "
        "(SemanticText(collection=...)), or drop this collection and re-index."
    )
