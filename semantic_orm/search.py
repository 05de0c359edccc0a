"""Semantic search over mapped classes: ``Model.semantic_search(session, "query")``.

A search reads as a straight line:

1. **resolve** the column's binding (:mod:`semantic_orm.binding`) and check its collection;
2. **plan** the query: embed it with the column's embedder (unless ``query_vector=`` is given),
   compute its keyword vector, and ask the store for the rankings of the mode
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

Three ranking modes (``mode=``):

* ``"dense"``: cosine similarity of embeddings; ``hit.score`` is the cosine. Finds paraphrases.
* ``"keyword"``: BM25 over the words of each chunk (:mod:`semantic_orm.keywords`); finds exact
  codes, names and rare terms that embeddings blur. ``hit.score`` is the BM25 score.
* ``"hybrid"`` (the default, :data:`DEFAULT_MODE`): both rankings fused
  (:mod:`semantic_orm.ranking`); ``hit.scores`` has each ranking's own score.

``score_threshold`` drops hits whose ``hit.score`` is below it, in every mode.

Ranking is deterministic: equal scores are ordered by primary key, then chunk index, and
``offset=`` pages concatenate exactly to one search with the combined limit.

``semantic_search(session, [Article, Note], ...)`` searches several models at once: their
rankings merge by score (dense, keyword) or are fused after merging (hybrid), and
``hit.model`` says which model each hit is from.

:func:`asemantic_search` (and ``await Model.asemantic_search(session, ...)``) is the same search
for an ``AsyncSession``: the embedding and the store calls run in worker threads, the SQL through
the session, so the event loop is never blocked.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import warnings
import weakref
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Self, TypedDict, TypeVar, Unpack, overload

import numpy as np
import numpy.typing as npt
from sqlalchemy import ColumnElement, inspect, select
from sqlalchemy.orm import Mapper, Session, scoped_session

from . import keywords, signals
from .binding import ColumnBinding
from .chunking import Chunk
from .embedding import encode_queries
from .exc import ConfigurationError, FilterFallbackWarning
from .filtering import compile_where
from .index import SemanticIndex, index_for
from .mapping import SemanticColumn, pk_in, row_key, semantic_columns
from .ranking import Candidate, ReciprocalRankFusion, complete, fuse_tier, order, pk_order
from .stores.base import DENSE_VECTOR, SPARSE_VECTOR, Filter, Ranking, SearchRequest, StoreHit

__all__ = [
    "DEFAULT_MODE",
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
SCAN_WARNING_ROWS = 1_000
"""Rows a where= in SQL may load before :class:`FilterFallbackWarning` says so."""
log = logging.getLogger("semantic_orm")

T = TypeVar("T")
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
        score_threshold: Drop hits whose score is below this (cosine in dense mode, BM25 in
            keyword mode, the fused score in hybrid mode).
        chunks_per_row: In row mode, how many of a row's best chunks ``hit.chunks`` keeps.
        candidates: Ranks of each list fused per tier (the fusion window, default 100).
        index: The index to use, instead of the one installed on the session.
        query_vector: The column's embedding of the query, when it is already computed (e.g.
            many queries encoded in one batch); ``query`` still feeds keyword search.
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
    index: SemanticIndex | None
    query_vector: Sequence[float] | npt.NDArray[np.float32] | None


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
    index: SemanticIndex | None = None
    query_vector: Any = None

    @classmethod
    def read(cls, options: Mapping[str, Any]) -> _Options:
        unknown = sorted(set(options) - set(cls.__dataclass_fields__))
        if unknown:
            raise ConfigurationError(
                f"semantic_search got unknown option(s) {', '.join(unknown)}; known: "
                f"{', '.join(cls.__dataclass_fields__)}"
            )
        made = cls(**options)
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
    """Raw score per ranking (``"dense"`` cosine, ``"keyword"`` BM25) it appeared in."""


@dataclass(frozen=True, slots=True)
class SearchHit(Generic[T]):
    """One search result: the row, its score, and the chunk(s) that matched, best first."""

    obj: T
    score: float
    chunks: tuple[ScoredChunk, ...]
    text: str
    """The row's full semantic text, which the chunks' offsets index into."""

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
        """The best chunk's score in each ranking (``"dense"``, ``"keyword"``)."""
        return self.chunks[0].scores

    def highlight(self, before: str = "**", after: str = "**", context: int = 80) -> str:
        """The best chunk marked with ``before``/``after``, with ``context`` characters around.

        The passage comes from the row's text at the chunk's offsets, so this is exactly what
        was embedded.
        """
        chunk = self.chunk
        source = self.text
        lead = source[max(0, chunk.start_offset - context) : chunk.start_offset]
        tail = source[chunk.end_offset : chunk.end_offset + context]
        ellipsis_lead = "…" if chunk.start_offset - context > 0 else ""
        ellipsis_tail = "…" if chunk.end_offset + context < len(source) else ""
        return f"{ellipsis_lead}{lead}{before}{chunk.text}{after}{tail}{ellipsis_tail}"


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
    binding: ColumnBinding
    text: str


