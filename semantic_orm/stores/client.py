"""Qdrant server or cluster through ``qdrant-client``; also its ``":memory:"`` local mode.

This is how an application scales out: point the store at a Qdrant URL and every process shares
one index::

    store = QdrantClientStore(url="http://qdrant:6333", api_key=...)
    store = QdrantClientStore(location=":memory:")          # local mode, for tests
    store = QdrantClientStore(client=my_configured_client)  # any QdrantClient

Each collection has a named cosine vector ``"dense"`` and a named sparse vector ``"bm25"`` with
Qdrant's IDF modifier; hybrid queries are prefetch + RRF fusion queries. What produced the
vectors is recorded in the collection's metadata (Qdrant 1.16+); for an older server, a
collection without metadata is checked on dimension and vector layout alone. A keyword payload
index on ``pk`` keeps per-row deletes fast.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..exc import ConfigurationError, MissingDependencyError, VectorStoreError
from .base import (
    COLLECTION_LAYOUT,
    DEFAULT_BATCH_SIZE,
    DENSE_VECTOR,
    RRF_K,
    SPARSE_VECTOR,
    CollectionSpec,
    SearchMode,
    SparseVector,
    StoreHit,
    VectorPoint,
    check_collection_matches,
)

__all__ = ["INITIAL_SUFFIX", "QdrantClientStore"]

INITIAL_SUFFIX = "__initial"
"""A new collection ``name`` is created as ``name + INITIAL_SUFFIX`` behind the alias ``name``."""


def _qc() -> Any:
    try:
        import qdrant_client
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(
            "QdrantClientStore needs qdrant-client: pip install 'semantic-orm[client]'"
        ) from exc
    return qdrant_client


class QdrantClientStore:
    """Vector store on a Qdrant server (by URL) or in qdrant-client's local mode.

    Args:
        url: Server URL, e.g. ``"http://localhost:6333"``.
        location: ``":memory:"`` for an in-process store (or a URL).
        path: Directory for qdrant-client's on-disk local mode.
        client: An already configured ``QdrantClient``; the other connection arguments are
            then not allowed.
        batch_size: Points per upsert request.
        **client_kwargs: Passed to ``QdrantClient`` (``api_key``, ``timeout``, ``prefer_grpc``...).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        location: str | None = None,
        path: str | None = None,
        client: Any = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        **client_kwargs: Any,
    ) -> None:
        if batch_size <= 0:
            raise ConfigurationError(f"QdrantClientStore batch_size must be > 0, got {batch_size}")
        given = [
            name
            for name, v in (
                ("url", url),
                ("location", location),
                ("path", path),
                ("client", client),
            )
            if v is not None
        ]
        if len(given) != 1:
            raise ConfigurationError(
                "QdrantClientStore takes exactly one of url=, location=, path= or client=, "
                f"got {given or 'none'}"
            )
        if client is None:
            client = _qc().QdrantClient(url=url, location=location, path=path, **client_kwargs)
        elif client_kwargs:
            raise ConfigurationError(
                "QdrantClientStore(client=...) takes no client options, "
                f"got {sorted(client_kwargs)}"
            )
        self.client = client
        self.batch_size = batch_size
        self._known: set[str] = set()
        self._where = url or location or path or "client"

    def __repr__(self) -> str:
        return f"QdrantClientStore({self._where!r})"

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ConfigurationError, MissingDependencyError):
            raise
        except Exception as exc:
            raise VectorStoreError(f"Qdrant {what} failed on {self!r}: {exc}") from exc

    # -- collections --------------------------------------------------------------------------

    def ensure_collection(self, spec: CollectionSpec) -> None:
        """Create ``spec.name`` if missing; refuse one built by another model or dimension."""
        if spec.name in self._known:
            return
        models = _qc().models
        if not self._exists(spec.name):
            # a collection behind an alias of the searched name, so that a rebuild can later
            # switch the alias atomically (replace_collection)
            physical = spec.name + INITIAL_SUFFIX
            if self._call("collection_exists", self.client.collection_exists, physical):
                # another process created it and is about to add the alias (or stopped short of
                # it): keep it, points and all, and add the alias if still missing
                self._alias(spec.name, physical)
                self.ensure_collection(spec)  # and check it like any existing collection
                return
            self._call(
                "create_collection",
                self.client.create_collection,
                physical,
                vectors_config={
                    DENSE_VECTOR: models.VectorParams(
                        size=spec.dimension, distance=models.Distance.COSINE
                    )
                },
                sparse_vectors_config={
                    SPARSE_VECTOR: models.SparseVectorParams(modifier=models.Modifier.IDF)
                },
                metadata=spec.record(),
            )
            with warnings.catch_warnings():
                # local mode warns that payload indexes are no-ops there; servers use them
                warnings.simplefilter("ignore")
                self._call(
                    "create_payload_index",
                    self.client.create_payload_index,
                    physical,
                    field_name="pk",
                    field_schema=models.PayloadSchemaType.KEYWORD,
                )
            self._alias(spec.name, physical)
        else:
            info = self._call("get_collection", self.client.get_collection, spec.name)
            vectors = info.config.params.vectors
            sparse = info.config.params.sparse_vectors or {}
            layout = None
            if isinstance(vectors, dict):
                vectors = vectors.get(DENSE_VECTOR)
                if vectors is not None and SPARSE_VECTOR in sparse:
                    layout = COLLECTION_LAYOUT
            size = getattr(vectors, "size", None)
            check_collection_matches(
                spec, size, getattr(info.config, "metadata", None), found_layout=layout
            )
        self._known.add(spec.name)

    def collection_info(self, collection: str) -> dict[str, Any] | None:
        """The metadata recorded with ``collection``, or ``None`` if it does not exist."""
        if not self._exists(collection):
            return None
        info = self._call("get_collection", self.client.get_collection, collection)
        return dict(getattr(info.config, "metadata", None) or {})

    def drop_collection(self, collection: str) -> None:
        """Delete the collection if it exists (an alias: the alias and its collection)."""
        self._known.discard(collection)
        target = self._aliases().get(collection)
        if target is not None:
            models = _qc().models
            self._call(
                "update_collection_aliases",
                self.client.update_collection_aliases,
                change_aliases_operations=[
                    models.DeleteAliasOperation(
                        delete_alias=models.DeleteAlias(alias_name=collection)
                    )
                ],
            )
            collection = target
        if self._call("collection_exists", self.client.collection_exists, collection):
            self._call("delete_collection", self.client.delete_collection, collection)

    def _alias(self, alias: str, collection: str) -> None:
        """Create ``alias`` for ``collection`` unless some process already did."""
        models = _qc().models
        if self._aliases().get(alias) == collection:
            return
        try:
            self.client.update_collection_aliases(
                change_aliases_operations=[
                    models.CreateAliasOperation(
                        create_alias=models.CreateAlias(
                            collection_name=collection, alias_name=alias
                        )
                    )
                ]
            )
        except Exception as exc:
            if self._aliases().get(alias) != collection:  # not a lost race: a real failure
                raise VectorStoreError(
                    f"Qdrant update_collection_aliases failed on {self!r}: {exc}"
                ) from exc

    def _aliases(self) -> dict[str, str]:
        response = self._call("get_aliases", self.client.get_aliases)
        return {a.alias_name: a.collection_name for a in response.aliases}

    def list_collections(self) -> list[str]:
        """Aliases, and the collections no alias points to."""
        aliases = self._aliases()
        response = self._call("get_collections", self.client.get_collections)
        behind = set(aliases.values())
        names = {c.name for c in response.collections if c.name not in behind}
        return sorted(names | set(aliases))

    def replace_collection(self, collection: str, source: str) -> None:
        """Point the alias ``collection`` at ``source`` in one request, then drop the old one.

        Qdrant applies a batch of alias changes atomically, so searches see the old collection
        or the new one, never neither. A ``collection`` that is a real collection rather than an
        alias (made by hand, or by another tool) is deleted just before the alias is created:
        searches in that instant find it missing.
        """
        models = _qc().models
        if not self._exists(source):
            raise VectorStoreError(
                f"cannot switch {collection!r} to {source!r}: {source!r} does not exist"
            )
        aliases = self._aliases()
        old = aliases.get(collection)
        changes: list[Any] = []
        self._known.discard(source)
        target = aliases.get(source)
        if target is not None:  # the rebuild is itself an alias: point at what it names
            changes.append(
                models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=source))
            )
            source = target
        if old is not None:
            changes.append(
                models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=collection))
            )
        elif self._call("collection_exists", self.client.collection_exists, collection):
            self._call("delete_collection", self.client.delete_collection, collection)
        changes.append(
            models.CreateAliasOperation(
                create_alias=models.CreateAlias(collection_name=source, alias_name=collection)
            )
        )
        self._call(
            "update_collection_aliases",
            self.client.update_collection_aliases,
            change_aliases_operations=changes,
        )
        if old is not None and old != source:
            self._call("delete_collection", self.client.delete_collection, old)

    # -- points -------------------------------------------------------------------------------

    def upsert(self, collection: str, points: Sequence[VectorPoint]) -> None:
        """Insert or overwrite ``points`` in batches of ``batch_size``."""
        models = _qc().models
        for start in range(0, len(points), self.batch_size):
            batch = []
            for p in points[start : start + self.batch_size]:
                vectors: dict[str, Any] = {DENSE_VECTOR: p.vector.tolist()}
                if p.sparse:
                    vectors[SPARSE_VECTOR] = models.SparseVector(
                        indices=list(p.sparse.indices), values=list(p.sparse.values)
                    )
                batch.append(models.PointStruct(id=p.id, vector=vectors, payload=dict(p.payload)))
            self._call("upsert", self.client.upsert, collection, points=batch, wait=True)

    def _row_filter(self, pk: str, from_index: int = 0) -> Any:
        models = _qc().models
        must: list[Any] = [models.FieldCondition(key="pk", match=models.MatchValue(value=pk))]
        if from_index > 0:
            must.append(
                models.FieldCondition(key="chunk_index", range=models.Range(gte=from_index))
            )
        return models.Filter(must=must)

    def delete_rows(self, collection: str, rows: Sequence[tuple[str, int]]) -> None:
        """Delete each row's points with ``chunk_index >= from_index``, in batched filters."""
        models = _qc().models
        if not rows or not self._exists(collection):
            return
        for start in range(0, len(rows), self.batch_size):
            batch = rows[start : start + self.batch_size]
            selector = models.FilterSelector(
                filter=models.Filter(should=[self._row_filter(pk, n) for pk, n in batch])
            )
            self._call(
                "delete", self.client.delete, collection, points_selector=selector, wait=True
            )

    def _exists(self, collection: str) -> bool:
        if collection in self._known:
            return True
        if self._call("collection_exists", self.client.collection_exists, collection):
            return True
        return collection in self._aliases()

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
        """The ``limit`` best points for ``mode``, best first (empty if the collection is new).

        See :meth:`~semantic_orm.stores.base.VectorStore.search` for the modes.
        """
        if limit <= 0 or not self._exists(collection):
            return []
        models = _qc().models
        dense = None if vector is None else vector.tolist()
        keyword = None
        if sparse:
            keyword = models.SparseVector(indices=list(sparse.indices), values=list(sparse.values))
        query: Any
        prefetch: Any = None
        using: str | None = None
        threshold = score_threshold
        if mode == "keyword" or (mode == "hybrid" and dense is None):
            if keyword is None:
                return []
            query, using = keyword, SPARSE_VECTOR
        elif mode == "hybrid" and keyword is not None:
            prefetch = [
                models.Prefetch(
                    query=dense, using=DENSE_VECTOR, limit=limit, score_threshold=score_threshold
                ),
                models.Prefetch(query=keyword, using=SPARSE_VECTOR, limit=limit),
            ]
            query, threshold = models.RrfQuery(rrf=models.Rrf(k=RRF_K)), None
        else:
            if dense is None:
                raise ConfigurationError(f"{mode} search needs a dense query vector")
            query, using = dense, DENSE_VECTOR
        response = self._call(
            "query_points",
            self.client.query_points,
            collection,
            query=query,
            using=using,
            prefetch=prefetch,
            limit=limit,
            with_payload=True,
            score_threshold=threshold,
        )
        return [StoreHit(str(p.id), float(p.score), p.payload or {}) for p in response.points]

    def _scroll(self, collection: str, flt: Any, vectors: bool) -> list[StoreHit]:
        if not self._exists(collection):
            return []
        out: list[StoreHit] = []
        offset: Any = None
        while True:
            records, offset = self._call(
                "scroll",
                self.client.scroll,
                collection,
                scroll_filter=flt,
                limit=1000,
                offset=offset,
                with_payload=True,
                with_vectors=vectors,
            )
            for r in records:
                vector = None
                if vectors and r.vector is not None:
                    raw = r.vector.get(DENSE_VECTOR) if isinstance(r.vector, dict) else r.vector
                    vector = np.asarray(raw, dtype=np.float32)
                out.append(StoreHit(str(r.id), 0.0, r.payload or {}, vector))
            if offset is None:
                return out

    def points(self, collection: str, pk: str | None = None) -> list[StoreHit]:
        """Every point of the collection (or of one row), with payloads."""
        return self._scroll(collection, None if pk is None else self._row_filter(pk), False)

    def existing(self, collection: str, pks: Sequence[str]) -> list[StoreHit]:
        """The points of rows ``pks``, with payloads and vectors."""
        models = _qc().models
        out: list[StoreHit] = []
        for start in range(0, len(pks), 1000):
            batch = list(pks[start : start + 1000])
            flt = models.Filter(
                must=[models.FieldCondition(key="pk", match=models.MatchAny(any=batch))]
            )
            out.extend(self._scroll(collection, flt, vectors=True))
        return out

    def count(self, collection: str) -> int:
        """Points in the collection (0 if it does not exist)."""
        if not self._exists(collection):
            return 0
        result = self._call("count", self.client.count, collection, exact=True)
        return int(result.count)

    def close(self) -> None:
        """Close the client's connections."""
        self._call("close", self.client.close)
