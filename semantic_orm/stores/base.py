"""The vector-store protocol and the values that cross it.

A store keeps one *collection* per semantic column. Each chunk of a row is one *point*:

* its id is derived deterministically from ``(collection, primary key, chunk index)``
  (:func:`point_id`), so writing the same row twice overwrites the same points;
* its payload holds ``table``, ``pk`` (the row's key as a string), ``column``, ``chunk_index``,
  ``start_offset``, ``end_offset`` and ``total_chunks``, so a hit says which passage matched.

Collections record what produced their vectors (model name, dimension, chunker settings, library
version). Opening a collection whose model or dimension differs from the column's configuration
raises :class:`~semantic_orm.exc.CollectionMismatchError`: mixing vector spaces gives meaningless
scores, never an error, so we refuse it up front.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from ..exc import CollectionMismatchError

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "CollectionSpec",
    "StoreHit",
    "VectorPoint",
    "VectorStore",
    "check_collection_matches",
    "point_id",
]

DEFAULT_BATCH_SIZE = 256
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
        return {**self.metadata, "model": self.model, "dimension": self.dimension}


@dataclass(frozen=True, slots=True)
class VectorPoint:
    """One chunk's vector and payload, ready to upsert."""

    id: str
    vector: npt.NDArray[np.float32]
    payload: Mapping[str, Any]


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
        vector: npt.NDArray[np.float32],
        limit: int,
        *,
        score_threshold: float | None = None,
    ) -> list[StoreHit]:
        """The ``limit`` points nearest to ``vector`` (cosine), best first."""
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

    def close(self) -> None:
        """Release connections and files."""
        ...


def check_collection_matches(
    spec: CollectionSpec, found_dimension: int | None, found: Mapping[str, Any] | None
) -> None:
    """Raise if an existing collection's vectors do not match ``spec``.

    Args:
        spec: What the column is configured to produce.
        found_dimension: The collection's vector size, as the store reports it.
        found: The metadata recorded when the collection was created (``None`` if absent).

    Raises:
        CollectionMismatchError: Naming both the stored and the configured model and dimension.
    """
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