@dataclass(frozen=True, slots=True)
class _Query:
    collection: str
    request: SearchRequest


@dataclass(frozen=True, slots=True)
class _Load:
    statement: Any


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
        found = yield _Query(collection, SearchRequest(rankings, flt))
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
    vector: npt.NDArray[np.float32] | None, query: str, opts: _Options
) -> dict[str, _List]:
    """The ranked lists the mode needs (a keyword query without terms has none)."""
    lists: dict[str, _List] = {}
    threshold = opts.score_threshold
    if threshold is not None:  # the store's float arithmetic may differ in the last digit
        threshold -= abs(threshold) * 1e-6 + 1e-9
    if opts.mode in ("dense", "hybrid"):
        assert vector is not None
        alone = threshold if opts.mode == "dense" else None
        lists["dense"] = _List(Ranking(DENSE_VECTOR, vector, 1, threshold=alone))
    if opts.mode in ("keyword", "hybrid"):
        sparse = keywords.query_vector(query)
        if sparse:
            alone = threshold if opts.mode == "keyword" else None
            lists["keyword"] = _List(Ranking(SPARSE_VECTOR, sparse, 1, threshold=alone))
    return lists


def _scored(cand: Candidate, text: str) -> ScoredChunk | None:
    """The chunk a candidate names, cut from the row's current text; ``None`` if stale."""
    p = cand.payload
    if p.end_offset > len(text):
        return None  # the row changed after this point was written; its sync is pending
    piece = text[p.start_offset : p.end_offset]
    chunk = Chunk(
        text=piece,
        index=p.chunk_index,
        start_offset=p.start_offset,
        end_offset=p.end_offset,
        total_chunks=p.total_chunks,
        metadata=dict(p.meta),
    )
    return ScoredChunk(chunk, cand.score, dict(cand.scores))


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
    rows: _Rows, tier: list[Candidate], at: int, model: type[Any], mapper: Mapper[Any], where: Any
) -> Generator[_Step, Any, None]:
    """Load the next unknown rows of ``tier`` from position ``at`` (a growing wave)."""
    batch: list[str] = []
    for cand in tier[at:]:
        pk = cand.payload.pk
        if pk not in rows.loaded and pk not in rows.rejected and pk not in batch:
            batch.append(pk)
            if len(batch) >= rows.wave:
                break
    found = yield _Load(_row_query(model, mapper, batch, where))
    for obj in found:
        rows.loaded[row_key(mapper.primary_key_from_instance(obj))] = obj
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
) -> Generator[_Step, Any, list[SearchHit[Any]]]:
    """The whole search as a sequence of steps (embed, query the store, load rows)."""
    col = binding.column
    mapper = col.mapper
    flt, why = _store_filter(binding, opts.where, untrusted())
    vector: npt.NDArray[np.float32] | None = None
    if opts.mode != "keyword":
        if opts.query_vector is not None:
            vector = _checked_vector(opts.query_vector, binding)
        else:
            vector = yield _Embed(binding, query)
    lists = _rankings(vector, query, opts)
    fusion = ReciprocalRankFusion() if len(lists) > 1 else None
    threshold = opts.score_threshold
    want = opts.offset + opts.limit
    by_row = opts.group_by == "row"
    rows = _Rows(wave=max(8, want))
    hits: list[SearchHit[Any]] = []
    row_tier: dict[str, int] = {}  # a row's chunks are those of the tier it first ranks in
    row_chunks: dict[str, list[ScoredChunk]] = {}
    chosen: dict[str, list[Chunk]] = {}
    seen: set[str] = set()
    # fused lists need one fixed window for a stable order; one list is totally ordered at any
    # depth, so it is read about as deep as the page needs (rows need a few chunks each)
    depth = opts.candidates if fusion is not None else max(10, want * (4 if by_row else 3))
    tier = 0
    while lists and len(hits) < want and len(row_tier) < want:
        lo, hi = tier * depth, (tier + 1) * depth
        if fusion is not None and threshold is not None and fusion.bound(lo) < threshold:
            break  # no point this deep can reach the threshold
        yield from _fetch(lists, binding.collection, hi, flt)
        if all(lst.exhausted and len(lst.hits) <= lo for lst in lists.values()):
            break
        ranked = fuse_tier({n: lst.hits[lo:hi] for n, lst in lists.items()}, lo, fusion, seen, tier)
        if threshold is not None:
            ranked = [c for c in ranked if c.score >= threshold]
            if not ranked and fusion is None:
                break  # one list, best first: nothing further down passes either
        for at, cand in enumerate(ranked):
            pk = cand.payload.pk
            decided = len(row_tier) >= want if by_row else len(hits) >= want
            if decided and (not by_row or pk not in row_tier):
                continue  # only chunks of rows already decided matter now
            if pk not in rows.loaded and pk not in rows.rejected:
                yield from _load_wave(rows, ranked, at, model, mapper, opts.where)
            obj = rows.loaded.get(pk)
            if obj is None:
                continue
            scored = _scored(cand, _text(obj, col))
            if scored is None:
                continue
            if by_row:
                if pk not in row_tier:
                    row_tier[pk] = tier
                    row_chunks[pk] = []
                if row_tier[pk] == tier and len(row_chunks[pk]) < opts.chunks_per_row:
                    row_chunks[pk].append(scored)
            elif not _redundant(scored.chunk, chosen.setdefault(pk, [])):
                chosen[pk].append(scored.chunk)
                hits.append(SearchHit(obj, scored.score, (scored,), _text(obj, col)))
        tier += 1
    if by_row:
        for pk in list(row_tier)[:want]:
            best = row_chunks[pk]
            obj = rows.loaded[pk]
            hits.append(SearchHit(obj, best[0].score, tuple(best), _text(obj, col)))
    if opts.where is not None and flt is None:
        _warn_scan(binding, why, len(rows.loaded) + len(rows.rejected), len(hits))
    return hits[opts.offset : want]


