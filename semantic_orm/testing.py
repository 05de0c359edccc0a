"""Test doubles shipped with the library, for testing code that uses semantic_orm.

* :class:`HashEmbedder` is a deterministic, dependency-free embedder: each text becomes a
  normalized bag of hashed words. Texts sharing words get similar vectors, so plumbing tests can
  assert rankings without loading a model. It is not a language model: use a real one to test
  search quality.
* :class:`OverlapReranker` is a deterministic reranker: a passage scores the share of the
  query's distinct words it contains, so plumbing tests can predict a reranked order.
* :class:`MemoryStore` is a complete vector store in a few dictionaries (exact cosine and BM25
  with Qdrant's IDF, the same filters and paging), for plumbing tests that need no Qdrant.
* :class:`FlakyStore` wraps any store and fails on demand (``down = True``), at random
  (``failure_rate``), or permanently (``reject = True``), to test what happens when the vector
  store misbehaves.
"""

from __future__ import annotations

import datetime as dt
import math
import random
import re
import threading
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from .exc import VectorStoreError
from .stores.base import (
    DENSE_VECTOR,
    CollectionSpec,
    Condition,
    DatetimeRange,
    Filter,
    IsNull,
    Match,
    MatchAny,
    MatchExcept,
    PointPayload,
    Range,
    Ranking,
    SearchRequest,
    SparseVector,
    Store,
    StoreHit,
    VectorPoint,
    check_collection_matches,
    rows_filter,
)

__all__ = ["FlakyStore", "HashEmbedder", "MemoryStore", "OverlapReranker"]

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

    def special_token_count(self) -> int:
        """No special tokens."""
        return 0

    def count_tokens(self, texts: Sequence[str]) -> list[int] | None:
        """Words per text."""
        return [len(_WORD.findall(t)) for t in texts]


class OverlapReranker:
    """Deterministic reranker (no model): the share of the query's distinct words a passage has.

    Words are lower-cased ``\\w+`` runs. ``calls`` counts :meth:`score` calls and ``scored``
    holds every passage scored, in order, so tests can check what the search asked for.

    Args:
        name: The reranker's name.
    """

    def __init__(self, *, name: str = "overlap-reranker") -> None:
        self._name = name
        self.calls = 0
        self.scored: list[str] = []

    @property
    def name(self) -> str:
        """The reranker's name."""
        return self._name

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """For each passage, the fraction of the query's distinct words found in it."""
        self.calls += 1
        self.scored.extend(passages)
        terms = set(_WORD.findall(query.lower()))
        if not terms:
            return [0.0] * len(passages)
        return [len(terms & set(_WORD.findall(p.lower()))) / len(terms) for p in passages]


# -- an in-memory store -------------------------------------------------------------------------


@dataclass
class _Point:
    dense: npt.NDArray[np.float32]
    sparse: dict[int, float]
    payload: dict[str, Any]


@dataclass
class _Collection:
    dimension: int
    meta: dict[str, Any]
    points: dict[str, _Point] = field(default_factory=dict)


def _values(payload: Any, key: str) -> list[Any] | None:
    """The values ``key`` (a dotted path) resolves to, arrays flattened; ``None`` if missing."""
    current: Any = payload
    for part in key.split("."):
        if not isinstance(current, dict) or part not in current:
            return None
        current = current[part]
    if isinstance(current, list):
        return current
    return [current]


