"""The vector-store protocols and the values that cross them.

A store keeps one *collection* per semantic column. Each chunk of a row is one *point*:

* its id is derived deterministically from ``(collection, primary key, chunk index)``
  (:func:`point_id`), so writing the same row twice overwrites the same points;
* it carries two named vectors: ``"dense"`` (the embedding, cosine) and ``"bm25"`` (a sparse
  keyword vector from :mod:`semantic_orm.keywords`, scored with Qdrant's IDF modifier);
* its payload is a :class:`PointPayload`: the contract between the writer (the sync), the
  reader (search), maintenance tools and both adapters. Every key is named here and nowhere
  else.

The two protocols split the hot path from administration:

* :class:`VectorStore` - what syncing and searching need: create or check a collection, upsert
  and delete points, read a row's points back, and answer a :class:`SearchRequest`;
* :class:`StoreAdmin` - what tools need: list, describe, count, page through, drop and switch
  collections.

A search is *planned* by the caller (:mod:`semantic_orm.search`) as a :class:`SearchRequest`: one
or more :class:`Ranking` lists (a dense or a sparse query vector, a depth, an offset, an
optional score threshold) under one optional :class:`Filter`. The store only runs the rankings
and returns each list best first; fusing them is the caller's business, so both adapters behave
alike. Filters are a small tree of conditions on payload fields, translated by each adapter
through :func:`translate`.

Collections record what produced their vectors (model name, dimension, chunker settings, library
version). Opening a collection whose model or dimension differs from the column's configuration
raises :class:`~semantic_orm.exc.CollectionMismatchError`: mixing vector spaces gives meaningless
scores, never an error, so we refuse it up front. A collection written by semantic_orm before
hybrid search (one unnamed dense vector, no ``layout`` in its metadata) is refused the same way.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol, TypeAlias, runtime_checkable

import numpy as np
import numpy.typing as npt

from ..chunking import TYPE_KEY, TYPES_KEY
from ..exc import CollectionMismatchError

__all__ = [
    "COLLECTION_LAYOUT",
    "DEFAULT_BATCH_SIZE",
    "DENSE_VECTOR",
    "SPARSE_VECTOR",
    "CollectionSpec",
    "Condition",
    "DatetimeRange",
    "Filter",
    "FilterBuilder",
    "IsNull",
    "Match",
    "MatchAny",
    "MatchExcept",
    "PayloadIndex",
    "PointPayload",
    "Range",
    "Ranking",
    "SearchRequest",
    "SparseVector",
    "Store",
    "StoreAdmin",
    "StoreHit",
    "VectorPoint",
    "VectorStore",
    "check_collection_matches",
    "point_id",
    "rows_filter",
    "translate",
]

DEFAULT_BATCH_SIZE = 256
DENSE_VECTOR: Final = "dense"
SPARSE_VECTOR: Final = "bm25"
COLLECTION_LAYOUT = "dense+bm25"
"""Recorded as ``layout`` in collection metadata; older collections have none."""
_POINT_NAMESPACE = uuid.UUID("6f1c3c9e-6a52-4b7e-9a1d-5e0d3c2b9a41")


def point_id(collection: str, pk: str, chunk_index: int) -> str:
    """Deterministic point id (a UUID string) for one chunk of one row."""
    return str(uuid.uuid5(_POINT_NAMESPACE, f"{collection}\x1f{pk}\x1f{chunk_index}"))


# -- the payload ------------------------------------------------------------------------------

META_SEPARATOR: Final = "\x1f"
"""Between a point's digests and its metadata in :attr:`PointPayload.DIGESTS_KEY`."""
_to_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode
"""Metadata as stored: keys sorted, so that metadata built in another order (from a set, say)
is stored the same, and an unchanged chunk is left alone (the sync compares payloads)."""


_PLAIN: Final = frozenset({str, int, type(None)})
"""Metadata values whose equality is their JSON's: ``1 == 1.0 == True`` encode apart."""
_PACKED_MAX = 4096
_packed: dict[tuple[tuple[str, Any], ...], str] = {}
"""Metadata packed lately, by its items (a chunker gives many chunks the same metadata:
encoding it cost more than the rest of a payload)."""


