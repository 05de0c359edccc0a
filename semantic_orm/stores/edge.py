"""Qdrant Edge: the real Qdrant engine, in-process, persisted in a directory.

This is the embedded default. Each collection is one Edge *shard* in its own sub-directory of the
store's ``path``, with a ``semantic_orm.json`` file beside the shard's data recording what
produced the vectors::

    vectors/
        knowledge_article__content/
            semantic_orm.json      {"model": ..., "dimension": 384, "chunker": {...}, ...}
            semantic_orm.owner     the process holding the shard (pid, host, command)
            shard/                 Qdrant Edge segments and write-ahead log

The shard builds its vector index (HNSW) when asked, never by itself: after writes leave
``optimize_after`` points unindexed, a background thread runs Edge's optimiser (searches stay
correct throughout, on the segments as they are), and ``reindex``/``rebuild`` finish with an
optimisation. qdrant-edge-py 0.9 holds the GIL while it optimises, so the process's other
Python threads wait meanwhile (about 10 s per 20,000 384-dimension points on 2 cores): a bulk
load pays it once per ``optimize_after`` points, a steady trickle of commits rarely. Tune with
``hnsw=`` and ``optimize_after=`` (``None``: only when asked, :meth:`EdgeStore.optimize`).
Each optimisation ends with a flush, which is when Edge lets go of the segments it replaced
(their files would otherwise stay mapped, a second copy of the data in memory).

A shard can be opened by one process at a time (its write-ahead log is locked). Within a process,
every ``EdgeStore`` on the same directory shares one open shard, so two stores or two threads do
not fight over the lock. A second process gets one clear :class:`VectorStoreError` naming the
directory, the process holding it and the two ways out: run one process with Edge (workers as
threads, :class:`~semantic_orm.worker.Worker`), or use a Qdrant server
(:class:`~semantic_orm.stores.client.QdrantClientStore`) when several processes must write.
A process forked from one that has a shard open (a pre-forking server that loaded the app
first) never uses the parent's: that copy would hang on the locks the parent's threads held at
the fork, or write beside the parent. It opens its own and gets that same error (the parent's
copy, kept in the child, holds the directory for as long as the child lives); see
:mod:`semantic_orm.forking` for where that hook runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import json
import logging
import os
import re
import shutil
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..exc import ConfigurationError, VectorStoreError, import_optional
from ..forking import RenewedLock, in_forked_child
from . import base
from .base import CollectionSpec, PayloadIndex, Ranking, SparseVector
from .qdrant import QdrantStore, dense_indexed, store_error

__all__ = ["EdgeStore"]

_META_FILE = "semantic_orm.json"
_OWNER_FILE = "semantic_orm.owner"
_SHARD_DIR = "shard"
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")
log = logging.getLogger("semantic_orm")
_schedule_lock = RenewedLock()


@functools.cache  # once imported: it is looked up for every point written
def _qe() -> Any:
    return import_optional(
        "qdrant_edge",
        "EdgeStore needs Qdrant Edge: pip install 'semantic-orm[edge]' (qdrant-edge-py)",
    )


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


def _owner_line() -> str:
    command = " ".join(sys.argv)[:200] or sys.executable
    return f"pid {os.getpid()} on {socket.gethostname()} ({command})"


def _holder(cdir: Path) -> str:
    """Who holds the shard in ``cdir``, as recorded by the process that opened it."""
    try:
        return (cdir / _OWNER_FILE).read_text("utf-8").strip() or "another process"
    except OSError:
        return "another process"


class _HeldElsewhere(VectorStoreError):
    """The shard is open in another process (see :func:`_held_error`)."""


def _held_error(collection: str, cdir: Path, exc: BaseException) -> VectorStoreError:
    holder = _holder(cdir)
    forked = ""
    if _forked_from is not None and holder.startswith(f"pid {_forked_from} "):
        forked = (
            "This process was forked from that one after it opened the collection (a server "
            "that loads the app before forking its workers, e.g. gunicorn --preload): touch "
            "the index only in the workers. "
        )
    return _HeldElsewhere(
        f"Qdrant Edge collection {collection!r} at {cdir} is open in {holder}: a Qdrant "
        "Edge directory belongs to one process. Either run one process with EdgeStore (a web "
        "server with one worker process, background syncing as a thread: "
        "semantic_orm.Worker(index, engine).start()), or let several processes share a Qdrant "
        f"server: SemanticIndex(store=QdrantClientStore(url='http://qdrant:6333')). {forked}"
        f"({exc})",
        transient=True,
    )


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
        if "WouldBlock" in str(exc) or "lock" in str(exc).lower():
            raise _held_error(collection, cdir, exc) from exc
        raise VectorStoreError(
            f"cannot open Qdrant Edge collection {collection!r} at {cdir}: {exc}"
        ) from exc
    _claim_owner(cdir)
    if opened is None:
        opened = _registered(key, _OpenShard(shard, int(meta["dimension"]), meta))
    else:
        opened.shard, opened.meta, opened.dimension = shard, meta, int(meta["dimension"])
    return opened


def _claim_owner(cdir: Path) -> None:
    with contextlib.suppress(OSError):
        (cdir / _OWNER_FILE).write_text(_owner_line(), "utf-8")


class _OpenShard:
    """One open Edge shard, shared by every EdgeStore of this process on the same path."""

    def __init__(self, shard: Any, dimension: int, meta: dict[str, Any]) -> None:
        self.shard = shard
        self.dimension = dimension
        self.meta = meta
        self.lock = RenewedLock(reentrant=True)
        self.users = 0
        self.closed = False
        self.written = 0
        """Points written since the last optimisation (or since it was opened)."""
        self.optimizing: threading.Thread | None = None


_registry: dict[str, _OpenShard] = {}
_registry_lock = RenewedLock()
_forked_from: int | None = None
"""The parent's pid in a process forked while shards were open."""