def _same(a: Any, b: Any) -> bool:
    """Equal as Qdrant compares payload values: a boolean never equals a number."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


def _as_time(value: Any) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        found = value
    elif isinstance(value, str):
        try:
            found = dt.datetime.fromisoformat(value)
        except ValueError:
            return None
    else:
        return None
    return found if found.tzinfo else found.replace(tzinfo=dt.UTC)


def _in_range(cond: Range | DatetimeRange, value: Any) -> bool:
    if isinstance(cond, DatetimeRange):
        found = _as_time(value)
        bounds = {k: _as_time(getattr(cond, k)) for k in ("gt", "gte", "lt", "lte")}
        if found is None:
            return False
        value = found
    else:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        bounds = {k: getattr(cond, k) for k in ("gt", "gte", "lt", "lte")}
    return (
        (bounds["gt"] is None or value > bounds["gt"])
        and (bounds["gte"] is None or value >= bounds["gte"])
        and (bounds["lt"] is None or value < bounds["lt"])
        and (bounds["lte"] is None or value <= bounds["lte"])
    )


def matches(payload: dict[str, Any], cond: Condition) -> bool:
    """Whether a payload satisfies a filter condition, with Qdrant's semantics."""
    if isinstance(cond, Filter):
        return (
            all(matches(payload, c) for c in cond.must)
            and (not cond.should or any(matches(payload, c) for c in cond.should))
            and not any(matches(payload, c) for c in cond.must_not)
        )
    found = _values(payload, cond.key)
    if isinstance(cond, IsNull):
        return found is None or not found or any(v is None for v in found)
    if found is None:
        return False
    if isinstance(cond, Match):
        return any(_same(v, cond.value) for v in found)
    if isinstance(cond, MatchAny):
        return any(_same(v, w) for v in found for w in cond.values)
    if isinstance(cond, MatchExcept):
        return any(v is not None and not any(_same(v, w) for w in cond.values) for v in found)
    return any(_in_range(cond, v) for v in found)


