"""Semantic search over mapped classes: ``Model.semantic_search(session, "query")``.

A search reads as a straight line:

1. **resolve** the column's binding (:mod:`semantic_orm.binding`) and check its collection;
2. **plan** the query: normalise it as the column's chunks were (:mod:`semantic_orm.normalizing`),
   embed it the embedder's query way (``encode_query``, unless ``query_vector=`` is given),
   compute its keyword vector with the column's analyser and the IDF of its terms (one batched
   store request under the search's store filter: the keyword scale), and ask the store for
   the rankings of the mode
   (:class:`~semantic_orm.stores.base.SearchRequest`);
3. **rank**: turn the store's lists into one deterministic order, tier by tier
   (:mod:`semantic_orm.ranking`), fusing dense and keyword rankings in hybrid mode;
4. **load** the matching rows with SQL ``SELECT ... WHERE pk IN (...)`` plus your ``where=``
   criteria, in waves, only for the rows the ranking needs next. When every column ``where=``
   touches travels in the payload (``SemanticText(filter_by=...)``), the criteria are also
   compiled into the store's filter (:mod:`semantic_orm.filtering`), so the ranking holds only
   matching rows; otherwise the ranking is read down until enough rows pass;
5. **assemble** the hits: rows (or passages) in rank order, each with the chunk(s) that matched,
   cut from the row's current text at the stored offsets.

::

    for hit in KnowledgeArticle.semantic_search(session, "chart of accounts", limit=5):
        hit.obj                 # the KnowledgeArticle
        hit.score               # the score of its best chunk
        hit.chunk.start_offset  # where that chunk starts in hit.obj.content
        hit.highlight()         # the passage, marked inside its context

By default results are grouped by row (``group_by="row"``): a long document's overlapping
chunks count once, and ``hit.chunks`` lists its best few. ``group_by="chunk"`` returns passages
instead, one hit per chunk; a chunk that overlaps a better chunk of the same row by more than half
its length is skipped, so near-duplicate windows do not fill the top-k. Rows that are gone from
SQL, that ``where=`` rejects, or whose text changed since their points were written (their sync is
pending) are skipped, and the search goes on down the ranking until ``limit`` hits are found or
the collection is exhausted.

``dedupe="paragraph"`` (or ``"section"``) keeps at most one passage per paragraph (or section) of
a row, in both groupings. On a column declared with ``SemanticText(tags=True)``,
``chunk_types=`` keeps the chunks that contain a passage of one of the given structure types
(title, verse, boilerplate, text; :mod:`semantic_orm.chunking.structure`) and
``exclude_chunk_types=`` drops those that are mostly of them, inside the store.

Three ranking modes (``mode=``):

* ``"dense"``: cosine similarity of embeddings; ``hit.score`` is the cosine. Finds paraphrases.
* ``"keyword"``: BM25 over the words of each chunk (:mod:`semantic_orm.keywords`); finds exact
  codes, names and rare terms that embeddings blur. ``hit.score`` is the share of the query's
  keyword evidence the chunk holds: its BM25 score over that of a chunk holding every query
  term at saturation among the rows the search may return (the IDF comes from the store, one
  batched request per query), 0 to 1.
* ``"hybrid"`` (the default, :data:`DEFAULT_MODE`): both rankings fused
  (:mod:`semantic_orm.ranking`, :class:`~semantic_orm.ranking.ScoreFusion` by default): a
  weighted sum of the cosine and the keyword share, the dense half weighted by how much of the
  query the model reads (:meth:`SentenceTransformerEmbedder.coverage`), so a model that cannot
  read the query's language does not pull a good keyword ranking down. ``hit.scores`` has each
  ranking's own score.

``score_threshold`` drops hits whose ``hit.score`` is below it; the score is on a fixed
``[-1, 1]`` scale in every mode, the same for every query.

Ranking is deterministic: equal scores are ordered by primary key, then chunk index, and
``offset=`` pages concatenate exactly to one search with the combined limit.

``rerank=`` adds a second, finer stage (:mod:`semantic_orm.rerank`): the first
``rerank_window`` hits (50 by default) are reordered by a reranker that reads the query and each
hit's chunk together, such as a cross-encoder. The window does not depend on ``offset``/``limit``,
so pages still concatenate to one search; ``hit.rerank_score`` holds the reranker's score and
``hit.score`` stays the first-stage score (see :func:`semantic_search`).

``semantic_search(session, [Article, Note], ...)`` searches several models at once: each
model's hits are ranked as in its own search and merged by score (scores mean the same in
every collection), and ``hit.model`` says which model each hit is from.

:func:`asemantic_search` (and ``await Model.asemantic_search(session, ...)``) is the same search
for an ``AsyncSession``: the embedding and the store calls run in worker threads, the SQL through
the session, so the event loop is never blocked.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import threading
import time
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Literal, Self, TypedDict, TypeVar, Unpack, overload

import numpy as np
import numpy.typing as npt
import regex
from sqlalchemy import ColumnElement, inspect
from sqlalchemy.orm import Mapper, Session, scoped_session

from . import keywords, signals
from .applying import text_hash
from .binding import ColumnBinding
from .chunking import CHUNK_TYPES, TYPE_KEY, TYPES_KEY, Chunk
from .embedding import encode_queries
from .exc import ConfigurationError, FilterFallbackWarning
from .filtering import compile_where
from .index import SemanticIndex, index_for, is_async_session
from .mapping import SemanticColumn, instance_key, select_rows, semantic_columns
from .ranking import DEFAULT_FUSION, Candidate, Fusion, complete, fuse_tier, order, pk_order
from .rerank import Reranker, rerank_scores
from .schemas import database_of, identified
from .stores.base import (
    DENSE_VECTOR,
    SPARSE_VECTOR,
    Filter,
    MatchAny,
    PointPayload,
    Ranking,
    SearchRequest,
    SparseVector,
    StoreHit,
)

__all__ = [
    "DEFAULT_MODE",
    "DEFAULT_RERANK_WINDOW",
    "SEARCH_MODES",
    "ScoredChunk",
    "SearchHit",
    "SearchOptions",
    "SemanticSearchMixin",
    "asemantic_search",
    "pick_column",
    "semantic_search",
]

SearchMode = Literal["hybrid", "dense", "keyword"]
DEFAULT_MODE: SearchMode = "hybrid"
"""The mode ``semantic_search`` uses when none is given (see the module docstring)."""
SEARCH_MODES: tuple[SearchMode, ...] = ("hybrid", "dense", "keyword")
MAX_LIMIT = 10_000
"""Most hits one search returns."""
MAX_OFFSET = 100_000
"""Deepest page start."""
MAX_DEPTH = 1_000_000
"""Deepest a ranking is read (chunks)."""
DEFAULT_CANDIDATES = 100
DEFAULT_RERANK_WINDOW = 50
"""First-stage hits a reranker reorders when ``rerank_window`` is not given."""
MAX_RERANK_WINDOW = 1_000
_RERANK_KEYS = ("rerank", "rerank_window")
SCAN_WARNING_ROWS = 1_000
"""Rows a where= in SQL may load before :class:`FilterFallbackWarning` says so."""
log = logging.getLogger("semantic_orm")

T = TypeVar("T")
R = TypeVar("R")
AnySession = Session | scoped_session[Any]
"""What a synchronous search loads rows with: a ``Session``, or a ``scoped_session`` (such as
Flask-SQLAlchemy's ``db.session``)."""


class SearchOptions(TypedDict, total=False):
    """The options of :func:`semantic_search`, the mixin's method and :func:`evaluate`.

    Attributes:
        limit: Hits to return (rows, or chunks with ``group_by="chunk"``); 1 to 10,000.
        offset: Hits to skip first, for pagination (page ``n`` is ``offset=n * limit``).
        where: SQL criteria the rows must also meet, e.g. ``Article.lang == "fr"`` (run inside
            the vector store when its columns are in the column's ``filter_by``); over several
            models, ``{Model: criteria}``.
        group_by: ``"row"`` (one hit per row, the default) or ``"chunk"`` (one per passage).
        mode: ``"hybrid"`` (default), ``"dense"`` or ``"keyword"``; see the module docstring.
        column: The semantic attribute to search, if the model has several (over several
            models, ``{Model: name}``).
        score_threshold: Drop hits whose ``hit.score`` is below this. The score is in
            ``[-1, 1]`` in every mode: the cosine in dense mode, the share of the query's
            keyword weight a chunk matches in keyword mode, their weighted sum in hybrid mode
            (:class:`~semantic_orm.ranking.ScoreFusion`).
        chunks_per_row: In row mode, how many of a row's best chunks ``hit.chunks`` keeps.
        candidates: Ranks of each list fused per tier (the fusion window, default 100).
        fusion: How hybrid mode combines its two rankings (default
            :class:`~semantic_orm.ranking.ScoreFusion`; or ``ReciprocalRankFusion()``).
        index: The index to use, instead of the one installed on the session.
        query_vector: The column's embedding of the query, when it is already computed (e.g.
            many queries encoded in one batch); ``query`` still feeds keyword search.
        rerank: A :class:`~semantic_orm.rerank.Reranker` that reorders the first
            ``rerank_window`` hits; ``None`` (the default) uses the index's ``reranker=`` if it
            has one, ``False`` turns reranking off.
        rerank_window: First-stage hits the reranker reorders (1 to 1,000, default 50); hits
            past it follow in first-stage order.
        chunk_types: Only chunks containing a passage of one of these types (``"title"``,
            ``"verse"``, ``"boilerplate"``, ``"text"``; their ``types`` metadata): a couplet
            inside a stretch of narration is found with ``"verse"``. For a column declared
            with ``SemanticText(tags=True)``; applied inside the vector store.
        exclude_chunk_types: No chunks made mostly of these types (their ``type``), e.g.
            ``("boilerplate", "title")`` (same requirement).
        dedupe: ``"section"`` or ``"paragraph"``: at most one passage per section (or
            paragraph) of a row, the best ranked; in row mode it also applies to
            ``hit.chunks``. Reads the chunks' ``section_index``/``paragraph`` metadata, so the
            column's chunker must be ``"hybrid"`` or tagged (``tags=True``).
    """

    limit: int
    offset: int
    where: ColumnElement[bool] | Mapping[type[Any], ColumnElement[bool]] | None
    group_by: Literal["row", "chunk"]
    mode: SearchMode
    column: str | Mapping[type[Any], str] | None
    score_threshold: float | None
    chunks_per_row: int
    candidates: int
    fusion: Fusion | None
    index: SemanticIndex | None
    query_vector: Sequence[float] | npt.NDArray[np.float32] | None
    rerank: Reranker | Literal[False] | None
    rerank_window: int
    chunk_types: str | Sequence[str] | None
    exclude_chunk_types: str | Sequence[str] | None
    dedupe: Literal["section", "paragraph"] | None


@dataclass(frozen=True, slots=True)
class _Options:
    limit: int = 5
    offset: int = 0
    where: ColumnElement[bool] | None = None
    group_by: Literal["row", "chunk"] = "row"
    mode: SearchMode = DEFAULT_MODE
    column: str | None = None
    score_threshold: float | None = None
    chunks_per_row: int = 3
    candidates: int = DEFAULT_CANDIDATES
    fusion: Fusion | None = None
    index: SemanticIndex | None = None
    query_vector: Any = None
    chunk_types: Any = None
    exclude_chunk_types: Any = None
    dedupe: Literal["section", "paragraph"] | None = None

    @classmethod
    def read(cls, options: Mapping[str, Any]) -> _Options:
        unknown = sorted(options.keys() - _KNOWN_OPTIONS)
        if unknown:
            known = (*cls.__dataclass_fields__, *_RERANK_KEYS)
            raise ConfigurationError(
                f"semantic_search got unknown option(s) {', '.join(unknown)}; known: "
                f"{', '.join(known)}"
            )
        made = cls(**{k: v for k, v in options.items() if k not in _RERANK_KEYS})
        made.check()
        return made

    def check(self) -> None:
        _integer("limit", self.limit, 1, MAX_LIMIT)
        _integer("offset", self.offset, 0, MAX_OFFSET)
        _integer("chunks_per_row", self.chunks_per_row, 1, 10_000)
        _integer("candidates", self.candidates, 1, 100_000)
        if self.mode not in SEARCH_MODES:
            raise ConfigurationError(
                f"semantic_search mode must be one of {', '.join(SEARCH_MODES)}, got {self.mode!r}"
            )
        if self.group_by not in ("row", "chunk"):
            raise ConfigurationError(
                f"semantic_search group_by must be 'row' or 'chunk', got {self.group_by!r}"
            )
        t = self.score_threshold
        if t is not None and (
            isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t)
        ):
            raise ConfigurationError(
                f"semantic_search score_threshold must be a finite number or None, got {t!r}"
            )
        f = self.fusion
        if f is not None and not all(
            callable(getattr(f, name, None)) for name in ("for_query", "score", "bound")
        ):
            raise ConfigurationError(
                "semantic_search fusion must be a Fusion (ScoreFusion(), ReciprocalRankFusion()),"
                f" got {type(f).__name__}"
            )
        if self.index is not None and not isinstance(self.index, SemanticIndex):
            raise ConfigurationError(
                f"semantic_search index must be a SemanticIndex, got {type(self.index).__name__}"
            )
        _chunk_types("chunk_types", self.chunk_types)
        _chunk_types("exclude_chunk_types", self.exclude_chunk_types)
        if self.dedupe not in (None, "section", "paragraph"):
            raise ConfigurationError(
                "semantic_search dedupe must be 'section', 'paragraph' or None, "
                f"got {self.dedupe!r}"
            )