def _packed_meta(meta: Mapping[str, Any]) -> str:
    """:data:`META_SEPARATOR` and ``meta`` as JSON, keys sorted (raises what the encoder
    raises for values JSON cannot hold)."""
    items = tuple(meta.items())
    for key, value in items:
        if type(key) is not str or type(value) not in _PLAIN:  # exact types: bool is not int
            return META_SEPARATOR + _to_json(meta)  # (unhashable, or equal but encoded apart)
    packed = _packed.get(items)
    if packed is None:
        if len(_packed) >= _PACKED_MAX:
            _packed.clear()
        packed = _packed[items] = META_SEPARATOR + _to_json(meta)
    return packed


def _from_json(encoded: str) -> dict[str, Any]:
    """Metadata packed by :meth:`PointPayload.stored` (none if it does not read as such)."""
    try:
        value = json.loads(encoded)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True, slots=True)
class PointPayload:
    """What a point says about its chunk, stored as its Qdrant payload.

    The stored keys are the class attributes ``*_KEY``; :meth:`to_dict` writes them and
    :meth:`from_dict` reads them back from a hit. The values no filter reads (the chunk's and
    the row's digests, the settings' fingerprint, the analyser's version, and the chunker's
    metadata but the chunk types) are stored as one string under :attr:`DIGESTS_KEY`: a
    store's client converts each payload value on its own, and Qdrant Edge's binding spends
    ~8 µs on a string, ~14 µs on a nested object, ~2 µs on an int. The chunk types
    (:data:`~semantic_orm.chunking.TYPE_KEY`, :data:`~semantic_orm.chunking.TYPES_KEY`),
    which searches filter on, stay under :attr:`META_KEY`. The table and the column are not
    stored: a collection holds one column's points. Payloads written before (all metadata
    under :attr:`META_KEY`; before that ``hash``, ``row``, ``cfg``, ``kw``, ``table``,
    ``column`` keys) are still read; a row's next write stores the new form (its vectors are
    kept).
    """

    pk: str
    """The row's key (:func:`semantic_orm.mapping.row_key`)."""
    chunk_index: int
    start_offset: int
    """Where the chunk starts in the row's text (a ``str`` index)."""
    end_offset: int
    total_chunks: int
    chunk_hash: str
    """Digest of the chunk's text: an unchanged chunk keeps its vector."""
    config: str
    """Digest of the model and chunking that produced the vector."""
    analyzer: str
    """Version of the keyword analysis that produced the sparse vector."""
    text_hash: str = ""
    """Digest of the row's whole text, to compare the index with SQL cheaply."""
    meta: Mapping[str, Any] = field(default_factory=dict)
    """The chunker's metadata (section, paragraph...)."""
    fields: Mapping[str, Any] = field(default_factory=dict)
    """Values of the row's filter columns, stored for filtered search."""

    PK_KEY = "pk"
    CHUNK_INDEX_KEY = "chunk_index"
    START_KEY = "start_offset"
    END_KEY = "end_offset"
    TOTAL_KEY = "total_chunks"
    DIGESTS_KEY = "digests"
    """``"<chunk digest> <row digest> <fingerprint> <analyser>"``, then, if the chunk has
    metadata a filter does not read, :data:`META_SEPARATOR` and that metadata as JSON (the
    digests are hexadecimal, the analyser's id is the library's own: neither holds the
    separator, nor does JSON)."""
    META_KEY = "meta"
    """The chunk types of a tagged column (a payload index each); any metadata JSON cannot
    hold."""
    FILTERED_META = (TYPE_KEY, TYPES_KEY)
    """The metadata keys searches filter on (:meth:`meta_key`), stored under :attr:`META_KEY`."""
    FIELDS_KEY = "f"
    SEARCH_KEYS = (PK_KEY, CHUNK_INDEX_KEY, START_KEY, END_KEY, TOTAL_KEY, DIGESTS_KEY, META_KEY)
    """The keys a search reads of each hit (:attr:`SearchRequest.payload`)."""
    _LEGACY_DIGEST_KEYS = ("hash", "row", "cfg", "kw")
    """Where payloads written before :attr:`DIGESTS_KEY` keep the same four values."""

    def to_dict(self) -> dict[str, Any]:
        """The payload as stored (empty ``meta`` and ``fields`` are omitted)."""
        return self.stored(
            self.pk,
            self.chunk_index,
            self.start_offset,
            self.end_offset,
            self.total_chunks,
            self.pack(self.chunk_hash, self.text_hash, self.config, self.analyzer),
            self.meta,
            self.fields,
        )

    @staticmethod
    def pack(chunk_hash: str, text_hash: str, config: str, analyzer: str) -> str:
        """The stored value of :attr:`DIGESTS_KEY`."""
        return f"{chunk_hash} {text_hash} {config} {analyzer}"

    @classmethod
    def stored(
        cls,
        pk: str,
        chunk_index: int,
        start_offset: int,
        end_offset: int,
        total_chunks: int,
        digests: str,
        meta: Mapping[str, Any],
        fields: Mapping[str, Any],
    ) -> dict[str, Any]:
        """What :meth:`to_dict` returns, from the values (``digests`` from :meth:`pack`)
        without building the object first: the sync writes one payload per chunk."""
        out: dict[str, Any] = {
            cls.PK_KEY: pk,
            cls.CHUNK_INDEX_KEY: chunk_index,
            cls.START_KEY: start_offset,
            cls.END_KEY: end_offset,
            cls.TOTAL_KEY: total_chunks,
            cls.DIGESTS_KEY: digests,
        }
        if meta:
            if TYPE_KEY in meta or TYPES_KEY in meta:
                nested = {key: meta[key] for key in cls.FILTERED_META if key in meta}
                rest: Mapping[str, Any] = {
                    key: value for key, value in meta.items() if key not in nested
                }
            else:
                nested, rest = {}, meta if type(meta) is dict else dict(meta)
            if rest:
                try:
                    out[cls.DIGESTS_KEY] = digests + _packed_meta(rest)
                except (TypeError, ValueError, RecursionError):  # values JSON cannot hold:
                    # stored as they are (the store says what it makes of them)
                    nested = dict(meta)
            if nested:
                out[cls.META_KEY] = nested
        if fields:
            out[cls.FIELDS_KEY] = dict(fields)
        return out

    @classmethod
    def meta_of(cls, raw: Mapping[str, Any]) -> dict[str, Any]:
        """The chunk metadata of a stored payload: packed with the digests, the chunk types
        nested (or all of it nested, as written before)."""
        meta = dict(raw.get(cls.META_KEY) or {})
        packed = raw.get(cls.DIGESTS_KEY)
        if packed is not None:
            encoded = str(packed).partition(META_SEPARATOR)[2]
            if encoded:
                meta = {**_from_json(encoded), **meta}
        return meta

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], *, meta: bool = True) -> PointPayload:
        """Read a stored payload (keys a point written by an older version lacks default).

        ``meta=False`` leaves the chunk metadata out (empty), unread: a search ranks many
        candidates and reads the metadata of those it returns (:meth:`meta_of`).
        """
        get = raw.get  # a search reads one per candidate
        packed = get(cls.DIGESTS_KEY)
        if packed is not None:
            digests = str(packed).partition(META_SEPARATOR)[0].split(" ", 3)
            digests += [""] * (4 - len(digests))
        else:
            digests = [str(get(key, "")) for key in cls._LEGACY_DIGEST_KEYS]
        chunk_hash, text_hash, config, analyzer = digests
        return cls(
            pk=str(get(cls.PK_KEY, "")),
            chunk_index=int(get(cls.CHUNK_INDEX_KEY, 0)),
            start_offset=int(get(cls.START_KEY, 0)),
            end_offset=int(get(cls.END_KEY, 0)),
            total_chunks=int(get(cls.TOTAL_KEY, 0)),
            chunk_hash=chunk_hash,
            config=config,
            analyzer=analyzer,
            text_hash=text_hash,
            meta=cls.meta_of(raw) if meta else {},
            fields=dict(get(cls.FIELDS_KEY) or {}),
        )

    @classmethod
    def field_key(cls, name: str) -> str:
        """The payload path of filter column ``name`` (``"f.tenant_id"``)."""
        return f"{cls.FIELDS_KEY}.{name}"

    @classmethod
    def meta_key(cls, name: str) -> str:
        """The payload path of chunk metadata key ``name`` (``"meta.type"``)."""
        return f"{cls.META_KEY}.{name}"