class MemoryStore:
    """A vector store held in memory: exact search, Qdrant's filter and IDF semantics.

    Implements :class:`~semantic_orm.stores.base.Store`. Keyword scores use the same IDF as
    Qdrant's modifier, ``ln(1 + (N - n + 0.5) / (n + 0.5))`` over the collection's points.
    """

    def __init__(self) -> None:
        self._collections: dict[str, _Collection] = {}
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"MemoryStore({len(self._collections)} collections)"

    # -- hot path ----------------------------------------------------------------------------

    def ensure_collection(self, spec: CollectionSpec) -> None:
        """Create ``spec.name`` if missing; refuse one built by another model or dimension."""
        with self._lock:
            found = self._collections.get(spec.name)
            if found is None:
                self._collections[spec.name] = _Collection(spec.dimension, spec.record())
                return
        check_collection_matches(spec, found.dimension, found.meta)

    def _get(self, collection: str) -> _Collection:
        found = self._collections.get(collection)
        if found is None:
            raise VectorStoreError(f"collection {collection!r} does not exist", transient=False)
        return found

    def upsert(self, collection: str, points: Sequence[VectorPoint]) -> None:
        """Insert or overwrite ``points``."""
        with self._lock:
            target = self._get(collection)
            for p in points:
                vector = np.asarray(p.vector, dtype=np.float32)
                if vector.shape != (target.dimension,):
                    raise VectorStoreError(
                        f"Wrong input: vector dimension error: expected {target.dimension}, "
                        f"got {vector.shape[0]}",
                        transient=False,
                    )
                sparse = (
                    dict(zip(p.sparse.indices, p.sparse.values, strict=True)) if p.sparse else {}
                )
                target.points[p.id] = _Point(vector.copy(), sparse, dict(p.payload))

    def delete_rows(self, collection: str, rows: Sequence[tuple[str, int]]) -> None:
        """Delete each row's points with ``chunk_index >= from_index``."""
        with self._lock:
            target = self._collections.get(collection)
            if target is None or not rows:
                return
            flt = rows_filter(rows)
            for pid in [i for i, p in target.points.items() if matches(p.payload, flt)]:
                del target.points[pid]

    def existing(self, collection: str, pks: Sequence[str]) -> list[StoreHit]:
        """The points of rows ``pks``, with payloads and vectors."""
        wanted = set(pks)
        with self._lock:
            target = self._collections.get(collection)
            if target is None:
                return []
            return [
                StoreHit(i, 0.0, dict(p.payload), p.dense.copy())
                for i, p in sorted(target.points.items())
                if p.payload.get(PointPayload.PK_KEY) in wanted
            ]

    def query(self, collection: str, request: SearchRequest) -> list[list[StoreHit]]:
        """Each ranking, exact, best first (ties by point id)."""
        with self._lock:
            target = self._collections.get(collection)
            if target is None:
                return [[] for _ in request.rankings]
            points = [
                (i, p)
                for i, p in target.points.items()
                if request.filter is None or matches(p.payload, request.filter)
            ]
            out: list[list[StoreHit]] = []
            for ranking in request.rankings:
                if ranking.using == DENSE_VECTOR:
                    assert not isinstance(ranking.vector, SparseVector)
                    query = np.asarray(ranking.vector, dtype=np.float32)
                    scored = [(float(p.dense @ query), i, p) for i, p in points]
                else:
                    assert isinstance(ranking.vector, SparseVector)
                    scored = self._bm25(target, points, ranking.vector)
                if ranking.threshold is not None:
                    scored = [s for s in scored if s[0] >= ranking.threshold]
                scored.sort(key=lambda s: (-s[0], s[1]))
                page = scored[ranking.offset : ranking.offset + ranking.limit]
                out.append(
                    [self._hit(ranking, score, i, p, request.payload) for score, i, p in page]
                )
            return out

    @staticmethod
    def _hit(
        ranking: Ranking, score: float, pid: str, point: _Point, keys: tuple[str, ...] | None
    ) -> StoreHit:
        payload = (
            dict(point.payload)
            if keys is None
            else {k: point.payload[k] for k in keys if k in point.payload}
        )
        if not ranking.with_vector:
            return StoreHit(pid, score, payload)
        if ranking.using == DENSE_VECTOR:
            return StoreHit(pid, score, payload, point.dense.copy())
        terms = sorted(point.sparse)
        sparse = SparseVector(tuple(terms), tuple(point.sparse[t] for t in terms))
        return StoreHit(pid, score, payload, sparse=sparse)

    @staticmethod
    def _bm25(
        target: _Collection, points: list[tuple[str, _Point]], query: SparseVector
    ) -> list[tuple[float, str, _Point]]:
        total = sum(1 for p in target.points.values() if p.sparse)
        idf = {}
        for term in query.indices:
            n = sum(1 for p in target.points.values() if term in p.sparse)
            idf[term] = math.log(1 + (total - n + 0.5) / (n + 0.5))
        out = []
        for i, p in points:
            score = sum(
                p.sparse[t] * idf[t] * w
                for t, w in zip(query.indices, query.values, strict=True)
                if t in p.sparse
            )
            if score > 0:
                out.append((float(score), i, p))
        return out

    # -- administration ----------------------------------------------------------------------

    def collection_info(self, collection: str) -> dict[str, Any] | None:
        """The metadata recorded with ``collection``, or ``None``."""
        found = self._collections.get(collection)
        return None if found is None else dict(found.meta)

    def list_collections(self) -> list[str]:
        """The collections' names."""
        return sorted(self._collections)

    def update_metadata(self, collection: str, changes: dict[str, Any]) -> None:
        """Record ``changes`` in the collection's metadata."""
        self._get(collection).meta.update(changes)

    def index_state(self, collection: str) -> dict[str, int]:
        """Exact search over one segment: every point counts as indexed."""
        n = len(self._get(collection).points)
        return {"points": n, "indexed": n, "segments": 1}

    def optimize(self, collection: str) -> None:
        """Nothing to build: search is exact."""
        self._get(collection)

    def count(self, collection: str) -> int:
        """Points in ``collection`` (0 if missing)."""
        found = self._collections.get(collection)
        return 0 if found is None else len(found.points)

    def scroll(
        self,
        collection: str,
        *,
        offset: Any = None,
        limit: int = 1000,
        vectors: bool = False,
        where: Filter | None = None,
    ) -> tuple[list[StoreHit], Any]:
        """One page of points in id order and the next page's first id."""
        with self._lock:
            found = self._collections.get(collection)
            if found is None:
                return [], None
            ids = sorted(
                i
                for i, p in found.points.items()
                if (offset is None or i >= offset) and (where is None or matches(p.payload, where))
            )
            page, rest = ids[:limit], ids[limit:]
            hits = [
                StoreHit(
                    i,
                    0.0,
                    dict(found.points[i].payload),
                    found.points[i].dense.copy() if vectors else None,
                )
                for i in page
            ]
            return hits, (rest[0] if rest else None)

    def points(self, collection: str, pk: str | None = None) -> list[StoreHit]:
        """Every point (or one row's), with payloads."""
        hits: list[StoreHit] = []
        offset: Any = None
        while True:
            page, offset = self.scroll(collection, offset=offset)
            hits.extend(h for h in page if pk is None or h.payload.get(PointPayload.PK_KEY) == pk)
            if offset is None:
                return hits

    def drop_collection(self, collection: str) -> None:
        """Forget ``collection``."""
        with self._lock:
            self._collections.pop(collection, None)

    def replace_collection(self, collection: str, source: str) -> None:
        """Serve ``source``'s points under ``collection``, atomically."""
        with self._lock:
            self._collections[collection] = self._get(source)
            del self._collections[source]

    def close(self) -> None:
        """Nothing to release."""