_KNOWN_OPTIONS = frozenset((*_Options.__dataclass_fields__, *_RERANK_KEYS))
"""What :meth:`_Options.read` accepts (the rerank stage reads the rerank keys)."""


def _chunk_types(name: str, value: Any) -> tuple[str, ...]:
    """``chunk_types=`` / ``exclude_chunk_types=`` as a tuple of known type names."""
    if value is None:
        return ()
    names = (value,) if isinstance(value, str) else value
    if not isinstance(names, (tuple, list, set, frozenset)) or not names:
        raise ConfigurationError(
            f"semantic_search {name} takes chunk type names, e.g. ('text', 'verse'), got {value!r}"
        )
    unknown = sorted(str(n) for n in names if n not in CHUNK_TYPES)
    if unknown:
        raise ConfigurationError(
            f"semantic_search {name} has unknown chunk type(s) {', '.join(unknown)}; known: "
            f"{', '.join(CHUNK_TYPES)}"
        )
    return tuple(sorted(names))


def _check_structure(opts: _Options, binding: ColumnBinding) -> None:
    """Refuse structure options the column's chunks cannot answer."""
    if opts.chunk_types is None and opts.exclude_chunk_types is None and opts.dedupe is None:
        return
    config = binding.chunker.config()
    for name in ("chunk_types", "exclude_chunk_types"):
        if getattr(opts, name) is not None and "tags" not in config:
            raise ConfigurationError(
                f"semantic_search {name}= needs chunk types, but {binding.label} is not tagged: "
                "declare it with SemanticText(..., tags=True) and rebuild its index"
            )
    if opts.dedupe is not None and "tags" not in config and config.get("strategy") != "hybrid":
        raise ConfigurationError(
            f"semantic_search dedupe={opts.dedupe!r} needs section/paragraph metadata, which the "
            f"{config.get('strategy')!r} chunker of {binding.label} does not write: use "
            "SemanticText(chunker='hybrid') or SemanticText(..., tags=True)"
        )