@dataclass(frozen=True, slots=True)
class PayloadIndex:
    """A payload field to index: ``kind`` is ``keyword``, ``integer``, ``float``, ``bool`` or
    ``datetime``; ``tenant`` marks the field that partitions the collection by tenant."""

    key: str
    kind: str
    tenant: bool = False


@dataclass(frozen=True, slots=True)
class CollectionSpec:
    """What a collection must hold: vectors of ``dimension`` from ``model``.

    ``metadata`` is recorded with the collection when it is created (chunker settings, library
    version); only ``model`` and ``dimension`` are checked when it is opened again. ``indexes``
    are the payload fields to index (the row key always is).
    """

    name: str
    dimension: int
    model: str
    metadata: Mapping[str, Any] = field(default_factory=dict)
    indexes: tuple[PayloadIndex, ...] = ()

    def record(self) -> dict[str, Any]:
        """The metadata stored with the collection."""
        return {
            **self.metadata,
            "model": self.model,
            "dimension": self.dimension,
            "layout": COLLECTION_LAYOUT,
        }

    def payload_indexes(self, first_chunks: bool = True) -> tuple[PayloadIndex, ...]:
        """The row key's index, the chunk number's (``first_chunks``: reconcile's sweep reads
        the points with ``chunk_index == 0``), then the declared ones."""
        return (
            PayloadIndex(PointPayload.PK_KEY, "keyword"),
            *([PayloadIndex(PointPayload.CHUNK_INDEX_KEY, "integer")] if first_chunks else []),
            *self.indexes,
        )