def _row_query(model: type[Any], mapper: Mapper[Any], keys: list[str], where: Any) -> Any:
    stmt = select(model).where(pk_in(mapper, keys))
    if where is not None:
        stmt = stmt.where(where)
    return stmt


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
        self.binding = idx.binding_for(col)
        self.model = model
        self.query = query
        self.started = time.perf_counter()
        binding = self.binding
        self._steps = _steps(binding, model, query, opts, lambda: idx.bindings.untrusted(binding))
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


def _many_key(hit: SearchHit[Any], position: int) -> tuple[float, int, tuple[int, float, str], int]:
    obj = hit.obj
    pk = row_key(inspect(type(obj)).primary_key_from_instance(obj))
    return (-hit.score, position, pk_order(pk), hit.chunk.index)


def _many_merge(
    found: list[dict[str, list[SearchHit[Any]]]], opts: _Options
) -> list[SearchHit[Any]]:
    """One ranking of several models' hits, with the single-model semantics of ``opts.mode``.

    Dense and keyword scores are per chunk, so the lists merge by score. Hybrid fuses the two
    merged lists with the same rule as one model's search (reciprocal rank fusion over each
    list's global ranks).
    """
    want = opts.offset + opts.limit
    if opts.mode != "hybrid":
        merged = sorted(
            ((hit, i) for i, lists in enumerate(found) for hit in lists[opts.mode]),
            key=lambda pair: _many_key(*pair),
        )
        return [hit for hit, _ in merged][opts.offset : want]
    ident: dict[tuple[int, str, int], SearchHit[Any]] = {}
    ranks: dict[tuple[int, str, int], dict[str, int]] = {}
    scores: dict[tuple[int, str, int], dict[str, float]] = {}
    by_row = opts.group_by == "row"
    for name in ("dense", "keyword"):
        merged = sorted(
            ((hit, i) for i, lists in enumerate(found) for hit in lists[name]),
            key=lambda pair: _many_key(*pair),
        )
        for rank, (hit, i) in enumerate(merged):
            key = (i, _many_key(hit, i)[2][2], -1 if by_row else hit.chunk.index)
            ident.setdefault(key, hit)
            ranks.setdefault(key, {})[name] = rank
            scores.setdefault(key, {})[name] = hit.score
    fusion = ReciprocalRankFusion()
    fused = []
    for key, hit in ident.items():
        score = fusion.score(ranks[key], scores[key])
        if opts.score_threshold is not None and score < opts.score_threshold:
            continue
        best = hit.chunks[0]
        top = ScoredChunk(best.chunk, score, dict(scores[key]))
        fused.append((SearchHit(hit.obj, score, (top, *hit.chunks[1:]), hit.text), key[0]))
    fused.sort(key=lambda pair: _many_key(*pair))
    return [hit for hit, _ in fused][opts.offset : want]