def _forget_parents_shards() -> None:
    """In a forked child: never touch the shards the parent had open.

    The copies share the parent's files and the state of its threads at the fork (a lock one of
    them held stays locked here): using one would hang or write beside the parent, and freeing
    one would flush it. They are marked closed (each store then opens its own) and kept alive
    for good; the registry starts empty.
    """
    global _forked_from
    if not _registry:
        return
    _forked_from = os.getppid()
    for opened in _registry.values():
        opened.closed = True
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(opened.shard))  # never dropped here
    _registry.clear()


def _registered(key: str, opened: _OpenShard) -> _OpenShard:
    """Put a newly opened shard in the registry (locked), forgotten by forked children."""
    in_forked_child(_forget_parents_shards)
    _registry[key] = opened
    return opened


def _close(opened: _OpenShard | None) -> None:
    """Close a shard taken out of the registry (its users see it closed and reopen)."""
    if opened is not None:
        with opened.lock:
            opened.shard.close()
            opened.closed = True


class _EdgeFilters:
    """Qdrant Edge's filter constructors (see :class:`~semantic_orm.stores.base.FilterBuilder`)."""

    def match(self, key: str, value: Any) -> Any:
        qe = _qe()
        return qe.FieldCondition(key=key, match=qe.MatchValue(value))

    def match_any(self, key: str, values: list[Any]) -> Any:
        qe = _qe()
        return qe.FieldCondition(key=key, match=qe.MatchAny(values))

    def match_except(self, key: str, values: list[Any]) -> Any:
        qe = _qe()
        return qe.FieldCondition(key=key, match=qe.MatchExcept(values))

    def range(self, key: str, bounds: dict[str, float]) -> Any:
        qe = _qe()
        return qe.FieldCondition(key=key, range=qe.RangeFloat(**bounds))

    def datetime_range(self, key: str, bounds: dict[str, str]) -> Any:
        qe = _qe()
        return qe.FieldCondition(key=key, range=qe.RangeDateTime(**bounds))

    def is_null(self, key: str) -> Any:
        qe = _qe()
        return qe.Filter(should=[qe.IsNullCondition(key), qe.IsEmptyCondition(key)])

    def filter(self, must: list[Any], should: list[Any], must_not: list[Any]) -> Any:
        return _qe().Filter(must=must or None, should=should or None, must_not=must_not or None)


HNSW_DEFAULTS: dict[str, Any] = {"m": 16, "ef_construct": 64, "full_scan_threshold": 10_000}
"""The embedded store's HNSW settings: Qdrant's graph degree, a build effort that halves the
build time of Qdrant's default (100) for a recall loss invisible at ``limit`` <= 100, and exact
search below about 10 MB of vectors per segment."""
OPTIMIZER_DEFAULTS: dict[str, Any] = {"max_segment_size": 64_000, "default_segment_number": 4}
"""Segments stop growing at about 64 MB of vectors (42,000 of 384 dimensions): an optimisation
then builds the new points' segment instead of rebuilding one ever larger graph (its time, and
the GIL pause, stay under about 20 s on 2 cores), for a search over a few segments (4.4 ms at
200,000 points against 2.5 ms for one)."""
OPTIMIZE_AFTER = 20_000
"""Unindexed points that make the store build its index in the background."""