# -- points and hits --------------------------------------------------------------------------


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
    """A point returned by a store: its id, score, payload and (if asked) its vectors."""

    id: str
    score: float
    payload: Mapping[str, Any]
    vector: npt.NDArray[np.float32] | None = None
    sparse: SparseVector | None = None
    """Its keyword vector, when a keyword ranking asked for it (``Ranking.with_vector``)."""


# -- filters ------------------------------------------------------------------------------------

Scalar: TypeAlias = str | int | bool


@dataclass(frozen=True, slots=True)
class Match:
    """``key == value``."""

    key: str
    value: Scalar


@dataclass(frozen=True, slots=True)
class MatchAny:
    """``key`` is one of ``values``."""

    key: str
    values: tuple[Scalar, ...]


@dataclass(frozen=True, slots=True)
class MatchExcept:
    """``key`` is none of ``values`` (points without the key do not match)."""

    key: str
    values: tuple[Scalar, ...]


@dataclass(frozen=True, slots=True)
class Range:
    """A numeric range on ``key``; unset bounds are open."""

    key: str
    gt: float | None = None
    gte: float | None = None
    lt: float | None = None
    lte: float | None = None


@dataclass(frozen=True, slots=True)
class DatetimeRange:
    """A datetime range on ``key`` (values stored as ISO 8601 strings)."""

    key: str
    gt: dt.datetime | None = None
    gte: dt.datetime | None = None
    lt: dt.datetime | None = None
    lte: dt.datetime | None = None


@dataclass(frozen=True, slots=True)
class IsNull:
    """``key`` is null or missing."""

    key: str


@dataclass(frozen=True, slots=True)
class Filter:
    """All of ``must``, at least one of ``should`` (when given), none of ``must_not``."""

    must: tuple[Condition, ...] = ()
    should: tuple[Condition, ...] = ()
    must_not: tuple[Condition, ...] = ()


Condition: TypeAlias = Match | MatchAny | MatchExcept | Range | DatetimeRange | IsNull | Filter


class FilterBuilder(Protocol):
    """An adapter's constructors for its native filter objects (see :func:`translate`)."""

    def match(self, key: str, value: Scalar) -> Any:
        """``key == value``."""
        ...

    def match_any(self, key: str, values: list[Any]) -> Any:
        """``key`` in ``values``."""
        ...

    def match_except(self, key: str, values: list[Any]) -> Any:
        """``key`` not in ``values``."""
        ...

    def range(self, key: str, bounds: dict[str, float]) -> Any:
        """A numeric range; ``bounds`` holds ``gt``/``gte``/``lt``/``lte``."""
        ...

    def datetime_range(self, key: str, bounds: dict[str, str]) -> Any:
        """A datetime range; ``bounds`` values are ISO 8601 strings."""
        ...

    def is_null(self, key: str) -> Any:
        """``key`` is null or missing."""
        ...

    def filter(self, must: list[Any], should: list[Any], must_not: list[Any]) -> Any:
        """A boolean combination."""
        ...


def _bounds(cond: Range | DatetimeRange) -> dict[str, Any]:
    return {
        name: value
        for name in ("gt", "gte", "lt", "lte")
        if (value := getattr(cond, name)) is not None
    }


def translate(cond: Condition, builder: FilterBuilder) -> Any:
    """Build an adapter's native filter for ``cond`` with ``builder``'s constructors."""
    if isinstance(cond, Filter):
        return builder.filter(
            [translate(c, builder) for c in cond.must],
            [translate(c, builder) for c in cond.should],
            [translate(c, builder) for c in cond.must_not],
        )
    if isinstance(cond, Match):
        return builder.match(cond.key, cond.value)
    if isinstance(cond, MatchAny):
        return builder.match_any(cond.key, list(cond.values))
    if isinstance(cond, MatchExcept):
        return builder.match_except(cond.key, list(cond.values))
    if isinstance(cond, Range):
        return builder.range(cond.key, _bounds(cond))
    if isinstance(cond, DatetimeRange):
        return builder.datetime_range(
            cond.key, {k: v.isoformat() for k, v in _bounds(cond).items()}
        )
    if isinstance(cond, IsNull):
        return builder.is_null(cond.key)
    raise TypeError(f"not a filter condition: {cond!r}")