def _many_requests(opts: _Options) -> list[tuple[str, dict[str, Any]]]:
    """The single-model searches a search over several models runs per model."""
    want = opts.offset + opts.limit
    base = {"offset": 0, "limit": want}
    if opts.mode != "hybrid":
        return [(opts.mode, {**base, "mode": opts.mode})]
    deep = {
        "offset": 0,
        "limit": min(max(want, opts.candidates), MAX_LIMIT),
        "score_threshold": None,
    }
    return [("dense", {**deep, "mode": "dense"}), ("keyword", {**deep, "mode": "keyword"})]


def _search_many(
    session: Any, models: Sequence[type[Any]], query: str, options: Mapping[str, Any]
) -> list[SearchHit[Any]]:
    plans = _many_plan(models, options)
    opts = _Options.read({k: v for k, v in options.items() if k not in ("where", "column")})
    found = [
        {
            name: semantic_search(session, model, query, **{**plan, **extra})
            for name, extra in _many_requests(opts)
        }
        for model, plan in zip(models, plans, strict=True)
    ]
    return _many_merge(found, opts)


async def _asearch_many(
    session: Any, models: Sequence[type[Any]], query: str, options: Mapping[str, Any]
) -> list[SearchHit[Any]]:
    plans = _many_plan(models, options)
    opts = _Options.read({k: v for k, v in options.items() if k not in ("where", "column")})
    found = []
    for model, plan in zip(models, plans, strict=True):
        lists = {}
        for name, extra in _many_requests(opts):
            lists[name] = await asemantic_search(session, model, query, **{**plan, **extra})
        found.append(lists)
    return _many_merge(found, opts)


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

    Returns:
        Hits, best first.

    Raises:
        ConfigurationError: No index is installed, the column is ambiguous or unknown, or an
            option is invalid (the message names it).
    """
    if not isinstance(model, type):
        return _search_many(session, list(model), query, options)
    run = _Search(session, model, query, options)
    run.index.bindings.check(run.binding, for_search=True)  # refuses another model's vectors
    step = run.advance(None)
    while step is not None:
        if isinstance(step, _Embed):
            result: Any = encode_queries(step.binding.embedder, [step.text])[0]
        elif isinstance(step, _Query):
            result = run.index.store.query(step.collection, step.request)
        else:
            result = session.scalars(step.statement).all()
        step = run.advance(result)
    return run.hits


class _QueryBatcher:
    """Embeds the queries of concurrent async searches together, in one call per batch.

    While one batch is being embedded in a worker thread, new queries wait for the next one: 32
    concurrent searches cost a few model calls, not 32 calls fighting for the same cores.
    """

    def __init__(self, embedder: Any) -> None:
        self.embedder = embedder
        self.pending: list[tuple[str, asyncio.Future[Any]]] = []
        self.running = False
        self._task: asyncio.Task[None] | None = None

    async def embed(self, text: str) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self.pending.append((text, future))
        if not self.running:
            self.running = True
            self._task = loop.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        try:
            while self.pending:
                batch, self.pending = self.pending, []
                try:
                    texts = [t for t, _ in batch]
                    vectors = await asyncio.to_thread(encode_queries, self.embedder, texts)
                except Exception as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), vector in zip(batch, vectors, strict=True):
                    if not future.done():
                        future.set_result(vector)
        finally:
            self.running = False


_batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, _QueryBatcher]] = (
    weakref.WeakKeyDictionary()
)


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

    The query embedding and the vector-store calls run in worker threads (the queries of
    concurrent searches are embedded together, in one call); rows are loaded through ``await
    session.scalars(...)``. Takes the same options, and several models like
    :func:`semantic_search`.
    """
    if not isinstance(model, type):
        return await _asearch_many(session, list(model), query, options)
    run = _Search(session, model, query, options)
    await asyncio.to_thread(run.index.bindings.check, run.binding, for_search=True)
    step = run.advance(None)
    while step is not None:
        if isinstance(step, _Embed):
            result: Any = await _batcher(step.binding.embedder).embed(step.text)
        elif isinstance(step, _Query):
            result = await asyncio.to_thread(run.index.store.query, step.collection, step.request)
        else:
            result = (await session.scalars(step.statement)).all()
        step = run.advance(result)
    return run.hits


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