def _typed(flt: Filter | None, opts: _Options) -> Filter | None:
    """The store filter, plus the ``chunk_types=`` / ``exclude_chunk_types=`` clauses."""
    key = PointPayload.meta_key(TYPE_KEY)
    must: tuple[Filter, ...] = ()
    if opts.chunk_types:
        wanted = _chunk_types("", opts.chunk_types)
        # points tagged before ``types`` existed carry only their main type
        present = MatchAny(PointPayload.meta_key(TYPES_KEY), wanted)
        must = (Filter(should=(present, MatchAny(key, wanted))),)
    must_not = (
        (MatchAny(key, _chunk_types("", opts.exclude_chunk_types)),)
        if opts.exclude_chunk_types
        else ()
    )
    if not must and not must_not:
        return flt
    return Filter(must=(*((flt,) if flt is not None else ()), *must), must_not=must_not)


def _same_unit(chunk: Chunk, chosen: Sequence[Chunk], dedupe: str | None) -> bool:
    """Whether ``dedupe=`` makes ``chunk`` a duplicate of one of ``chosen`` (same row)."""
    if dedupe is None:
        return False
    key = _unit(chunk, dedupe)
    return key is not None and any(_unit(other, dedupe) == key for other in chosen)


def _unit(chunk: Chunk, dedupe: str) -> tuple[Any, ...] | None:
    """The section (or section and paragraph) a chunk starts in; ``None`` if not recorded."""
    meta = chunk.metadata
    if "section_index" not in meta or (dedupe == "paragraph" and "paragraph" not in meta):
        return None
    return (
        (meta["section_index"], meta.get("paragraph"))
        if dedupe == "paragraph"
        else (meta["section_index"],)
    )


