"""What the two Qdrant adapters share: batching, row filters, paging, queries, error classes.

:class:`QdrantStore` implements the point operations of both protocols once, in terms of a few
primitives each adapter supplies (how to build a native point, query and filter, and how to
send them): Qdrant Edge and qdrant-client speak the same model with different constructors.

:func:`store_error` turns whatever an adapter's library raised into a
:class:`~semantic_orm.exc.VectorStoreError` that says whether retrying can help: a request
Qdrant rejects (HTTP 4xx, gRPC ``INVALID_ARGUMENT``, "Wrong input", a vector of the wrong
dimension) is permanent; a server error (5xx), a timeout, a refused connection or a shard held by
another process is transient. Both adapters classify alike, so a poison row is dead-lettered and
an outage is waited out whichever store runs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..exc import ConfigurationError, MissingDependencyError, VectorStoreError
from .base import (
    DEFAULT_BATCH_SIZE,
    DENSE_VECTOR,
    SPARSE_VECTOR,
    Filter,
    FilterBuilder,
    MatchAny,
    PointPayload,
    Ranking,
    SearchRequest,
    SparseVector,
    StoreHit,
    VectorPoint,
    rows_filter,
    translate,
)

__all__ = ["QdrantStore", "dense_indexed", "store_error"]

_PAGE = 1000

_PERMANENT_TEXT = re.compile(
    r"wrong input|bad input|bad request|dimension error|validation|not found|"
    r"unprocessable|invalid argument|format error",
    re.IGNORECASE,
)
_TRANSIENT_TEXT = re.compile(
    r"timed? ?out|timeout|unavailable|wouldblock|would block|temporar|connection|"
    r"service runtime error|too many requests|resource exhausted|try again",
    re.IGNORECASE,
)
_TRANSIENT_GRPC = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED", "INTERNAL"}


def is_transient_failure(exc: BaseException) -> bool:
    """Whether retrying the store call that raised ``exc`` may succeed."""
    if isinstance(exc, VectorStoreError):
        return exc.transient
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return status >= 500 or status in (408, 425, 429)
    code = getattr(exc, "code", None)
    if callable(code):  # grpc.RpcError
        try:
            name = getattr(code(), "name", "")
        except Exception:
            name = ""
        if name:
            return name in _TRANSIENT_GRPC
    if isinstance(exc, (ConnectionError, TimeoutError, OSError)):
        return True
    text = str(exc)
    if _PERMANENT_TEXT.search(text):
        return False
    if _TRANSIENT_TEXT.search(text) or type(exc).__name__ == "ResponseHandlingException":
        return True
    # a programming or input error of ours is permanent; anything else may pass
    return not isinstance(exc, (ValueError, TypeError, KeyError, AssertionError))


def store_error(what: str, where: object, exc: BaseException) -> VectorStoreError:
    """A :class:`VectorStoreError` for ``exc``, raised by ``what`` on store ``where``."""
    transient = is_transient_failure(exc)
    kind = "transient" if transient else "permanent"
    return VectorStoreError(
        f"Qdrant {what} failed on {where!r} ({kind}): {exc}", transient=transient
    )


def dense_indexed(points: int, indexed_vectors: int) -> int:
    """Points whose dense vector is in a built HNSW graph, from Qdrant's counts.

    Qdrant counts indexed vectors of every name, and a keyword (sparse) vector is indexed as soon
    as it is written, so one per point is subtracted: an undercount by the points without
    keywords (rare).
    """
    return max(0, min(points, indexed_vectors - points))


def dense_of(raw: Any) -> np.ndarray[Any, np.dtype[np.float32]] | None:
    """The dense vector of a record's vectors (a dict of named vectors, or a plain list)."""
    if raw is None:
        return None
    value = raw.get(DENSE_VECTOR) if isinstance(raw, dict) else raw
    return None if value is None else np.asarray(value, dtype=np.float32)


def sparse_of(raw: Any) -> SparseVector | None:
    """The keyword vector of a record's vectors (a dict of named vectors), if it has one."""
    value = raw.get(SPARSE_VECTOR) if isinstance(raw, dict) else None
    if value is None:
        return None
    return SparseVector(tuple(int(i) for i in value.indices), tuple(map(float, value.values)))


