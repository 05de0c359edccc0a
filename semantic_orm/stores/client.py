"""Qdrant server or cluster through ``qdrant-client``; also its ``":memory:"`` local mode.

This is how an application scales out: point the store at a Qdrant URL and every process shares
one index::

    store = QdrantClientStore(url="http://qdrant:6333", api_key=...)
    store = QdrantClientStore(location=":memory:")          # local mode, for tests
    store = QdrantClientStore(client=my_configured_client)  # any QdrantClient

Each collection has a named cosine vector ``"dense"`` and a named sparse vector ``"bm25"`` with
Qdrant's IDF modifier. What produced the vectors is recorded in the collection's metadata
(Qdrant 1.16+); for an older server, a collection without metadata is checked on dimension and
vector layout alone. Payload indexes on the row key, the chunk index and the declared filter
columns keep per-row deletes and filtered searches fast; a tenant column is indexed as a tenant.
A search's rankings go to the server in one batch request.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
import weakref
from typing import Any

from ..exc import ConfigurationError, VectorStoreError, import_optional
from ..forking import RenewedLock, in_forked_child
from .base import (
    COLLECTION_LAYOUT,
    DEFAULT_BATCH_SIZE,
    DENSE_VECTOR,
    SPARSE_VECTOR,
    CollectionSpec,
    PayloadIndex,
    Ranking,
    SparseVector,
    check_collection_matches,
)
from .qdrant import QdrantStore, dense_indexed

__all__ = ["INITIAL_SUFFIX", "QdrantClientStore"]

INITIAL_SUFFIX = "__initial"
"""A new collection ``name`` is created as ``name + INITIAL_SUFFIX`` behind the alias ``name``."""


def _qc() -> Any:
    return import_optional(
        "qdrant_client", "QdrantClientStore needs qdrant-client: pip install 'semantic-orm[client]'"
    )


class _ClientFilters:
    """qdrant-client's filter models (see :class:`~semantic_orm.stores.base.FilterBuilder`)."""

    def match(self, key: str, value: Any) -> Any:
        m = _qc().models
        return m.FieldCondition(key=key, match=m.MatchValue(value=value))

    def match_any(self, key: str, values: list[Any]) -> Any:
        m = _qc().models
        return m.FieldCondition(key=key, match=m.MatchAny(any=values))

    def match_except(self, key: str, values: list[Any]) -> Any:
        m = _qc().models
        return m.FieldCondition(key=key, match=m.MatchExcept(**{"except": values}))

    def range(self, key: str, bounds: dict[str, float]) -> Any:
        m = _qc().models
        return m.FieldCondition(key=key, range=m.Range(**bounds))

    def datetime_range(self, key: str, bounds: dict[str, str]) -> Any:
        m = _qc().models
        return m.FieldCondition(key=key, range=m.DatetimeRange(**bounds))

    def is_null(self, key: str) -> Any:
        m = _qc().models
        return m.Filter(
            should=[
                m.IsNullCondition(is_null=m.PayloadField(key=key)),
                m.IsEmptyCondition(is_empty=m.PayloadField(key=key)),
            ]
        )

    def filter(self, must: list[Any], should: list[Any], must_not: list[Any]) -> Any:
        return _qc().models.Filter(
            must=must or None, should=should or None, must_not=must_not or None
        )


def _index_schema(index: PayloadIndex) -> Any:
    m = _qc().models
    if index.kind == "keyword" and index.tenant:
        return m.KeywordIndexParams(type=m.KeywordIndexType.KEYWORD, is_tenant=True)
    if index.kind == "integer" and index.tenant:
        return m.IntegerIndexParams(
            type=m.IntegerIndexType.INTEGER, lookup=True, range=True, is_principal=True
        )
    return {
        "keyword": m.PayloadSchemaType.KEYWORD,
        "integer": m.PayloadSchemaType.INTEGER,
        "float": m.PayloadSchemaType.FLOAT,
        "bool": m.PayloadSchemaType.BOOL,
        "datetime": m.PayloadSchemaType.DATETIME,
    }[index.kind]


log = logging.getLogger("semantic_orm")
_stores: weakref.WeakSet[QdrantClientStore] = weakref.WeakSet()
_reopening = RenewedLock()


def _forked_stores() -> None:
    """In a forked child: each store makes its own client before its next call."""
    parent = os.getppid()
    for store in list(_stores):
        store._forked_from = parent