def _integer(name: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(
            f"semantic_search {name} must be an int, got {type(value).__name__}: {value!r}"
        )
    if value < low:
        bound = "> 0" if low == 1 else f">= {low}"
        raise ConfigurationError(f"semantic_search {name} must be {bound}, got {value}")
    if value > high:
        raise ConfigurationError(f"semantic_search {name} must be <= {high:,}, got {value:,}")


@dataclass(frozen=True, slots=True)
class ScoredChunk:
    """A matched chunk, its score, and the score of each ranking that found it."""

    chunk: Chunk
    score: float
    scores: Mapping[str, float] = field(default_factory=dict)
    """Its score in each ranking that found it: ``"dense"`` (cosine), ``"keyword"`` (raw BM25)
    and ``"keyword_share"`` (BM25 over the query's attainable maximum, 0 to 1); in hybrid mode
    also ``"fused"`` (equal to :attr:`score`)."""
    stale: bool = False
    """The row's text as the search loaded it no longer holds the chunk that was indexed (the
    row changed and its sync is pending, or the session holds an older copy of it): :attr:`chunk`
    is that text at the chunk's indexed offsets, not the passage that matched."""


@dataclass(frozen=True, slots=True)
class SearchHit(Generic[T]):
    """One search result: the row, its score, and the chunk(s) that matched, best first."""

    obj: T
    score: float
    chunks: tuple[ScoredChunk, ...]
    text: str
    """The row's full semantic text, which the chunks' offsets index into."""
    rerank_score: float | None = None
    """The reranker's score, for hits a ``rerank=`` search reordered (``None`` otherwise)."""

    @property
    def model(self) -> type[Any]:
        """The mapped class of :attr:`obj` (which model matched, in a search over several)."""
        return type(self.obj)

    @property
    def chunk(self) -> Chunk:
        """The best matching chunk."""
        return self.chunks[0].chunk

    @property
    def scores(self) -> Mapping[str, float]:
        """The best chunk's score in each ranking (see :attr:`ScoredChunk.scores`)."""
        return self.chunks[0].scores

    @property
    def stale(self) -> bool:
        """Whether the best chunk's passage is not what matched (see
        :attr:`ScoredChunk.stale`)."""
        return self.chunks[0].stale

    def highlight(self, before: str = "**", after: str = "**", context: int = 80) -> str:
        """The best chunk marked with ``before``/``after``, with ``context`` characters around.

        The passage comes from the row's text at the chunk's offsets, so this is exactly what
        was embedded (unless :attr:`stale`).
        """
        chunk = self.chunk
        source = self.text
        lo, hi = _context_bounds(source, chunk.start_offset, chunk.end_offset, context)
        lead = source[lo : chunk.start_offset]
        tail = source[chunk.end_offset : hi]
        ellipsis_lead = "…" if lo > 0 else ""
        ellipsis_tail = "…" if hi < len(source) else ""
        return f"{ellipsis_lead}{lead}{before}{chunk.text}{after}{tail}{ellipsis_tail}"


_GRAPHEME_RE = regex.compile(r"\X")
_CLUSTER_LOOK = 32
"""How far past a context's edge its grapheme is looked for (an emoji sequence is shorter)."""


def _context_bounds(source: str, start: int, end: int, context: int) -> tuple[int, int]:
    """Up to ``context`` characters on each side of ``source[start:end]``, without cutting a
    grapheme at either edge (a flag, an emoji joined by U+200D, a letter with its marks)."""
    lo = max(0, start - context)
    if lo > 0:
        base = max(0, lo - _CLUSTER_LOOK)
        lo = next(
            (m.start() for m in _GRAPHEME_RE.finditer(source, base, start) if m.start() >= lo),
            start,
        )
    hi = min(len(source), end + context)
    if hi < len(source):
        cut = end
        for m in _GRAPHEME_RE.finditer(source, end, min(len(source), hi + _CLUSTER_LOOK)):
            if m.end() > hi:
                break
            cut = m.end()
        hi = cut
    return lo, hi


def pick_column(mapper: Mapper[Any], name: str | None) -> SemanticColumn:
    """The semantic column ``name`` of ``mapper`` (or its only one).

    Raises:
        ConfigurationError: The class has none, several and ``name`` is not given, or no such.
    """
    columns = semantic_columns(mapper)
    if not columns:
        raise ConfigurationError(f"{mapper.class_.__name__} has no SemanticText column")
    if name is None:
        if len(columns) > 1:
            raise ConfigurationError(
                f"{mapper.class_.__name__} has several SemanticText columns "
                f"({', '.join(c.key for c in columns)}): pass column=..."
            )
        return columns[0]
    for col in columns:
        if col.key == name or col.column.name == name:
            return col
    raise ConfigurationError(
        f"{mapper.class_.__name__}.{name} is not a SemanticText column "
        f"(semantic columns: {', '.join(c.key for c in columns)})"
    )


# -- the steps of a search, independent of how they are run --------------------------------------


@dataclass(frozen=True, slots=True)
class _Embed:
    """Embed a query (``vector``) and measure how much of it the model reads (``coverage``),
    both where the model runs (a worker thread, for an async search: a model's tokenizer may
    wait on a sync's encode); the result is ``(vector or None, coverage or None)``."""

    binding: ColumnBinding
    text: str
    vector: bool = True
    coverage: bool = False


@dataclass(frozen=True, slots=True)
class _Query:
    collection: str
    request: SearchRequest


@dataclass(frozen=True, slots=True)
class _Load:
    statement: Any
    params: Mapping[str, Any]


_Step = _Embed | _Query | _Load


@dataclass(slots=True)
class _List:
    """One ranking as fetched so far: its tie-complete prefix, and whether it is exhausted."""

    ranking: Ranking
    hits: list[StoreHit] = field(default_factory=list)
    exhausted: bool = False


def _fetch(
    lists: Mapping[str, _List], collection: str, upto: int, flt: Any
) -> Generator[_Step, Any, None]:
    """Fetch every list tie-complete at least to rank ``upto`` (or to its end).

    When the cut falls inside a group of equal scores, the next request asks for every point
    scoring at least that score (a score threshold, no fixed depth): one more request whatever
    the group's size, instead of doubling the depth through a run of ties.
    """
    want = dict.fromkeys(lists, upto)
    floor: dict[str, float] = {}
    while True:
        short = {
            n: lst for n, lst in lists.items() if not lst.exhausted and len(lst.hits) < want[n]
        }
        if not short:
            return
        depth = {n: min(max(want[n], 2 * len(lst.hits)), MAX_DEPTH) for n, lst in short.items()}
        rankings = tuple(
            Ranking(
                lst.ranking.using, lst.ranking.vector, depth[n] + 1, threshold=lst.ranking.threshold
            )
            if n not in floor
            else Ranking(lst.ranking.using, lst.ranking.vector, MAX_DEPTH, threshold=floor[n])
            for n, lst in short.items()
        )
        found = yield _Query(
            collection, SearchRequest(rankings, flt, payload=PointPayload.SEARCH_KEYS)
        )
        for (n, lst), hits in zip(short.items(), found, strict=True):
            if n in floor:  # every point down to the tied score: complete by construction
                del floor[n]
                lst.hits = order(hits)
                lst.exhausted = len(hits) >= MAX_DEPTH
                want[n] = min(want[n], len(lst.hits))
                continue
            prefix, exhausted = complete(hits, depth[n])
            if prefix or exhausted:
                lst.hits, lst.exhausted = prefix, exhausted or depth[n] >= MAX_DEPTH
            elif depth[n] >= MAX_DEPTH:  # one huge tie: take the cut as it comes
                lst.hits, lst.exhausted = order(hits)[: depth[n]], True
            else:  # a tie straddles the cut: next, everything down to the tied score
                tied = order(hits)[depth[n]].score
                own = lst.ranking.threshold
                floor[n] = max(
                    tied - abs(tied) * 1e-6 - 1e-9, own if own is not None else -math.inf
                )


def _rankings(
    vector: npt.NDArray[np.float32] | None,
    sparse: SparseVector | None,
    keyword_max: float,
    opts: _Options,
) -> dict[str, _List]:
    """The ranked lists the mode needs. A query without keyword terms has an empty keyword
    list: none in keyword mode; in hybrid mode an ended one, so that its scores are still
    fused (no keyword evidence), on the scale of every other hybrid query's."""
    lists: dict[str, _List] = {}
    threshold = opts.score_threshold
    if threshold is not None:  # the store's float arithmetic may differ in the last digit
        threshold -= abs(threshold) * 1e-6 + 1e-9
    if opts.mode in ("dense", "hybrid"):
        assert vector is not None
        alone = threshold if opts.mode == "dense" else None
        lists["dense"] = _List(Ranking(DENSE_VECTOR, vector, 1, threshold=alone))
    if sparse:
        keyword_alone = opts.mode == "keyword" and threshold is not None
        alone = threshold * keyword_max if keyword_alone and threshold is not None else None
        lists["keyword"] = _List(Ranking(SPARSE_VECTOR, sparse, 1, threshold=alone))
    elif opts.mode == "hybrid":
        lists["keyword"] = _List(Ranking(SPARSE_VECTOR, SparseVector((), ()), 1), exhausted=True)
    return lists


def _keyword_max(
    collection: str, sparse: SparseVector, flt: Filter | None
) -> Generator[_Step, Any, float]:
    """The BM25 score of a chunk holding every term of ``sparse`` at saturation.

    ``(k1 + 1) * sum(idf(t))`` over the query's distinct terms, with the IDF the store itself
    applies: one batched request asks for each term's best point and its keyword vector, and
    ``idf = score / weight``. Under the search's store filter ``flt``: a term that no point
    the search may return holds counts nothing, so that the words of another tenant's rows do
    not move a tenant's scores (the IDF itself is the store's, over the whole collection).
    1.0 when no term occurs (the keyword list is empty then).
    """
    rankings = tuple(
        Ranking(SPARSE_VECTOR, SparseVector((term,), (1.0,)), 1, with_vector=True)
        for term in sparse.indices
    )
    found = yield _Query(collection, SearchRequest(rankings, filter=flt, payload=()))
    idf = 0.0
    for term, hits in zip(sparse.indices, found, strict=True):
        if not hits or hits[0].sparse is None:
            continue
        weights = dict(zip(hits[0].sparse.indices, hits[0].sparse.values, strict=True))
        weight = weights.get(term)
        if weight:
            idf += hits[0].score / weight
    return (keywords.K1 + 1) * idf if idf > 0 else 1.0


def _annotate(ranked: list[Candidate], keyword_max: float, fused: bool) -> None:
    """Add each candidate's ``keyword_share`` (and, fused, its ``fused`` score) to its scores."""
    for cand in ranked:
        scores = cand.scores
        assert isinstance(scores, dict)
        if "keyword" in scores:
            scores["keyword_share"] = scores["keyword"] / keyword_max
        if fused:
            scores["fused"] = cand.score


def _coverage(embedder: Any, query: str) -> float:
    """How much of ``query`` the embedder's model reads (1.0 when it cannot say)."""
    measure = getattr(embedder, "coverage", None)
    if measure is None:
        return 1.0
    value = measure(query)
    return 1.0 if value is None else float(value)


def _embedded(embedder: Any, steps: Sequence[_Embed]) -> list[tuple[Any, float | None]]:
    """Each of ``steps`` (queries of one embedder) carried out: its query's vector (the
    queries that want one embedded in one call) and its coverage, where it asked."""
    wanted = [step.text for step in steps if step.vector]
    vectors = iter(encode_queries(embedder, wanted) if wanted else ())
    return [
        (
            next(vectors) if step.vector else None,
            _coverage(embedder, step.text) if step.coverage else None,
        )
        for step in steps
    ]


def _scored(
    cand: Candidate, text: str, binding: ColumnBinding, current: dict[str, dict[str, list[Chunk]]]
) -> ScoredChunk | None:
    """The chunk a candidate names, cut from the row's current text.

    A text that differs from the one indexed (the row changed and its sync is pending, or the
    session holds an older copy) may hold the chunk elsewhere: the point's digest finds it
    among the chunks the chunker cuts from the loaded text (:func:`_chunks_by_digest`, looked
    up once per row and search into ``current``), at its offsets there. Otherwise the passage
    at the indexed offsets is marked :attr:`ScoredChunk.stale` (``None`` if they do not fit:
    the candidate is skipped). A point without a digest is only checked against the text's
    length.
    """
    p = cand.payload
    fits = p.end_offset <= len(text)
    piece = text[p.start_offset : p.end_offset] if fits else ""
    stale = bool(p.chunk_hash) and (not fits or text_hash(piece) != p.chunk_hash)
    if stale:
        if p.pk not in current:
            current[p.pk] = _chunks_by_digest(binding, text)
        same = current[p.pk].get(p.chunk_hash)
        if same:  # (a text repeated in the row: the one nearest to where it was)
            moved = min(same, key=lambda c: abs(c.start_offset - p.start_offset))
            # with the metadata of where it is now (a copy of its own)
            chunk = replace(moved, metadata=dict(moved.metadata))
            return ScoredChunk(chunk, cand.score, cand.scores)
    if not fits:
        return None
    chunk = Chunk(
        text=piece,
        index=p.chunk_index,
        start_offset=p.start_offset,
        end_offset=p.end_offset,
        total_chunks=p.total_chunks,
        metadata=PointPayload.meta_of(cand.hit.payload),  # a copy of its own
    )
    return ScoredChunk(chunk, cand.score, cand.scores, stale)


def _chunks_by_digest(binding: ColumnBinding, text: str) -> dict[str, list[Chunk]]:
    """The chunks ``binding``'s chunker cuts from ``text``, by their text's digest (none if it
    fails on it: the search goes on without them). Not fitted to the model's window, which
    would load the model for a keyword search: a piece of a split chunk is not found again.
    Kept for the last :data:`_RELOCATED_MAX` texts, across searches: a row whose sync waits
    (a dead-lettered one, an old copy in a long session) is cut once, not at every search."""
    chunker = binding.chunker
    key = (id(chunker), text_hash(text))
    with _relocated_lock:
        known = _relocated.get(key)
        if known is not None and known[0] is chunker:
            _relocated.move_to_end(key)
            return known[1]
    found: dict[str, list[Chunk]] = {}
    try:
        chunks = chunker.chunk(text)
    except Exception:  # a custom chunker's own failure is the sync's to report
        chunks = []
    for chunk in chunks:
        if text[chunk.start_offset : chunk.end_offset] == chunk.text:  # (exact ones only)
            found.setdefault(text_hash(chunk.text), []).append(chunk)
    with _relocated_lock:
        _relocated[key] = (chunker, found)
        while len(_relocated) > _RELOCATED_MAX:
            _relocated.popitem(last=False)
    return found


_RELOCATED_MAX = 64
_relocated: OrderedDict[tuple[int, str], tuple[Any, dict[str, list[Chunk]]]] = OrderedDict()
"""The chunks of texts that differed from their index, most recent last (the chunker is kept
with them: an id is only unique while its object lives)."""
_relocated_lock = threading.Lock()


def _redundant(chunk: Chunk, chosen: list[Chunk]) -> bool:
    """Whether ``chunk`` overlaps one of ``chosen`` (same row) by more than half its length."""
    size = chunk.end_offset - chunk.start_offset
    for other in chosen:
        overlap = min(chunk.end_offset, other.end_offset) - max(
            chunk.start_offset, other.start_offset
        )
        if overlap > 0 and 2 * overlap > size:
            return True
    return False


@dataclass(slots=True)
class _Rows:
    """Rows loaded for a search so far, and the keys SQL (or ``where=``) rejected."""

    loaded: dict[str, Any] = field(default_factory=dict)
    rejected: set[str] = field(default_factory=set)
    wave: int = 8


def _load_wave(
    rows: _Rows,
    tier: list[Candidate],
    at: int,
    model: type[Any],
    col: SemanticColumn,
    where: Any,
) -> Generator[_Step, Any, None]:
    """Load the next unknown rows of ``tier`` from position ``at`` (a growing wave).

    Only objects whose mapper writes ``col``'s table count: a concrete-inheritance base loads
    from the union of its tables, where a subclass's row may hold the same key."""
    mapper = col.mapper
    table = col.column.table
    batch: list[str] = []
    for cand in tier[at:]:
        pk = cand.payload.pk
        if pk not in rows.loaded and pk not in rows.rejected and pk not in batch:
            batch.append(pk)
            if len(batch) >= rows.wave:
                break
    found = yield _Load(*_row_query(model, mapper, batch, where))
    for obj in found:
        if table in inspect(obj).mapper.tables:
            rows.loaded[instance_key(mapper, obj)] = obj
    rows.rejected.update(pk for pk in batch if pk not in rows.loaded)
    rows.wave = min(rows.wave * 2, 500)


def _store_filter(
    binding: ColumnBinding, where: Any, untrusted: frozenset[str]
) -> tuple[Filter | None, str]:
    """``where=`` compiled for the store (see :mod:`semantic_orm.filtering`), or why not."""
    flt, why = compile_where(where, binding.fields, lambda f: f.name not in untrusted)
    if where is not None:
        log.debug(
            "semantic_orm: %s search: where= %s",
            binding.label,
            "filtered inside the vector store" if flt is not None else f"filtered in SQL ({why})",
        )
    return flt, why


def _warn_scan(binding: ColumnBinding, why: str, scanned: int, returned: int) -> None:
    """Warn when a where= that ran in SQL only read far more rows than it returned."""
    if scanned < SCAN_WARNING_ROWS or scanned < 20 * max(returned, 1):
        return
    warnings.warn(
        FilterFallbackWarning(
            f"{binding.label}: a search with where= loaded {scanned:,} candidate rows from SQL "
            f"to return {returned}, because {why}. Declare the columns it filters on in "
            "SemanticText(filter_by=...) so that the vector store applies the filter itself."
        ),
        stacklevel=4,
    )


def _steps(
    binding: ColumnBinding,
    model: type[Any],
    query: str,
    opts: _Options,
    untrusted: Callable[[], frozenset[str]] = frozenset,
    hints: dict[str, int] | None = None,
) -> Generator[_Step, Any, list[SearchHit[Any]]]:
    """The whole search as a sequence of steps (embed, query the store, load rows).

    ``hints`` maps a collection to the searches left before a one-list search by row tries a
    shallow first read again (see :func:`_page_closed`); it only chooses how deep to read.
    """
    if hints is None:
        hints = {}
    col = binding.column
    flt, why = _store_filter(binding, opts.where, untrusted())
    read = binding.normalizer(query)  # what the embedder and the keyword analyser see
    vector: npt.NDArray[np.float32] | None = None
    coverage: float | None = None
    if opts.mode != "keyword":
        given = opts.query_vector is not None
        if given:
            vector = _checked_vector(opts.query_vector, binding)
        if not given or opts.mode == "hybrid":  # (a fused search weighs by coverage)
            embedded, coverage = yield _Embed(
                binding, read, vector=not given, coverage=opts.mode == "hybrid"
            )
            if not given:
                vector = embedded
    sparse = binding.analyzer.query_vector(read) if opts.mode != "dense" else None
    flt_typed = _typed(flt, opts)
    keyword_max = (
        (yield from _keyword_max(binding.collection, sparse, flt_typed)) if sparse else 1.0
    )
    lists = _rankings(vector, sparse, keyword_max, opts)
    fusion: Fusion | None = None
    if len(lists) > 1:
        measured = 1.0 if coverage is None else coverage
        fusion = (opts.fusion or DEFAULT_FUSION).for_query(measured, keyword_max)
    scale = keyword_max if opts.mode == "keyword" else 1.0
    threshold = opts.score_threshold
    want = opts.offset + opts.limit
    by_row = opts.group_by == "row"
    rows = _Rows(wave=max(8, want))
    hits: list[SearchHit[Any]] = []
    row_tier: dict[str, int] = {}  # a row's chunks are those of the tier it first ranks in
    row_chunks: dict[str, list[ScoredChunk]] = {}
    chosen: dict[str, list[Chunk]] = {}
    current: dict[str, dict[str, list[Chunk]]] = {}  # changed rows' chunks now, by digest
    seen: set[str] = set()
    # fused lists need one fixed window for a stable order; one list is totally ordered at any
    # depth, so it is read about as deep as the page needs (a row may need a few chunks), and
    # deeper only when the page is not full: each point read costs its payload's read
    depth = opts.candidates if fusion is not None else (2 * want + 2 if by_row else want + 2)
    # one list by row: tier 0 is read to the page's depth first, and the rest of it only when
    # a row of the page may still gain chunks there (see _page_closed)
    hint = hints if fusion is None and by_row and want < depth else None
    tier = 0
    stop = False
    while lists and not stop and len(hits) < want and len(row_tier) < want:
        lo, hi = tier * depth, (tier + 1) * depth
        if fusion is not None and threshold is not None and tier > 0:
            # each list's last score so far bounds every score further down it
            tops = {n: lst.hits[lo - 1].score for n, lst in lists.items() if len(lst.hits) >= lo}
            if fusion.bound(lo, tops) < threshold:
                break  # no point this deep can reach the threshold
        shallow = hint is not None and tier == 0 and hint.get(binding.collection, 0) <= 0
        if hint is not None and tier == 0 and not shallow:
            hint[binding.collection] -= 1
        start = lo
        for cut in (want, hi) if shallow else (hi,):
            yield from _fetch(lists, binding.collection, cut, flt_typed)
            if all(lst.exhausted and len(lst.hits) <= start for lst in lists.values()):
                stop = True
                break
            ranked = fuse_tier(
                {n: lst.hits[start:cut] for n, lst in lists.items()},
                start,
                fusion,
                seen,
                tier,
                scale,
            )
            _annotate(ranked, keyword_max, fusion is not None)
            if threshold is not None:
                ranked = [c for c in ranked if c.score >= threshold]
                if not ranked and fusion is None:
                    stop = True  # one list, best first: nothing further down passes either
                    break
            for at, cand in enumerate(ranked):
                pk = cand.payload.pk
                decided = len(row_tier) >= want if by_row else len(hits) >= want
                if decided and (not by_row or pk not in row_tier):
                    continue  # only chunks of rows already decided matter now
                if pk not in rows.loaded and pk not in rows.rejected:
                    yield from _load_wave(rows, ranked, at, model, col, opts.where)
                obj = rows.loaded.get(pk)
                if obj is None:
                    continue
                scored = _scored(cand, _text(obj, col), binding, current)
                if scored is None:
                    continue
                if by_row:
                    if pk not in row_tier:
                        row_tier[pk] = tier
                        row_chunks[pk] = []
                    if (
                        row_tier[pk] == tier
                        and len(row_chunks[pk]) < opts.chunks_per_row
                        and (
                            opts.dedupe is None
                            or not _same_unit(
                                scored.chunk, [c.chunk for c in row_chunks[pk]], opts.dedupe
                            )
                        )
                    ):
                        row_chunks[pk].append(scored)
                elif not _redundant(scored.chunk, chosen.setdefault(pk, [])) and not _same_unit(
                    scored.chunk, chosen[pk], opts.dedupe
                ):
                    chosen[pk].append(scored.chunk)
                    hits.append(SearchHit(obj, scored.score, (scored,), _text(obj, col)))
            start = cut
            if cut < hi and hint is not None:
                if _page_closed(row_chunks, want, opts.chunks_per_row):
                    break  # the rest of the tier cannot change the page
                if not all(lst.exhausted for lst in lists.values()):
                    hint[binding.collection] = _SHALLOW_PAUSE  # a second read: go deep at once
        tier += 1
    if by_row:
        for pk in list(row_tier)[:want]:
            best = row_chunks[pk]
            obj = rows.loaded[pk]
            hits.append(SearchHit(obj, best[0].score, tuple(best), _text(obj, col)))
    if opts.where is not None and flt is None:
        _warn_scan(binding, why, len(rows.loaded) + len(rows.rejected), len(hits))
    return hits[opts.offset : want]


_SHALLOW_PAUSE = 16
"""Searches of a collection that read tier 0 whole after a shallow read left its page open."""
_hints: weakref.WeakKeyDictionary[Any, dict[str, int]] = weakref.WeakKeyDictionary()


def _hints_for(store: Any) -> dict[str, int]:
    """The shallow-read hints of ``store``'s collections (see :func:`_steps`)."""
    try:
        return _hints.setdefault(store, {})
    except TypeError:  # not weak-referenceable: no memory between searches
        return {}


def _page_closed(row_chunks: Mapping[str, list[ScoredChunk]], want: int, per_row: int) -> bool:
    """Whether the page's rows can gain no chunk deeper in their tier.

    Each of the ``want`` rows of the page holds as many chunks as ``hit.chunks`` keeps, or all
    of its chunks: its point's payload says the row has only that one. Then the rest of the
    tier holds only chunks of rows past the page, which the page does not take.
    """
    if len(row_chunks) < want:
        return False
    return all(len(c) >= per_row or c[0].chunk.total_chunks == 1 for c in row_chunks.values())


def _row_query(
    model: type[Any], mapper: Mapper[Any], keys: list[str], where: Any
) -> tuple[Any, Mapping[str, Any]]:
    stmt, params = select_rows(model, mapper, keys)
    if where is not None:
        stmt = stmt.where(where)
    return stmt, params


def _checked_vector(value: Any, binding: ColumnBinding) -> npt.NDArray[np.float32]:
    embedder = binding.embedder
    try:
        vector = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"semantic_search query_vector for {binding.label} must be numbers: {exc}"
        ) from None
    if vector.shape != (embedder.dimension,):
        raise ConfigurationError(
            f"semantic_search query_vector for {binding.label} must have shape "
            f"({embedder.dimension},) (model {embedder.name!r}), got {vector.shape}"
        )
    if not np.isfinite(vector).all():
        raise ConfigurationError(
            f"semantic_search query_vector for {binding.label} holds NaN or infinite values"
        )
    return vector