class QdrantStore:
    """Point operations shared by :class:`~semantic_orm.stores.EdgeStore` and
    :class:`~semantic_orm.stores.QdrantClientStore`.

    Subclasses provide :attr:`builder` (their :class:`~semantic_orm.stores.base.FilterBuilder`),
    constructors for their native objects (``_sparse``, ``_point``, ``_request``) and the calls
    that send them (``_write``, ``_delete_where``, ``_scroll_page``, ``_query_batch``, ``_has``,
    ``_count``).
    """

    builder: FilterBuilder
    batch_size: int = DEFAULT_BATCH_SIZE

    # -- primitives ------------------------------------------------------------------------

    def _sparse(self, vector: SparseVector) -> Any:
        raise NotImplementedError

    def _point(self, pid: str, vectors: dict[str, Any], payload: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _request(
        self, ranking: Ranking, vector: Any, flt: Any, payload: tuple[str, ...] | None
    ) -> Any:
        """The native query of one ranking (``payload``: the keys to return, as in
        :attr:`SearchRequest.payload`)."""
        raise NotImplementedError

    def _query_batch(self, collection: str, requests: list[Any]) -> list[list[Any]]:
        raise NotImplementedError

    def _write(self, collection: str, points: list[Any]) -> None:
        raise NotImplementedError

    def _delete_where(self, collection: str, flt: Any) -> None:
        raise NotImplementedError

    def _scroll_page(
        self, collection: str, flt: Any, offset: Any, limit: int, vectors: bool
    ) -> tuple[list[Any], Any]:
        raise NotImplementedError

    def _has(self, collection: str) -> bool:
        raise NotImplementedError

    def _count(self, collection: str) -> int:
        raise NotImplementedError

    # -- shared operations -----------------------------------------------------------------

    def _dense(self, vector: npt.NDArray[np.float32]) -> Any:
        """A dense vector as the client takes it in a point."""
        return vector.tolist()

    def _native_point(self, point: VectorPoint) -> Any:
        vectors: dict[str, Any] = {DENSE_VECTOR: self._dense(point.vector)}
        if point.sparse:
            vectors[SPARSE_VECTOR] = self._sparse(point.sparse)
        return self._point(point.id, vectors, dict(point.payload))

    def _native_vector(self, ranking: Ranking) -> Any:
        if isinstance(ranking.vector, SparseVector):
            return self._sparse(ranking.vector)
        return ranking.vector.tolist()

    def upsert(self, collection: str, points: Sequence[VectorPoint]) -> None:
        """Insert or overwrite ``points`` in batches of ``batch_size``."""
        for start in range(0, len(points), self.batch_size):
            batch = points[start : start + self.batch_size]
            self._write(collection, [self._native_point(p) for p in batch])

    def delete_rows(self, collection: str, rows: Sequence[tuple[str, int]]) -> None:
        """Delete each row's points with ``chunk_index >= from_index``, in batched filters."""
        if not rows or not self._has(collection):
            return
        for start in range(0, len(rows), self.batch_size):
            flt = rows_filter(rows[start : start + self.batch_size])
            self._delete_where(collection, translate(flt, self.builder))

    def _pages(self, collection: str, flt: Filter | None, vectors: bool) -> Iterator[StoreHit]:
        if not self._has(collection):
            return
        native = None if flt is None else translate(flt, self.builder)
        offset: Any = None
        while True:
            records, offset = self._scroll_page(collection, native, offset, _PAGE, vectors)
            for r in records:
                yield StoreHit(
                    str(r.id), 0.0, r.payload or {}, dense_of(r.vector) if vectors else None
                )
            if offset is None:
                return

    def existing(self, collection: str, pks: Sequence[str]) -> list[StoreHit]:
        """The points of rows ``pks``, with payloads and vectors."""
        out: list[StoreHit] = []
        for start in range(0, len(pks), _PAGE):
            flt = Filter(must=(MatchAny(PointPayload.PK_KEY, tuple(pks[start : start + _PAGE])),))
            out.extend(self._pages(collection, flt, vectors=True))
        return out

    def points(self, collection: str, pk: str | None = None) -> list[StoreHit]:
        """Every point of the collection (or of one row), with payloads."""
        flt = None if pk is None else Filter(must=(MatchAny(PointPayload.PK_KEY, (pk,)),))
        return list(self._pages(collection, flt, vectors=False))

    def scroll(
        self,
        collection: str,
        *,
        offset: Any = None,
        limit: int = _PAGE,
        vectors: bool = False,
        where: Filter | None = None,
    ) -> tuple[list[StoreHit], Any]:
        """One page of points and the offset of the next one (``None`` after the last page)."""
        if not self._has(collection):
            return [], None
        native = None if where is None else translate(where, self.builder)
        records, after = self._scroll_page(collection, native, offset, limit, vectors)
        hits = [
            StoreHit(str(r.id), 0.0, r.payload or {}, dense_of(r.vector) if vectors else None)
            for r in records
        ]
        return hits, after

    def query(self, collection: str, request: SearchRequest) -> list[list[StoreHit]]:
        """Run each ranking of ``request`` under its filter; one list per ranking, best first."""
        for ranking in request.rankings:
            if ranking.limit <= 0 or ranking.offset < 0:
                raise ConfigurationError(
                    f"a ranking needs limit > 0 and offset >= 0, got {ranking.limit}/"
                    f"{ranking.offset}"
                )
        if not request.rankings or not self._has(collection):
            return [[] for _ in request.rankings]
        native = None if request.filter is None else translate(request.filter, self.builder)
        requests = [
            self._request(r, self._native_vector(r), native, request.payload)
            for r in request.rankings
        ]
        found = self._query_batch(collection, requests)
        out: list[list[StoreHit]] = []
        for ranking, hits in zip(request.rankings, found, strict=True):
            if not ranking.with_vector:
                out.append([StoreHit(str(p.id), float(p.score), p.payload or {}) for p in hits])
                continue
            out.append(
                [
                    StoreHit(
                        str(p.id),
                        float(p.score),
                        p.payload or {},
                        dense_of(p.vector) if ranking.using == DENSE_VECTOR else None,
                        sparse_of(p.vector) if ranking.using == SPARSE_VECTOR else None,
                    )
                    for p in hits
                ]
            )
        return out

    def count(self, collection: str) -> int:
        """Points in the collection (0 if it does not exist)."""
        return self._count(collection) if self._has(collection) else 0

    def _guard(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Call ``fn``; wrap what it raises in a classified :class:`VectorStoreError`."""
        try:
            return fn(*args, **kwargs)
        except (ConfigurationError, MissingDependencyError, VectorStoreError):
            raise
        except Exception as exc:
            raise store_error(what, self, exc) from exc