class QdrantClientStore(QdrantStore):
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

    builder = _ClientFilters()

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
        self._options: dict[str, Any] | None = None
        if client is None:
            self._options = {"url": url, "location": location, "path": path, **client_kwargs}
            client = _qc().QdrantClient(**self._options)
        elif client_kwargs:
            raise ConfigurationError(
                "QdrantClientStore(client=...) takes no client options, "
                f"got {sorted(client_kwargs)}"
            )
        self.client = client
        self.batch_size = batch_size
        self._known: set[str] = set()
        self._where = url or location or path or "client"
        # qdrant-client's local mode is not thread-safe (a server is): serialize its calls
        local = path is not None or location == ":memory:"
        local = local or type(getattr(client, "_client", None)).__name__ == "QdrantLocal"
        self._serial: Any = RenewedLock(reentrant=True) if local else contextlib.nullcontext()
        self._forked_from: int | None = None
        self._inherited: list[Any] = []
        _stores.add(self)
        in_forked_child(_forked_stores)

    def __repr__(self) -> str:
        return f"QdrantClientStore({self._where!r})"

    def _call(self, what: str, name: str, *args: Any, **kwargs: Any) -> Any:
        if self._forked_from is not None:
            self._own_client()
        with self._serial:
            return self._guard(what, getattr(self.client, name), *args, **kwargs)

    def _own_client(self) -> None:
        """In a process forked after this store was made (a server that loads the app before
        forking its workers): a client of its own, never the parent's connections (two
        processes reading one socket get each other's answers; a gRPC channel does not survive
        a fork). Local mode on disk is refused: its directory belongs to one process."""
        with _reopening:
            parent, options = self._forked_from, self._options
            if parent is None:
                return
            if options is not None and options["path"] is not None:
                raise VectorStoreError(
                    f"QdrantClientStore(path={options['path']!r}) was opened in pid {parent}, "
                    "which this process was forked from (a server that loads the app before "
                    "forking its workers, e.g. gunicorn --preload): qdrant-client's local mode "
                    "keeps a directory to one process. Make the store and the index in each "
                    "worker, or let the workers share a Qdrant server: "
                    "QdrantClientStore(url='http://qdrant:6333')"
                )
            if options is None:
                log.warning(
                    "semantic_orm: this process was forked from pid %d after %r was made with "
                    "a client of yours: its connections may be the parent's; make the client in "
                    "each worker",
                    parent,
                    self,
                )
            elif options["location"] != ":memory:":  # (in memory: this process's own copy)
                try:
                    made = _qc().QdrantClient(**options)
                except Exception as exc:
                    raise VectorStoreError(
                        f"{self!r} could not make a client of its own in this process, forked "
                        f"from pid {parent}: {exc}"
                    ) from exc
                self._inherited.append(self.client)  # kept: closing would close the parent's
                self.client = made
            self._forked_from = None  # last: another thread waits for the new client

    # -- collections --------------------------------------------------------------------------

    def ensure_collection(self, spec: CollectionSpec) -> None:
        """Create ``spec.name`` if missing; refuse one built by another model or dimension."""
        if spec.name in self._known:
            return
        models = _qc().models
        if not self._has(spec.name):
            # a collection behind an alias of the searched name, so that a rebuild can later
            # switch the alias atomically (replace_collection)
            physical = spec.name + INITIAL_SUFFIX
            if self._call("collection_exists", "collection_exists", physical):
                # another process created it and is about to add the alias (or stopped short of
                # it): keep it, points and all, and add the alias if still missing
                self._alias(spec.name, physical)
                self.ensure_collection(spec)  # and check it like any existing collection
                return
            self._call(
                "create_collection",
                "create_collection",
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
                for index in spec.payload_indexes():
                    self._call(
                        "create_payload_index",
                        "create_payload_index",
                        physical,
                        field_name=index.key,
                        field_schema=_index_schema(index),
                    )
            self._alias(spec.name, physical)
        else:
            info = self._call("get_collection", "get_collection", spec.name)
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
            have = set(getattr(info, "payload_schema", None) or {})
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # local mode: payload indexes are no-ops
                for index in spec.indexes:
                    if index.key not in have:
                        self._call(
                            "create_payload_index",
                            "create_payload_index",
                            spec.name,
                            field_name=index.key,
                            field_schema=_index_schema(index),
                        )
        self._known.add(spec.name)

    def collection_info(self, collection: str) -> dict[str, Any] | None:
        """The metadata recorded with ``collection``, or ``None`` if it does not exist."""
        if not self._has(collection):
            return None
        info = self._call("get_collection", "get_collection", collection)
        return dict(getattr(info.config, "metadata", None) or {})

    def update_metadata(self, collection: str, changes: dict[str, Any]) -> None:
        """Merge ``changes`` into the collection's metadata (the aliased collection's)."""
        meta = {**(self.collection_info(collection) or {}), **changes}
        target = self._aliases().get(collection, collection)
        self._call("update_collection", "update_collection", target, metadata=meta)

    def index_state(self, collection: str) -> dict[str, int]:
        """Points, points in a built HNSW graph (:func:`dense_indexed`; a server builds it once
        a segment passes its indexing threshold) and segments, as the server reports them."""
        info = self._call("get_collection", "get_collection", collection)
        points = int(info.points_count or 0)
        return {
            "points": points,
            "indexed": dense_indexed(points, int(info.indexed_vectors_count or 0)),
            "segments": int(info.segments_count or 1),
        }

    def optimize(self, collection: str) -> None:
        """A server builds its indexes by itself (its optimizer thresholds): nothing to do."""

    def drop_collection(self, collection: str) -> None:
        """Delete the collection if it exists (an alias: the alias and its collection)."""
        self._known.discard(collection)
        target = self._aliases().get(collection)
        if target is not None:
            self._alias_changes([self._delete_alias(collection)])
            collection = target
        if self._call("collection_exists", "collection_exists", collection):
            self._call("delete_collection", "delete_collection", collection)

    @staticmethod
    def _delete_alias(alias: str) -> Any:
        models = _qc().models
        return models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=alias))

    @staticmethod
    def _create_alias(alias: str, collection: str) -> Any:
        models = _qc().models
        return models.CreateAliasOperation(
            create_alias=models.CreateAlias(collection_name=collection, alias_name=alias)
        )

    def _alias_changes(self, changes: list[Any]) -> None:
        self._call(
            "update_collection_aliases",
            "update_collection_aliases",
            change_aliases_operations=changes,
        )

    def _alias(self, alias: str, collection: str) -> None:
        """Create ``alias`` for ``collection`` unless some process already did."""
        if self._aliases().get(alias) == collection:
            return
        try:
            self._alias_changes([self._create_alias(alias, collection)])
        except VectorStoreError:
            if self._aliases().get(alias) != collection:  # not a lost race: a real failure
                raise

    def _aliases(self) -> dict[str, str]:
        response = self._call("get_aliases", "get_aliases")
        return {a.alias_name: a.collection_name for a in response.aliases}

    def list_collections(self) -> list[str]:
        """Aliases, and the collections no alias points to."""
        aliases = self._aliases()
        response = self._call("get_collections", "get_collections")
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
        if not self._has(source):
            raise VectorStoreError(
                f"cannot switch {collection!r} to {source!r}: {source!r} does not exist",
                transient=False,
            )
        aliases = self._aliases()
        old = aliases.get(collection)
        changes: list[Any] = []
        self._known.discard(source)
        target = aliases.get(source)
        if target is not None:  # the rebuild is itself an alias: point at what it names
            changes.append(self._delete_alias(source))
            source = target
        if old is not None:
            changes.append(self._delete_alias(collection))
        elif self._call("collection_exists", "collection_exists", collection):
            self._call("delete_collection", "delete_collection", collection)
        changes.append(self._create_alias(collection, source))
        self._alias_changes(changes)
        if old is not None and old != source:
            self._call("delete_collection", "delete_collection", old)

    # -- primitives of the shared point operations -----------------------------------------------

    def _has(self, collection: str) -> bool:
        if collection in self._known:
            return True
        if self._call("collection_exists", "collection_exists", collection):
            return True
        return collection in self._aliases()

    def _sparse(self, vector: SparseVector) -> Any:
        return _qc().models.SparseVector(indices=list(vector.indices), values=list(vector.values))

    def _point(self, pid: str, vectors: dict[str, Any], payload: dict[str, Any]) -> Any:
        return _qc().models.PointStruct(id=pid, vector=vectors, payload=payload)

    def _write(self, collection: str, points: list[Any]) -> None:
        self._call("upsert", "upsert", collection, points=points, wait=True)

    def _delete_where(self, collection: str, flt: Any) -> None:
        selector = _qc().models.FilterSelector(filter=flt)
        self._call("delete", "delete", collection, points_selector=selector, wait=True)

    def _scroll_page(
        self, collection: str, flt: Any, offset: Any, limit: int, vectors: bool
    ) -> tuple[list[Any], Any]:
        records, after = self._call(
            "scroll",
            "scroll",
            collection,
            scroll_filter=flt,
            limit=limit,
            offset=offset,
            with_payload=True,
            with_vectors=[DENSE_VECTOR] if vectors else False,
        )
        return list(records), after

    def _request(
        self, ranking: Ranking, vector: Any, flt: Any, payload: tuple[str, ...] | None
    ) -> Any:
        return _qc().models.QueryRequest(
            query=vector,
            using=ranking.using,
            limit=ranking.limit,
            offset=ranking.offset or None,
            filter=flt,
            score_threshold=ranking.threshold,
            with_payload=list(payload) if payload else payload is None,
            with_vector=[ranking.using] if ranking.with_vector else False,
        )

    def _query_batch(self, collection: str, requests: list[Any]) -> list[list[Any]]:
        responses = self._call("query_batch_points", "query_batch_points", collection, requests)
        return [list(response.points) for response in responses]

    def _count(self, collection: str) -> int:
        return int(self._call("count", "count", collection, exact=True).count)

    def close(self) -> None:
        """Close the client's connections (in a forked child that has made none of its own
        yet, nothing: the ones it holds are its parent's)."""
        if self._forked_from is None:
            self._call("close", "close")
