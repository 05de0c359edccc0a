"""Qdrant Edge: the real Qdrant engine, in-process, persisted in a directory.

This is the embedded default. Each collection is one Edge *shard* in its own sub-directory of the
store's ``path``, with a ``semantic_orm.json`` file beside the shard's data recording what
produced the vectors::

    vectors/
        knowledge_article__content/
            semantic_orm.json      {"model": ..., "dimension": 384, "chunker": {...}, ...}
            shard/                 Qdrant Edge segments and write-ahead log

A shard can be opened by one process at a time (its write-ahead log is locked). Within a process,
every ``EdgeStore`` on the same directory shares one open shard, so two stores or two threads do
not fight over the lock. Run background workers in the same process, or use a Qdrant server
(:class:`~semantic_orm.stores.client.QdrantClientStore`) when several processes must write.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..exc import ConfigurationError, MissingDependencyError, VectorStoreError
from .base import (
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

__all__ = ["EdgeStore"]

_META_FILE = "semantic_orm.json"
_SHARD_DIR = "shard"
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")


def _parked(cdir: Path) -> Path:
    """Where a non-atomic swap parks a collection's directory for a moment."""
    return cdir.with_name(cdir.name + ".swap")


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> None:
    """Swap two directories: atomically with ``renameat2(RENAME_EXCHANGE)`` if available."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is not None:
        rc = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
        if rc == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            raise OSError(err, os.strerror(err), str(a), None, str(b))
    parked = _parked(b)
    b.rename(parked)
    a.rename(b)
    parked.rename(a)


def _load_into(opened: _OpenShard | None, collection: str, cdir: Path) -> _OpenShard:
    """(Re)load the shard in ``cdir`` into ``opened`` (or a new registry entry); registry locked.

    If loading fails, ``opened`` is marked closed and forgotten, so the next use reopens it.
    """
    key = str(cdir)
    try:
        meta = json.loads((cdir / _META_FILE).read_text("utf-8"))
        shard = _qe().EdgeShard.load(str(cdir / _SHARD_DIR))
    except Exception as exc:
        if opened is not None:
            opened.closed = True
            _registry.pop(key, None)
        raise VectorStoreError(
            f"cannot open Qdrant Edge collection {collection!r} at {cdir}: {exc} "
            "(is another process using it?)"
        ) from exc
    if opened is None:
        opened = _registry[key] = _OpenShard(shard, int(meta["dimension"]), meta)
    else:
        opened.shard, opened.meta, opened.dimension = shard, meta, int(meta["dimension"])
    return opened


def _qe() -> Any:
    try:
        import qdrant_edge
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(
            "EdgeStore needs Qdrant Edge: pip install 'semantic-orm[edge]' (qdrant-edge-py)"
        ) from exc
    return qdrant_edge


class _OpenShard:
    """One open Edge shard, shared by every EdgeStore of this process on the same path."""

    def __init__(self, shard: Any, dimension: int, meta: dict[str, Any]) -> None:
        self.shard = shard
        self.dimension = dimension
        self.meta = meta
        self.lock = threading.RLock()
        self.users = 0
        self.closed = False


_registry: dict[str, _OpenShard] = {}
_registry_lock = threading.Lock()


class EdgeStore:
    """Vector store backed by Qdrant Edge shards under ``path`` (one per collection).

    Args:
        path: Directory holding the collections; created if missing.
        batch_size: Points per upsert call.
    """

    def __init__(self, path: str | os.PathLike[str], *, batch_size: int = DEFAULT_BATCH_SIZE):
        if batch_size <= 0:
            raise ConfigurationError(f"EdgeStore batch_size must be > 0, got {batch_size}")
        self.path = Path(path).resolve()
        self.batch_size = batch_size
        self._mine: dict[str, _OpenShard] = {}
        self._lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"EdgeStore({str(self.path)!r})"

    # -- collections --------------------------------------------------------------------------

    def _dir(self, collection: str) -> Path:
        if not _NAME_RE.match(collection):
            raise ConfigurationError(
                f"collection name {collection!r} must use letters, digits, '_', '.' or '-'"
            )
        return self.path / collection

    def _open(self, collection: str, spec: CollectionSpec | None = None) -> _OpenShard | None:
        """The open shard for ``collection``, created from ``spec`` when missing."""
        if self._closed:
            raise VectorStoreError(f"{self!r} is closed")
        with self._lock:
            opened = self._mine.get(collection)
            if opened is not None and not opened.closed:
                return opened
        cdir = self._dir(collection)
        key = str(cdir)
        qe = _qe()
        with _registry_lock:
            opened = _registry.get(key)
            if opened is None:
                meta_file = cdir / _META_FILE
                parked = _parked(cdir)
                if not cdir.exists() and (parked / _META_FILE).exists():
                    parked.rename(cdir)  # a non-atomic swap stopped half-way: put it back
                if meta_file.exists():
                    opened = _load_into(None, collection, cdir)
                elif spec is None:
                    return None
                else:
                    cdir.mkdir(parents=True, exist_ok=True)
                    shard_dir = cdir / _SHARD_DIR
                    if shard_dir.exists():  # left by a creation that crashed before its metadata
                        shutil.rmtree(shard_dir)
                    config = qe.EdgeConfig(
                        vectors={
                            DENSE_VECTOR: qe.EdgeVectorParams(
                                size=spec.dimension, distance=qe.Distance.Cosine
                            )
                        },
                        sparse_vectors={
                            SPARSE_VECTOR: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)
                        },
                    )
                    try:
                        shard = qe.EdgeShard.create(str(shard_dir), config)
                        shard.update(
                            qe.UpdateOperation.create_field_index(
                                "pk", qe.PayloadSchemaType.Keyword
                            )
                        )
                    except Exception as exc:
                        raise VectorStoreError(
                            f"cannot create Qdrant Edge collection {collection!r} at {cdir}: {exc}"
                        ) from exc
                    meta = spec.record()
                    tmp = cdir / (_META_FILE + ".tmp")
                    tmp.write_text(json.dumps(meta, sort_keys=True), "utf-8")
                    tmp.replace(cdir / _META_FILE)  # atomic: metadata marks a finished collection
                    opened = _registry[key] = _OpenShard(shard, spec.dimension, meta)
            opened.users += 1
        with self._lock:
            self._mine[collection] = opened
        return opened

    def ensure_collection(self, spec: CollectionSpec) -> None:
        """Create ``spec.name`` if missing; refuse one built by another model or dimension."""
        opened = self._open(spec.name, spec)
        assert opened is not None
        check_collection_matches(spec, opened.dimension, opened.meta, found_layout=None)

    def collection_info(self, collection: str) -> dict[str, Any] | None:
        """The metadata recorded with ``collection``, or ``None`` if it does not exist."""
        opened = self._open(collection)
        return None if opened is None else dict(opened.meta)

    def drop_collection(self, collection: str) -> None:
        """Close and delete the collection's directory."""
        cdir = self._dir(collection)
        key = str(cdir)
        with _registry_lock:
            opened = _registry.pop(key, None)
            if opened is not None:
                with opened.lock:
                    opened.shard.close()
                    opened.closed = True
        with self._lock:
            self._mine.pop(collection, None)
        if cdir.exists():
            shutil.rmtree(cdir)

    def list_collections(self) -> list[str]:
        """Names of the finished collections under ``path``."""
        if not self.path.is_dir():
            return []
        return sorted(
            d.name for d in self.path.iterdir() if d.is_dir() and (d / _META_FILE).exists()
        )

    def replace_collection(self, collection: str, source: str) -> None:
        """Swap ``source``'s directory into ``collection``'s place, then delete the old one.

        The two directories are exchanged with one ``renameat2(RENAME_EXCHANGE)`` call where the
        kernel and file system support it (else three renames, repaired on the next open if
        interrupted). Searches of this process wait on the shard's lock during the swap and
        then read the new shard; none fails or sees a half-switched collection.

        Raises:
            VectorStoreError: ``source`` does not exist, or another process has ``collection``
                open (an Edge shard belongs to one process: switch inside that process, or stop
                it first).
        """
        src_dir, dst_dir = self._dir(source), self._dir(collection)
        if not (src_dir / _META_FILE).exists():
            raise VectorStoreError(
                f"cannot switch {collection!r} to {source!r}: {source!r} does not exist"
            )
        if (dst_dir / _META_FILE).exists():
            try:
                self._require(collection)  # holding it here proves no other process does
            except VectorStoreError as exc:
                raise VectorStoreError(
                    f"cannot switch Qdrant Edge collection {collection!r}: {exc}. A shard is used "
                    "by one process at a time: run the rebuild inside the application's process "
                    "(semantic_orm.maintenance.rebuild), or stop the application first"
                ) from exc
        with _registry_lock:
            src = _registry.pop(str(src_dir), None)
            if src is not None:
                with src.lock:
                    src.shard.close()
                    src.closed = True
            dst = _registry.get(str(dst_dir))
            guard = dst.lock if dst is not None else contextlib.nullcontext()
            with guard:
                if dst is not None:
                    dst.shard.close()
                try:
                    if (dst_dir / _META_FILE).exists():
                        _exchange(src_dir, dst_dir)
                    else:
                        if dst_dir.exists():
                            shutil.rmtree(dst_dir)  # an unfinished creation, never searched
                        src_dir.rename(dst_dir)
                except BaseException:
                    parked = _parked(dst_dir)
                    if not dst_dir.exists() and parked.exists():
                        parked.rename(dst_dir)  # undo a half-done fallback swap
                    if dst is not None:
                        _load_into(dst, collection, dst_dir)
                    raise
                _load_into(dst, collection, dst_dir)
        with self._lock:
            self._mine.pop(source, None)
        if src_dir.exists():  # the old collection, switched out: no longer a collection, then gone
            (src_dir / _META_FILE).unlink(missing_ok=True)
            shutil.rmtree(src_dir, ignore_errors=True)

    # -- points -------------------------------------------------------------------------------

    def _require(self, collection: str) -> _OpenShard:
        opened = self._open(collection)
        if opened is None:
            raise VectorStoreError(f"collection {collection!r} does not exist in {self.path}")
        return opened

    def upsert(self, collection: str, points: Sequence[VectorPoint]) -> None:
        """Insert or overwrite ``points`` in batches of ``batch_size``."""
        if not points:
            return
        qe = _qe()
        opened = self._require(collection)
        for start in range(0, len(points), self.batch_size):
            batch = []
            for p in points[start : start + self.batch_size]:
                vectors: dict[str, Any] = {DENSE_VECTOR: p.vector.tolist()}
                if p.sparse:
                    vectors[SPARSE_VECTOR] = qe.SparseVector(
                        list(p.sparse.indices), list(p.sparse.values)
                    )
                batch.append(qe.Point(p.id, vectors, dict(p.payload)))
            with opened.lock:
                opened.shard.update(qe.UpdateOperation.upsert_points(batch))

    def delete_rows(self, collection: str, rows: Sequence[tuple[str, int]]) -> None:
        """Delete each row's points with ``chunk_index >= from_index``, in batched filters."""
        qe = _qe()
        opened = self._open(collection)
        if opened is None or not rows:
            return
        for start in range(0, len(rows), self.batch_size):
            should: list[Any] = []
            for pk, from_index in rows[start : start + self.batch_size]:
                must: list[Any] = [qe.FieldCondition(key="pk", match=qe.MatchValue(pk))]
                if from_index > 0:
                    must.append(
                        qe.FieldCondition(key="chunk_index", range=qe.RangeFloat(gte=from_index))
                    )
                should.append(qe.Filter(must=must))
            operation = qe.UpdateOperation.delete_points_by_filter(qe.Filter(should=should))
            with opened.lock:
                opened.shard.update(operation)

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
        qe = _qe()
        opened = self._open(collection)
        if opened is None or limit <= 0:
            return []
        dense = None if vector is None else qe.Query.Nearest(vector.tolist(), using=DENSE_VECTOR)
        keyword = None
        if sparse:
            keyword = qe.Query.Nearest(
                qe.SparseVector(list(sparse.indices), list(sparse.values)), using=SPARSE_VECTOR
            )
        if mode == "keyword" or (mode == "hybrid" and dense is None):
            if keyword is None:
                return []
            request = qe.QueryRequest(
                limit=limit, query=keyword, with_payload=True, score_threshold=score_threshold
            )
        elif mode == "hybrid" and keyword is not None:
            request = qe.QueryRequest(
                limit=limit,
                prefetches=[
                    qe.Prefetch(limit=limit, query=dense, score_threshold=score_threshold),
                    qe.Prefetch(limit=limit, query=keyword),
                ],
                query=qe.Fusion.Rrf(k=RRF_K),
                with_payload=True,
            )
        else:
            if dense is None:
                raise ConfigurationError(f"{mode} search needs a dense query vector")
            request = qe.QueryRequest(
                limit=limit, query=dense, with_payload=True, score_threshold=score_threshold
            )
        with opened.lock:
            found = opened.shard.query(request)
        return [StoreHit(str(p.id), float(p.score), p.payload or {}) for p in found]

    def _scroll(self, collection: str, flt: Any, vectors: bool) -> list[StoreHit]:
        qe = _qe()
        opened = self._open(collection)
        if opened is None:
            return []
        out: list[StoreHit] = []
        offset: Any = None
        while True:
            request = qe.ScrollRequest(
                offset=offset, limit=1000, filter=flt, with_payload=True, with_vector=vectors
            )
            with opened.lock:
                records, offset = opened.shard.scroll(request)
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
        qe = _qe()
        flt = None
        if pk is not None:
            flt = qe.Filter(must=[qe.FieldCondition(key="pk", match=qe.MatchValue(pk))])
        return self._scroll(collection, flt, vectors=False)

    def existing(self, collection: str, pks: Sequence[str]) -> list[StoreHit]:
        """The points of rows ``pks``, with payloads and vectors."""
        qe = _qe()
        out: list[StoreHit] = []
        for start in range(0, len(pks), 1000):
            batch = list(pks[start : start + 1000])
            flt = qe.Filter(must=[qe.FieldCondition(key="pk", match=qe.MatchAny(batch))])
            out.extend(self._scroll(collection, flt, vectors=True))
        return out

    def count(self, collection: str) -> int:
        """Points in the collection (0 if it does not exist)."""
        qe = _qe()
        opened = self._open(collection)
        if opened is None:
            return 0
        with opened.lock:
            return int(opened.shard.count(qe.CountRequest(exact=True)))

    def close(self) -> None:
        """Release this store's shards; the last user of a shard flushes and closes it."""
        with self._lock:
            mine, self._mine = self._mine, {}
            self._closed = True
        with _registry_lock:
            for opened in mine.values():
                opened.users -= 1
                if opened.users <= 0:
                    with opened.lock:
                        opened.shard.flush()
                        opened.shard.close()
                    for key, value in list(_registry.items()):
                        if value is opened:
                            del _registry[key]