def rows_filter(rows: Sequence[tuple[str, int]]) -> Filter:
    """Points of rows ``(pk, from_index)`` whose chunk index is at least ``from_index``."""
    pk, index = PointPayload.PK_KEY, PointPayload.CHUNK_INDEX_KEY
    whole = tuple(key for key, start in rows if start <= 0)
    should: list[Condition] = [MatchAny(pk, whole)] if whole else []
    should.extend(
        Filter(must=(Match(pk, key), Range(index, gte=start))) for key, start in rows if start > 0
    )
    return Filter(should=tuple(should))


# -- the query plan -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ranking:
    """One ranked list for a store to return: the best ``limit`` points after ``offset``.

    ``using`` is :data:`DENSE_VECTOR` (``vector`` is the query embedding, scores are cosines)
    or :data:`SPARSE_VECTOR` (``vector`` is a :class:`SparseVector`, scores are BM25). Points
    scoring below ``threshold`` are left out. With ``with_vector`` each hit also carries its own
    vector of this ranking (:attr:`StoreHit.vector` or :attr:`StoreHit.sparse`).
    """

    using: Literal["dense", "bm25"]
    vector: npt.NDArray[np.float32] | SparseVector
    limit: int
    offset: int = 0
    threshold: float | None = None
    with_vector: bool = False


@dataclass(frozen=True, slots=True)
class SearchRequest:
    """What a search asks a store for: each ranking, under the same optional filter.

    ``payload`` names the payload keys each hit carries (``None``: all of them, ``()``: none);
    reading a point's payload is most of what a filtered query costs, so a search asks only for
    what it uses.
    """

    rankings: tuple[Ranking, ...]
    filter: Filter | None = None
    payload: tuple[str, ...] | None = None


# -- the protocols ------------------------------------------------------------------------------


@runtime_checkable
class VectorStore(Protocol):
    """The hot path: what syncing and searching need from a vector database."""

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

    def existing(self, collection: str, pks: Sequence[str]) -> list[StoreHit]:
        """The points of rows ``pks``, with payloads and vectors (for incremental updates)."""
        ...

    def query(self, collection: str, request: SearchRequest) -> list[list[StoreHit]]:
        """Each of the request's rankings, best first (empty lists for a missing collection).

        Ties keep the store's order; callers that need a total order sort by payload.
        """
        ...


@runtime_checkable
class StoreAdmin(Protocol):
    """Administration: what maintenance tools need from a vector database."""

    def collection_info(self, collection: str) -> dict[str, Any] | None:
        """The metadata recorded when the collection was created; ``None`` if it is missing."""
        ...

    def list_collections(self) -> list[str]:
        """Names of the collections (as searched: aliases rather than what they point to)."""
        ...

    def count(self, collection: str) -> int:
        """Number of points in the collection (0 if it does not exist)."""
        ...

    def scroll(
        self,
        collection: str,
        *,
        offset: Any = None,
        limit: int = 1000,
        vectors: bool = False,
        where: Filter | None = None,
    ) -> tuple[list[StoreHit], Any]:
        """One page of points (matching ``where``) in id order, and the next page's offset
        (``None`` after the last page)."""
        ...

    def points(self, collection: str, pk: str | None = None) -> list[StoreHit]:
        """Every point of the collection, or of one row; score is 0. For tests and tools."""
        ...

    def update_metadata(self, collection: str, changes: dict[str, Any]) -> None:
        """Merge ``changes`` into the metadata recorded with the collection."""
        ...

    def index_state(self, collection: str) -> dict[str, int]:
        """``points``, ``indexed`` (in a built vector index) and ``segments``."""
        ...

    def optimize(self, collection: str) -> None:
        """Build the collection's vector index now (a server does it by itself: no-op)."""
        ...

    def drop_collection(self, collection: str) -> None:
        """Delete the collection and its points, if it exists."""
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


@runtime_checkable
class Store(VectorStore, StoreAdmin, Protocol):
    """A complete store: the hot path and administration (what an index is given)."""


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