def _index_schema(index: PayloadIndex) -> Any:
    qe = _qe()
    if index.kind == "keyword":
        return (
            qe.KeywordIndexParams(is_tenant=True) if index.tenant else qe.PayloadSchemaType.Keyword
        )
    if index.kind == "integer":
        return qe.IntegerIndexParams(lookup=True, range=True, is_principal=index.tenant or None)
    schema = {
        "float": "Float",
        "bool": "Bool",
        "datetime": "Datetime",
    }[index.kind]
    return getattr(qe.PayloadSchemaType, schema)


class EdgeStore(QdrantStore):
    """Vector store backed by Qdrant Edge shards under ``path`` (one per collection).

    Args:
        path: Directory holding the collections; created if missing.
        batch_size: Points per upsert call.
        hnsw: HNSW settings for new collections, over :data:`HNSW_DEFAULTS` (``m``,
            ``ef_construct``, ``full_scan_threshold``, ``max_indexing_threads``...).
        optimizers: Edge optimiser settings for new collections, over
            :data:`OPTIMIZER_DEFAULTS` (``max_segment_size``, ``default_segment_number``,
            ``indexing_threshold``, ``deleted_threshold``...).
        optimize_after: Unindexed points after which the index is built in the background;
            ``None`` builds it only when :meth:`optimize` is called.
    """

    builder = _EdgeFilters()

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        batch_size: int = base.DEFAULT_BATCH_SIZE,
        hnsw: dict[str, Any] | None = None,
        optimizers: dict[str, Any] | None = None,
        optimize_after: int | None = OPTIMIZE_AFTER,
    ):
        if batch_size <= 0:
            raise ConfigurationError(f"EdgeStore batch_size must be > 0, got {batch_size}")
        if optimize_after is not None and optimize_after <= 0:
            raise ConfigurationError(
                f"EdgeStore optimize_after must be > 0 or None, got {optimize_after}"
            )
        self.hnsw = {**HNSW_DEFAULTS, **(hnsw or {})}
        self.optimizers = {**OPTIMIZER_DEFAULTS, **(optimizers or {})}
        self.optimize_after = optimize_after
        self.path = Path(path).resolve()
        self.batch_size = batch_size
        self._mine: dict[str, _OpenShard] = {}
        self._lock = RenewedLock()
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
            raise VectorStoreError(f"{self!r} is closed", transient=False)
        with self._lock:
            opened = self._mine.get(collection)
            if opened is not None and not opened.closed:
                return opened
        cdir = self._dir(collection)
        key = str(cdir)
        with _registry_lock:
            opened = _registry.get(key)
            if opened is None:
                parked = _parked(cdir)
                if not cdir.exists() and (parked / _META_FILE).exists():
                    parked.rename(cdir)  # a non-atomic swap stopped half-way: put it back
                if (cdir / _META_FILE).exists():
                    opened = _load_into(None, collection, cdir)
                elif spec is None:
                    return None
                else:
                    opened = _registered(key, self._create(collection, cdir, spec))
            opened.users += 1
        with self._lock:
            self._mine[collection] = opened
        return opened

    def _create(self, collection: str, cdir: Path, spec: CollectionSpec) -> _OpenShard:
        """Create the shard for ``spec`` in ``cdir`` (registry locked)."""
        qe = _qe()
        cdir.mkdir(parents=True, exist_ok=True)
        shard_dir = cdir / _SHARD_DIR
        if shard_dir.exists():  # left by a creation that crashed before its metadata
            shutil.rmtree(shard_dir)
        config = qe.EdgeConfig(
            vectors={
                base.DENSE_VECTOR: qe.EdgeVectorParams(
                    size=spec.dimension, distance=qe.Distance.Cosine
                )
            },
            sparse_vectors={
                base.SPARSE_VECTOR: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)
            },
            hnsw_config=self._hnsw(spec),
            optimizers=self._optimizers(),
        )
        try:
            shard = qe.EdgeShard.create(str(shard_dir), config)
            # no chunk_index index: it made every upsert ~20% slower and only speeds up
            # reconcile's sweep of first chunks (2.5x over 60,000 points; a whole reconcile of
            # 5,000 rows 1.2x: its SQL side costs more)
            for index in spec.payload_indexes(first_chunks=False):
                shard.update(qe.UpdateOperation.create_field_index(index.key, _index_schema(index)))
        except Exception as exc:
            raise VectorStoreError(
                f"cannot create Qdrant Edge collection {collection!r} at {cdir}: {exc}"
            ) from exc
        _claim_owner(cdir)
        meta = spec.record()
        tmp = cdir / (_META_FILE + ".tmp")
        tmp.write_text(json.dumps(meta, sort_keys=True), "utf-8")
        tmp.replace(cdir / _META_FILE)  # atomic: the metadata marks a finished collection
        return _OpenShard(shard, spec.dimension, meta)

    def _hnsw(self, spec: CollectionSpec) -> Any:
        settings = dict(self.hnsw)
        if any(index.tenant for index in spec.indexes):
            settings.setdefault("payload_m", settings["m"])  # a graph per tenant as well
        try:
            return _qe().HnswIndexConfig(**settings)
        except TypeError as exc:
            raise ConfigurationError(f"EdgeStore hnsw={self.hnsw!r}: {exc}") from None

    def _optimizers(self) -> Any:
        try:
            return _qe().EdgeOptimizersConfig(**self.optimizers)
        except TypeError as exc:
            raise ConfigurationError(f"EdgeStore optimizers={self.optimizers!r}: {exc}") from None

    def ensure_collection(self, spec: CollectionSpec) -> None:
        """Create ``spec.name`` if missing; refuse one built by another model or dimension.

        Payload indexes ``spec`` declares that an existing collection lacks are created.
        """
        opened = self._open(spec.name, spec)
        assert opened is not None
        base.check_collection_matches(spec, opened.dimension, opened.meta, found_layout=None)
        if spec.indexes:
            with opened.lock:
                have = set(self._guard("info", opened.shard.info).payload_schema)
                for index in spec.indexes:
                    if index.key not in have:
                        op = _qe().UpdateOperation.create_field_index(
                            index.key, _index_schema(index)
                        )
                        self._guard("create index", opened.shard.update, op)

    def update_metadata(self, collection: str, changes: dict[str, Any]) -> None:
        """Record ``changes`` in the collection's metadata (e.g. filter fields now filled)."""
        opened = self._require(collection)
        with opened.lock:
            meta = {**opened.meta, **changes}
            cdir = self._dir(collection)
            tmp = cdir / (_META_FILE + ".tmp")
            tmp.write_text(json.dumps(meta, sort_keys=True), "utf-8")
            tmp.replace(cdir / _META_FILE)
            opened.meta = meta

    def index_state(self, collection: str) -> dict[str, int]:
        """Points, points whose dense vector is in a built HNSW graph
        (:func:`~semantic_orm.stores.qdrant.dense_indexed`), and segments."""
        opened = self._require(collection)
        with opened.lock:
            info = self._guard("info", opened.shard.info)
        points = int(info.points_count)
        return {
            "points": points,
            "indexed": dense_indexed(points, int(info.indexed_vectors_count)),
            "segments": int(info.segments_count),
        }

    def optimize(self, collection: str) -> None:
        """Build the collection's vector index now (and merge small segments); waits for a
        background optimisation already running."""
        opened = self._require(collection)
        running = opened.optimizing
        if running is not None:
            running.join()
        self._optimize(opened)

    def _optimize(self, opened: _OpenShard) -> None:
        with opened.lock:
            if opened.closed:
                return
            opened.written = 0
            self._guard("optimize", opened.shard.optimize)
            # Edge drops the segments an optimisation replaced only at the next flush: until
            # then their files stay mapped and resident (measured: 547 MB against 215 MB after
            # four optimisations of 20,000 points), so each build would add a copy of the data
            self._guard("flush", opened.shard.flush)

    def _after_write(self, collection: str, count: int) -> None:
        """Start a background optimisation once enough points are unindexed."""
        if self.optimize_after is None:
            return
        opened = self._require(collection)
        with _schedule_lock:
            opened.written += count
            if opened.written < self.optimize_after or opened.optimizing is not None:
                return
            state = self.index_state(collection)
            unindexed = state["points"] - state["indexed"]
            if unindexed < self.optimize_after:
                opened.written = unindexed
                return

            def run() -> None:
                try:
                    self._optimize(opened)
                except Exception as exc:  # the next writes try again
                    log.warning("semantic_orm: optimising %s failed: %s", collection, exc)
                finally:
                    opened.optimizing = None

            opened.optimizing = threading.Thread(
                target=run, name=f"semantic-orm-optimize-{collection}", daemon=True
            )
            opened.optimizing.start()

    def collection_info(self, collection: str) -> dict[str, Any] | None:
        """The metadata recorded with ``collection``, or ``None`` if it does not exist."""
        opened = self._open(collection)
        return None if opened is None else dict(opened.meta)

    def drop_collection(self, collection: str) -> None:
        """Close and delete the collection's directory; refused (the one-process error) while
        another process holds it, whose shard would lose its files under it."""
        cdir = self._dir(collection)
        if (cdir / _META_FILE).exists():
            try:
                self._require(collection)  # holding it here proves no other process does
            except _HeldElsewhere:
                raise
            except VectorStoreError:  # unreadable: nobody holds it, and it goes
                log.warning("semantic_orm: dropping unreadable collection %r", collection)
        with _registry_lock:
            _close(_registry.pop(str(cdir), None))
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
                f"cannot switch {collection!r} to {source!r}: {source!r} does not exist",
                transient=False,
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
            _close(_registry.pop(str(src_dir), None))
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

    # -- primitives of the shared point operations -----------------------------------------------

    def _require(self, collection: str) -> _OpenShard:
        opened = self._open(collection)
        if opened is None:
            raise VectorStoreError(
                f"collection {collection!r} does not exist in {self.path}", transient=False
            )
        return opened

    def _has(self, collection: str) -> bool:
        return self._open(collection) is not None

    def _shard_call(self, collection: str, what: str, fn: Any, *args: Any) -> Any:
        opened = self._require(collection)
        with opened.lock:
            return self._guard(what, getattr(opened.shard, fn), *args)

    def _dense(self, vector: npt.NDArray[np.float32]) -> Any:
        # the binding reads the array's buffer as it would a list, without the Python floats
        # of a list in between (a point of 384 dimensions converts ~2.4 µs faster); native
        # float32 as the buffer holds it (no copy when the vector already is)
        return np.ascontiguousarray(vector, dtype=np.float32).data

    def _sparse(self, vector: SparseVector) -> Any:
        return _qe().SparseVector(list(vector.indices), list(vector.values))

    def _point(self, pid: str, vectors: dict[str, Any], payload: dict[str, Any]) -> Any:
        return _qe().Point(pid, vectors, payload)

    def _write(self, collection: str, points: list[Any]) -> None:
        op = _qe().UpdateOperation.upsert_points(points)
        self._shard_call(collection, "upsert", "update", op)
        self._after_write(collection, len(points))

    def _delete_where(self, collection: str, flt: Any) -> None:
        op = _qe().UpdateOperation.delete_points_by_filter(flt)
        self._shard_call(collection, "delete", "update", op)

    def _scroll_page(
        self, collection: str, flt: Any, offset: Any, limit: int, vectors: bool
    ) -> tuple[list[Any], Any]:
        request = _qe().ScrollRequest(
            offset=offset, limit=limit, filter=flt, with_payload=True, with_vector=vectors
        )
        records, after = self._shard_call(collection, "scroll", "scroll", request)
        return list(records), after

    def _request(
        self, ranking: Ranking, vector: Any, flt: Any, payload: tuple[str, ...] | None
    ) -> Any:
        qe = _qe()
        selected = qe.PayloadSelector.Include(list(payload)) if payload else payload is None
        return qe.QueryRequest(
            limit=ranking.limit,
            offset=ranking.offset or None,
            query=qe.Query.Nearest(vector, using=ranking.using),
            filter=flt,
            score_threshold=ranking.threshold,
            with_payload=selected,
            with_vector=[ranking.using] if ranking.with_vector else None,
        )

    def _query_batch(self, collection: str, requests: list[Any]) -> list[list[Any]]:
        batch = _qe().QueryBatchRequest(requests)
        return list(self._shard_call(collection, "query", "query_batch", batch))

    def _count(self, collection: str) -> int:
        return int(self._shard_call(collection, "count", "count", _qe().CountRequest(exact=True)))

    def close(self) -> None:
        """Release this store's shards; the last user of a shard flushes and closes it."""
        with self._lock:
            mine, self._mine = self._mine, {}
            self._closed = True
        with _registry_lock:
            for opened in mine.values():
                opened.users -= 1
                if opened.users <= 0 and not opened.closed:
                    with opened.lock:
                        try:
                            opened.shard.flush()
                            opened.shard.close()
                        except Exception as exc:  # pragma: no cover - the engine failed
                            raise store_error("close", self, exc) from exc
                        opened.closed = True
                    for key, value in list(_registry.items()):
                        if value is opened:
                            del _registry[key]
