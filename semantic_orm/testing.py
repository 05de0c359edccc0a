"""Test doubles shipped with the library, for testing code that uses semantic_orm.

:class:`HashEmbedder` is a deterministic, dependency-free embedder: each text becomes a
normalized bag of hashed words. Texts sharing words get similar
vectors, so plumbing tests can assert rankings without loading a model. It is not a language
model: use a real one to test search quality.

:class:`FlakyStore` wraps any store and fails on demand, to test what happens when the vector
store is down.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .exc import VectorStoreError
from .stores.base import (
    CollectionSpec,
    SearchMode,
    SparseVector,
    StoreHit,
    VectorPoint,
    VectorStore,
)

__all__ = ["FlakyStore", "HashEmbedder"]

_WORD = re.compile(r"\w+")


class HashEmbedder:
    """Deterministic feature-hashing embedder (no model, no network).

    Args:
        dimension: Vector length.
        name: Model name recorded with collections.
        max_seq_length: Reported window, in "tokens" (words).
    """

    def __init__(
        self, dimension: int = 64, *, name: str = "hash-embedder", max_seq_length: int | None = None
    ) -> None:
        self._dimension = dimension
        self._name = name
        self._max = max_seq_length
        self.calls = 0
        self.texts_encoded = 0

    @property
    def name(self) -> str:
        """Name recorded with the collections it fills."""
        return self._name

    @property
    def dimension(self) -> int:
        """Vector length."""
        return self._dimension

    @property
    def max_seq_length(self) -> int | None:
        """Reported window in words, or ``None``."""
        return self._max

    def encode(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Hash each text's lower-cased words into a signed unit vector."""
        self.calls += 1
        self.texts_encoded += len(texts)
        out = np.zeros((len(texts), self._dimension), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in _WORD.findall(text.lower()):
                value = zlib.crc32(word.encode("utf-8"))
                out[row, value % self._dimension] += 1.0 if value & 0x80000000 else -1.0
            norm = float(np.linalg.norm(out[row]))
            if norm == 0.0:
                out[row, 0] = 1.0
            else:
                out[row] /= norm
        return out

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        """Each word is a token."""
        return [m.span() for m in _WORD.finditer(text)]

    @property
    def special_tokens(self) -> int:
        """No special tokens."""
        return 0

    def count_tokens(self, texts: Sequence[str]) -> list[int] | None:
        """Words per text."""
        return [len(_WORD.findall(t)) for t in texts]


class FlakyStore:
    """Wraps a store; while ``down`` is true, every write and search raises VectorStoreError."""

    def __init__(self, inner: VectorStore) -> None:
        self.inner = inner
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise VectorStoreError("vector store unreachable (FlakyStore is down)")

    def ensure_collection(self, spec: CollectionSpec) -> None:
        """Forward unless down."""
        self._check()
        self.inner.ensure_collection(spec)

    def upsert(self, collection: str, points: Sequence[VectorPoint]) -> None:
        """Forward unless down."""
        self._check()
        self.inner.upsert(collection, points)

    def delete_rows(self, collection: str, rows: Sequence[tuple[str, int]]) -> None:
        """Forward unless down."""
        self._check()
        self.inner.delete_rows(collection, rows)

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
        """Forward unless down."""
        self._check()
        return self.inner.search(
            collection, vector, limit, sparse=sparse, mode=mode, score_threshold=score_threshold
        )

    def points(self, collection: str, pk: str | None = None) -> list[StoreHit]:
        """Forward (reads for assertions work even while down)."""
        return self.inner.points(collection, pk)

    def existing(self, collection: str, pks: Sequence[str]) -> list[StoreHit]:
        """Forward unless down."""
        self._check()
        return self.inner.existing(collection, pks)

    def count(self, collection: str) -> int:
        """Forward (reads for assertions work even while down)."""
        return self.inner.count(collection)

    def drop_collection(self, collection: str) -> None:
        """Forward unless down."""
        self._check()
        self.inner.drop_collection(collection)

    def collection_info(self, collection: str) -> dict[str, Any] | None:
        """Forward (reads for assertions work even while down)."""
        return self.inner.collection_info(collection)

    def list_collections(self) -> list[str]:
        """Forward unless down."""
        self._check()
        return self.inner.list_collections()

    def replace_collection(self, collection: str, source: str) -> None:
        """Forward unless down."""
        self._check()
        self.inner.replace_collection(collection, source)

    def close(self) -> None:
        """Close the wrapped store."""
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