def _text(obj: Any, col: SemanticColumn) -> str:
    return getattr(obj, col.key) or ""


class _Search:
    """One search's steps, run by :func:`semantic_search` or :func:`asemantic_search`."""

    def __init__(
        self, session: Any, model: type[Any], query: str, options: Mapping[str, Any]
    ) -> None:
        opts = _Options.read(options)
        if not isinstance(query, str) or not query.strip():
            raise ConfigurationError(
                f"semantic_search query must be a non-empty str, got {query!r}"
            )
        col = pick_column(inspect(model), opts.column)
        idx = opts.index or index_for(session)
        if idx is None:
            raise ConfigurationError(
                "no SemanticIndex is installed on this session: call "
                "index.install(your_sessionmaker) or pass index=..."
            )
        self.index = idx
        idx.reach_session(session, col)
        self.binding = idx.binding_for(col)
        _check_structure(opts, self.binding)
        self.model = model
        self.query = query
        self.started = time.perf_counter()
        binding = self.binding
        if opts.fusion is None and opts.mode == "hybrid":  # only hybrid mode fuses
            opts = dataclasses.replace(opts, fusion=idx.fusion)
        self._steps = _steps(
            binding,
            model,
            query,
            opts,
            lambda: idx.bindings.untrusted(binding),
            _hints_for(idx.store),
        )
        self.hits: list[SearchHit[Any]] = []

    def advance(self, result: Any) -> _Step | None:
        """The next step, given the previous one's result (``None``: the hits are ready)."""
        try:
            return self._steps.send(result)
        except StopIteration as done:
            self.hits = done.value
            if signals.searched.receivers:
                signals.searched.send(
                    self.model,
                    column=self.binding.column.key,
                    query=self.query,
                    hits=self.hits,
                    seconds=time.perf_counter() - self.started,
                )
            return None