# -- a store that fails on demand -----------------------------------------------------------------


class FlakyStore:
    """Wraps a store; fails while ``down``, at random with ``failure_rate``, or when rejecting.

    * ``down = True``: every write and search raises a transient ``VectorStoreError`` (the store
      is unreachable).
    * ``failure_rate = p``: each write or search fails transiently with probability ``p``
      (drawn from ``seed``).
    * ``reject = True``: every write raises a *permanent* ``VectorStoreError`` (the store
      refuses the request), as a server answering 400 would.

    Reads used by assertions (``points``, ``count``, ``collection_info``, ``scroll``) always
    pass through.
    """

    def __init__(self, inner: Store, *, failure_rate: float = 0.0, seed: int = 0) -> None:
        self.inner = inner
        self.down = False
        self.reject = False
        self.failure_rate = failure_rate
        self._random = random.Random(seed)
        self.failures = 0

    def __repr__(self) -> str:
        return f"FlakyStore({self.inner!r})"

    def _check(self, write: bool = False) -> None:
        if self.down or (self.failure_rate and self._random.random() < self.failure_rate):
            self.failures += 1
            raise VectorStoreError("vector store unreachable (FlakyStore is down)")
        if write and self.reject:
            self.failures += 1
            raise VectorStoreError("Bad request: rejected (FlakyStore rejects)", transient=False)

    def ensure_collection(self, spec: CollectionSpec) -> None:
        """Forward unless failing."""
        self._check()
        self.inner.ensure_collection(spec)

    def upsert(self, collection: str, points: Sequence[VectorPoint]) -> None:
        """Forward unless failing."""
        self._check(write=True)
        self.inner.upsert(collection, points)

    def delete_rows(self, collection: str, rows: Sequence[tuple[str, int]]) -> None:
        """Forward unless failing."""
        self._check(write=True)
        self.inner.delete_rows(collection, rows)

    def existing(self, collection: str, pks: Sequence[str]) -> list[StoreHit]:
        """Forward unless failing."""
        self._check()
        return self.inner.existing(collection, pks)

    def query(self, collection: str, request: SearchRequest) -> list[list[StoreHit]]:
        """Forward unless failing."""
        self._check()
        return self.inner.query(collection, request)

    def collection_info(self, collection: str) -> dict[str, Any] | None:
        """Forward (reads for assertions work even while down)."""
        return self.inner.collection_info(collection)

    def list_collections(self) -> list[str]:
        """Forward unless failing."""
        self._check()
        return self.inner.list_collections()

    def count(self, collection: str) -> int:
        """Forward (reads for assertions work even while down)."""
        return self.inner.count(collection)

    def scroll(
        self,
        collection: str,
        *,
        offset: Any = None,
        limit: int = 1000,
        vectors: bool = False,
        where: Filter | None = None,
    ) -> tuple[list[StoreHit], Any]:
        """Forward (reads for assertions work even while down)."""
        return self.inner.scroll(
            collection, offset=offset, limit=limit, vectors=vectors, where=where
        )

    def points(self, collection: str, pk: str | None = None) -> list[StoreHit]:
        """Forward (reads for assertions work even while down)."""
        return self.inner.points(collection, pk)

    def drop_collection(self, collection: str) -> None:
        """Forward unless failing."""
        self._check()
        self.inner.drop_collection(collection)

    def replace_collection(self, collection: str, source: str) -> None:
        """Forward unless failing."""
        self._check()
        self.inner.replace_collection(collection, source)

    def close(self) -> None:
        """Close the wrapped store."""
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