# -- several models at once ---------------------------------------------------------------------


def _many_plan(models: Sequence[type[Any]], options: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each model's own options for a search over ``models`` (``where=``/``column=`` may map
    a model to its value)."""
    if not models or not all(isinstance(m, type) for m in models):
        raise ConfigurationError(
            f"semantic_search takes a mapped class or a list of them, got {models!r}"
        )
    if len(set(models)) != len(models):
        raise ConfigurationError("semantic_search got the same model twice")
    if options.get("query_vector") is not None:
        raise ConfigurationError(
            "semantic_search over several models embeds the query with each column's model: "
            "query_vector= is for one model"
        )
    for name in ("where", "column"):
        value = options.get(name)
        stray = [k for k in value if k not in models] if isinstance(value, Mapping) else []
        if stray:
            raise ConfigurationError(
                f"semantic_search {name}= names {', '.join(_model_name(k) for k in stray)}, not "
                f"among the models searched ({', '.join(m.__name__ for m in models)})"
            )
    plans = []
    for model in models:
        own = dict(options)
        for name in ("where", "column"):
            value = own.get(name)
            if isinstance(value, Mapping):
                own[name] = value.get(model)
            elif value is not None and name == "where":
                raise ConfigurationError(
                    "semantic_search over several models takes where={Model: criteria, ...}"
                )
        plans.append(own)
    return plans


def _model_name(key: Any) -> str:
    return key.__name__ if isinstance(key, type) else repr(key)


def _many_key(hit: SearchHit[Any], position: int) -> tuple[float, int, tuple[int, float, str], int]:
    pk = instance_key(inspect(type(hit.obj)), hit.obj)
    return (-hit.score, position, pk_order(pk), hit.chunk.index)


def _many_merge(found: list[list[SearchHit[Any]]], opts: _Options) -> list[SearchHit[Any]]:
    """One ranking of several models' hits, with the single-model semantics of ``opts.mode``.

    Every mode's score is on one fixed scale (cosine, keyword share, or their weighted sum), so
    each model's own ranking merges by score; ties go to the model listed first.
    """
    want = opts.offset + opts.limit
    merged = sorted(
        ((hit, i) for i, hits in enumerate(found) for hit in hits),
        key=lambda pair: _many_key(*pair),
    )
    return [hit for hit, _ in merged][opts.offset : want]


def _search_many(
    session: Any, models: Sequence[type[Any]], query: str, options: Mapping[str, Any]
) -> list[SearchHit[Any]]:
    plans = _many_plan(models, options)
    opts = _Options.read({k: v for k, v in options.items() if k not in ("where", "column")})
    page = {"offset": 0, "limit": opts.offset + opts.limit}
    found = [
        semantic_search(session, model, query, **{**plan, **page})
        for model, plan in zip(models, plans, strict=True)
    ]
    return _many_merge(found, opts)


async def _asearch_many(
    session: Any, models: Sequence[type[Any]], query: str, options: Mapping[str, Any]
) -> list[SearchHit[Any]]:
    plans = _many_plan(models, options)
    opts = _Options.read({k: v for k, v in options.items() if k not in ("where", "column")})
    page = {"offset": 0, "limit": opts.offset + opts.limit}
    found = [
        await asemantic_search(session, model, query, **{**plan, **page})
        for model, plan in zip(models, plans, strict=True)
    ]
    return _many_merge(found, opts)


# -- rerank: broad then fine ----------------------------------------------------------------------
# A layer around the whole search: it reads the first-stage hits through semantic_search itself
# and only reorders them, so it does not depend on how they were ranked.


@dataclass(frozen=True, slots=True)
class _Rerank:
    """The rerank stage of one search: which first-stage hits to read, and how to reorder."""

    reranker: Reranker
    window: int
    offset: int
    limit: int

    def pages(self) -> list[dict[str, Any]]:
        """The first-stage searches to run (their hits concatenate)."""
        end = self.offset + self.limit
        if self.offset >= self.window:  # a page past the window: first-stage order as it is
            return [{"offset": self.offset, "limit": self.limit, "rerank": False}]
        if max(self.window, end) <= MAX_LIMIT:
            return [{"offset": 0, "limit": max(self.window, end), "rerank": False}]
        return [
            {"offset": 0, "limit": self.window, "rerank": False},
            {"offset": self.window, "limit": end - self.window, "rerank": False},
        ]

    def passages(self, found: list[SearchHit[Any]]) -> list[str]:
        """The texts to score: every chunk of each hit in the window."""
        if self.offset >= self.window:
            return []
        return [scored.chunk.text for hit in found[: self.window] for scored in hit.chunks]

    def apply(self, found: list[SearchHit[Any]], scores: list[float]) -> list[SearchHit[Any]]:
        """The page: the window by rerank score (ties in first-stage order), then the rest."""
        if self.offset >= self.window:
            return found
        head: list[tuple[float, int, SearchHit[Any]]] = []
        at = 0
        for position, hit in enumerate(found[: self.window]):
            own = scores[at : at + len(hit.chunks)]
            at += len(hit.chunks)
            best = max(own)
            # the chunk the reranker preferred comes first: it is hit.chunk and hit.highlight()
            chunks = tuple(
                c
                for _, _, c in sorted(
                    zip((-x for x in own), range(len(own)), hit.chunks, strict=True)
                )
            )
            head.append((-best, position, replace(hit, chunks=chunks, rerank_score=best)))
        head.sort(key=lambda item: item[:2])
        ranked = [hit for _, _, hit in head] + found[self.window :]
        return ranked[self.offset : self.offset + self.limit]

    def run(
        self, query: str, search: Callable[[dict[str, Any]], list[SearchHit[Any]]]
    ) -> list[SearchHit[Any]]:
        """Run the first stage with ``search`` (extra options in), rerank, cut the page."""
        found = [hit for extra in self.pages() for hit in search(extra)]
        return self.apply(found, rerank_scores(self.reranker, query, self.passages(found)))

    async def arun(
        self, query: str, search: Callable[[dict[str, Any]], Awaitable[list[SearchHit[Any]]]]
    ) -> list[SearchHit[Any]]:
        """:meth:`run` with an async first stage; the reranker runs in a worker thread."""
        found: list[SearchHit[Any]] = []
        for extra in self.pages():
            found.extend(await search(extra))
        passages = self.passages(found)
        scores = await asyncio.to_thread(rerank_scores, self.reranker, query, passages)
        return self.apply(found, scores)


def _rerank_stage(session: Any, options: Mapping[str, Any]) -> _Rerank | None:
    """The rerank stage ``options`` ask for (``rerank=``, else the index's), or ``None``."""
    window = options.get("rerank_window", DEFAULT_RERANK_WINDOW)
    _integer("rerank_window", window, 1, MAX_RERANK_WINDOW)
    reranker = options.get("rerank")
    if reranker is False:
        return None
    if reranker is None:
        reranker = getattr(options.get("index") or index_for(session), "reranker", None)
        if reranker is None:
            return None
    if isinstance(reranker, bool) or not isinstance(reranker, Reranker):
        raise ConfigurationError(
            "semantic_search rerank must be a Reranker (a name and score(query, passages)), "
            f"False or None, got {reranker!r}"
        )
    defaults = _Options()
    offset, limit = options.get("offset", defaults.offset), options.get("limit", defaults.limit)
    _integer("offset", offset, 0, MAX_OFFSET)
    _integer("limit", limit, 1, MAX_LIMIT)
    return _Rerank(reranker, window, offset, limit)


@overload
def semantic_search(
    session: AnySession, model: type[T], query: str, **options: Unpack[SearchOptions]
) -> list[SearchHit[T]]: ...


@overload
def semantic_search(
    session: AnySession,
    model: Sequence[type[Any]],
    query: str,
    **options: Unpack[SearchOptions],
) -> list[SearchHit[Any]]: ...


def semantic_search(
    session: AnySession,
    model: type[T] | Sequence[type[Any]],
    query: str,
    **options: Unpack[SearchOptions],
) -> list[SearchHit[T]]:
    """Find rows of ``model`` whose semantic column matches ``query`` by meaning.

    Args:
        session: The session to load rows with; its installed index answers the search.
        model: The mapped class to search, or several (``[Article, Note]``): one ranking
            over all of them (``hit.model`` tells which); then ``where=`` and ``column=`` may
            map each model to its own value (``where={Article: Article.lang == "fr"}``).
        query: Natural-language query.
        **options: See :class:`SearchOptions` (``limit``, ``offset``, ``where``, ``mode``...).

    With a reranker (``rerank=``, or the index's ``reranker=``), the first ``rerank_window``
    hits of the search are reordered by the reranker's score of each hit's chunks (in row mode,
    each of ``hit.chunks``; the row takes its best, and that chunk becomes ``hit.chunk``); ties
    keep the first-stage order, and hits past the window follow in first-stage order. The
    window does not move with ``offset``/``limit``, so pages concatenate to one search.
    ``hit.rerank_score`` is the reranker's score (``None`` past the window); ``hit.score`` and
    ``hit.scores`` stay the first-stage scores, and ``score_threshold`` filters the first
    stage, before reranking. Over several models the merged list is reranked.

    Returns:
        Hits, best first.

    Raises:
        ConfigurationError: No index is installed, the column is ambiguous or unknown, an
            option is invalid (the message names it), or ``session`` is an ``AsyncSession``.
        EmbeddingError: The reranker failed (the message names it).
    """
    if is_async_session(session):  # its SQL would be coroutines
        raise ConfigurationError(
            "semantic_search() takes a Session; for an AsyncSession await "
            "Model.asemantic_search(session, ...) (or semantic_orm.asemantic_search)"
        )
    rerank = _rerank_stage(session, options)
    if rerank is not None:
        return rerank.run(
            query, lambda extra: semantic_search(session, model, query, **{**options, **extra})
        )
    if not isinstance(model, type):
        return _search_many(session, list(model), query, options)
    run = _Search(session, model, query, options)
    _guarded(run.index, _check, run)  # refuses another model's vectors
    step = run.advance(None)
    while step is not None:
        if isinstance(step, _Embed):
            result: Any = _embedded(step.binding.embedder, [step])[0]
        elif isinstance(step, _Query):
            result = _guarded(run.index, run.index.store.query, step.collection, step.request)
        else:
            result = session.scalars(step.statement, step.params).all()
        step = run.advance(result)
    return run.hits


class _QueryBatcher:
    """Embeds the queries of concurrent async searches together, in one call per batch (and
    measures, in the same worker thread, how much of each a hybrid search's model reads).

    While one batch is being embedded in a worker thread, new queries wait for the next one: 32
    concurrent searches cost a few model calls, not 32 calls fighting for the same cores.
    """

    def __init__(self, embedder: Any) -> None:
        self.embedder = embedder
        self.pending: list[tuple[_Embed, asyncio.Future[tuple[Any, float | None]]]] = []
        self.running = False
        self._task: asyncio.Task[None] | None = None

    async def embed(self, step: _Embed) -> tuple[Any, float | None]:
        """``step`` carried out with those of the other searches waiting (see :func:`_embedded`)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[Any, float | None]] = loop.create_future()
        self.pending.append((step, future))
        if not self.running:
            self.running = True
            self._task = loop.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        try:
            while self.pending:
                batch, self.pending = self.pending, []
                try:
                    steps = [step for step, _ in batch]
                    results = await asyncio.to_thread(_embedded, self.embedder, steps)
                except Exception as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        finally:
            self.running = False
            self._task = None  # (it holds the loop: the loop's entry would never go)
            _forget(self)


_batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, _QueryBatcher]] = (
    weakref.WeakKeyDictionary()
)


def _forget(batcher: _QueryBatcher) -> None:
    """Drop an idle batcher (an index closed meanwhile keeps no embedder alive through it)."""
    loop = asyncio.get_running_loop()
    mine = _batchers.get(loop, {})
    if mine.get(id(batcher.embedder)) is batcher:
        del mine[id(batcher.embedder)]
    if not mine:
        _batchers.pop(loop, None)


def _batcher(embedder: Any) -> _QueryBatcher:
    """This event loop's query batcher for ``embedder``."""
    mine = _batchers.setdefault(asyncio.get_running_loop(), {})
    found = mine.get(id(embedder))
    if found is None or found.embedder is not embedder:
        found = mine[id(embedder)] = _QueryBatcher(embedder)
    return found


@overload
async def asemantic_search(
    session: Any, model: type[T], query: str, **options: Unpack[SearchOptions]
) -> list[SearchHit[T]]: ...


@overload
async def asemantic_search(
    session: Any, model: Sequence[type[Any]], query: str, **options: Unpack[SearchOptions]
) -> list[SearchHit[Any]]: ...


async def asemantic_search(
    session: Any, model: type[T] | Sequence[type[Any]], query: str, **options: Unpack[SearchOptions]
) -> list[SearchHit[Any]]:
    """:func:`semantic_search` for an ``AsyncSession``, without blocking the event loop.

    The query embedding (and the model's reading of the query, which weighs a hybrid search's
    lists) and the vector-store calls run in worker threads (the queries of concurrent
    searches are embedded together, in one call); rows are loaded through ``await
    session.scalars(...)``. Takes the same options, and several models like
    :func:`semantic_search`; a reranker runs in a worker thread too.
    """
    rerank = _rerank_stage(session, options)
    if rerank is not None:
        return await rerank.arun(
            query, lambda extra: asemantic_search(session, model, query, **{**options, **extra})
        )
    if not isinstance(model, type):
        return await _asearch_many(session, list(model), query, options)
    await _identify(session, model)
    run = _Search(session, model, query, options)
    await asyncio.to_thread(_guarded, run.index, _check, run)
    step = run.advance(None)
    while step is not None:
        if isinstance(step, _Embed):
            result: Any = await _batcher(step.binding.embedder).embed(step)
        elif isinstance(step, _Query):
            store = run.index.store
            result = await asyncio.to_thread(
                _guarded, run.index, store.query, step.collection, step.request
            )
        else:
            result = (await session.scalars(step.statement, step.params)).all()
        step = run.advance(result)
    return run.hits


def _check(run: _Search) -> None:
    """Check the searched column's collection (it refuses another model's vectors)."""
    run.index.bindings.check(run.binding, for_search=True)


def _guarded(index: SemanticIndex, call: Callable[..., R], *args: Any) -> R:
    """Call the store for a search (``call(*args)``: its query, or the collection's check),
    failing at once while the store is known to be unreachable
    (:class:`~semantic_orm.applying.Outage`, shared with the index's syncs): while it is down,
    one search at a time tries it, the others fail fast."""
    outage = index.applier.outage
    refused = outage.admit_search()
    if refused is not None:
        raise refused
    error: BaseException | None = None
    try:
        return call(*args)
    except BaseException as exc:
        error = exc
        raise
    finally:
        outage.ended(error, search=True)


async def _identify(session: Any, model: type[Any]) -> None:
    """Have the database an async session reads ``model`` from tell what it is, through the
    session's connection, before the search claims it: an async engine cannot be asked
    outside the session (:func:`~semantic_orm.schemas.database_of`)."""
    sync = getattr(session, "sync_session", None)
    if sync is None:
        return
    mapper = inspect(model)
    try:
        bind = sync.get_bind(mapper=mapper)
    except Exception:  # no bind: loading the rows fails on its own
        return
    if not identified(bind.engine):
        await session.run_sync(
            lambda s: database_of(s.connection(bind_arguments={"mapper": mapper}))
        )


class SemanticSearchMixin:
    """Adds ``Model.semantic_search(session, query, ...)`` (and ``asemantic_search``)."""

    @classmethod
    def semantic_search(
        cls, session: AnySession, query: str, **options: Unpack[SearchOptions]
    ) -> list[SearchHit[Self]]:
        """Find rows of this model by meaning; see :func:`semantic_search`."""
        return semantic_search(session, cls, query, **options)

    @classmethod
    async def asemantic_search(
        cls, session: Any, query: str, **options: Unpack[SearchOptions]
    ) -> list[SearchHit[Self]]:
        """Find rows of this model by meaning with an ``AsyncSession``; see
        :func:`asemantic_search`."""
        return await asemantic_search(session, cls, query, **options)
