"""Measure retrieval quality on your own data: questions with known answers, scored by metric.

Write a *gold set*, one JSON object per line, naming for each question the row that answers it
and, optionally, the character span of the answer inside the row's semantic text::

    {"question": "Which form declares VAT?", "pk": 42, "span": [1180, 1232]}
    {"question": "Who founded the company?", "pk": [7, "fr"]}     # composite primary key

then run ``semantic-orm eval myapp.search:index myapp.models:Article gold.jsonl --k 5`` or
:func:`evaluate` from Python. Each question is searched through the public
``semantic_search`` API, so the numbers describe exactly what your application gets.

Metrics (all in ``[0, 1]``, higher is better):

* **Recall@k by row**: the answering row is among the top ``k`` rows (``group_by="row"``).
* **Recall@k by span** (questions with a ``span``): one of the top ``k`` passages
  (``group_by="chunk"``) is from the answering row and its offsets contain the whole span. With
  ``lenient=True`` a passage that overlaps or touches the span also counts.
* **MRR@k**: the mean of ``1 / rank`` of the first relevant result in the top ``k`` (0 if none).
  The ranking judged is the passage ranking for questions with a span, the row ranking otherwise.
* **nDCG@10**: with one relevant answer per question, ``1 / log2(1 + rank)`` of the first
  relevant result in the top 10 (0 if none), averaged; on the same ranking as MRR.

Questions whose first relevant result is not in the top ``k`` are listed as failures with what
was retrieved instead.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any, Unpack

from sqlalchemy import inspect
from sqlalchemy.orm import Session

from .embedding import encode_queries
from .exc import ConfigurationError
from .index import index_for
from .mapping import instance_key, row_key, select_rows, typed_key_values
from .search import DEFAULT_MODE, SearchHit, SearchMode, SearchOptions, pick_column, semantic_search

__all__ = [
    "EvalReport",
    "GoldItem",
    "QuestionResult",
    "evaluate",
    "load_gold",
]

log = logging.getLogger("semantic_orm")

_NDCG_DEPTH = 10
_ENCODE_BATCH = 256
_LOAD_BATCH = 500
"""Gold rows loaded per statement (:func:`_check_gold`)."""


@dataclass(frozen=True, slots=True)
class GoldItem:
    """One question and where its answer is: a row (``pk``) and optionally a character span."""

    question: str
    pk: Any
    span: tuple[int, int] | None = None

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> GoldItem:
        """Parse ``{"question": ..., "pk": ..., "span": [start, end]}``.

        Raises:
            ConfigurationError: A field is missing or malformed.
        """
        question = raw.get("question")
        if not isinstance(question, str) or not question.strip():
            raise ConfigurationError(f"gold item needs a non-empty 'question': {raw!r}")
        if "pk" not in raw:
            raise ConfigurationError(f"gold item needs a 'pk': {raw!r}")
        span = raw.get("span")
        if span is not None:
            if (
                not isinstance(span, (list, tuple))
                or len(span) != 2
                or not all(isinstance(v, int) for v in span)
                or not 0 <= span[0] <= span[1]
            ):
                raise ConfigurationError(
                    f"gold 'span' must be [start, end] with start <= end: {raw!r}"
                )
            span = (int(span[0]), int(span[1]))
        return cls(question, raw["pk"], span)

    @property
    def key(self) -> str:
        """The row's key as search results name it (see :func:`~semantic_orm.mapping.row_key`)."""
        values = self.pk if isinstance(self.pk, (list, tuple)) else [self.pk]
        return row_key(values)


@dataclass(frozen=True, slots=True)
class Retrieved:
    """One retrieved result, as shown in failure listings."""

    pk: str
    start: int
    end: int
    score: float
    text: str


@dataclass(slots=True)
class QuestionResult:
    """How one question fared."""

    question: str
    pk: str
    span: tuple[int, int] | None
    row_rank: int | None
    """1-based rank of the answering row in the row ranking (``None``: not in the top k)."""
    span_rank: int | None
    """1-based rank of the first passage holding the span (``None``: none in the top k)."""
    rank: int | None
    """The rank MRR uses: ``span_rank`` when there is a span, else ``row_rank``."""
    rank_at_10: int | None
    """The same rank, within the top 10, for nDCG@10."""
    retrieved: list[Retrieved] = field(default_factory=list)
    """What the judged ranking returned (top k)."""

    @property
    def failed(self) -> bool:
        """Whether the relevant result was missing from the top k."""
        return self.rank is None


@dataclass(slots=True)
class EvalReport:
    """Metrics over a gold set, and each question's result."""

    k: int
    mode: str
    lenient: bool
    questions: int
    recall_row: float
    recall_span: float | None
    """``None`` when no question has a span."""
    span_questions: int
    mrr: float
    ndcg_at_10: float
    results: list[QuestionResult]

    @property
    def failures(self) -> list[QuestionResult]:
        """Questions whose answer was not in the top k."""
        return [r for r in self.results if r.failed]

    def as_dict(self) -> dict[str, Any]:
        """The metrics and failures as JSON-ready data."""
        return {
            "k": self.k,
            "mode": self.mode,
            "lenient": self.lenient,
            "questions": self.questions,
            "span_questions": self.span_questions,
            f"recall_row_at_{self.k}": self.recall_row,
            f"recall_span_at_{self.k}": self.recall_span,
            f"mrr_at_{self.k}": self.mrr,
            "ndcg_at_10": self.ndcg_at_10,
            "failures": [asdict(r) for r in self.failures],
        }

    def table(self, max_failures: int = 20) -> str:
        """A terminal table of the metrics, then the failed questions and what came instead."""
        k = self.k
        span = "-" if self.recall_span is None else f"{self.recall_span:.3f}"
        lines = [
            f"{'metric':24} {'value':>8}",
            f"{'questions':24} {self.questions:>8}",
            f"{f'Recall@{k} (row)':24} {self.recall_row:>8.3f}",
            f"{f'Recall@{k} (span)':24} {span:>8}"
            + (" (lenient)" if self.lenient and self.recall_span is not None else ""),
            f"{f'MRR@{k}':24} {self.mrr:>8.3f}",
            f"{'nDCG@10':24} {self.ndcg_at_10:>8.3f}",
            f"mode: {self.mode}",
        ]
        failures = self.failures
        if failures:
            lines.append(f"\n{len(failures)} failed questions (answer not in the top {k}):")
            for r in failures[:max_failures]:
                where = f"{r.pk}" + ("" if r.span is None else f" [{r.span[0]}:{r.span[1]}]")
                lines.append(f"- {r.question!r}  expected {where}")
                for got in r.retrieved[:3]:
                    snippet = " ".join(got.text.split())[:70]
                    lines.append(f"    got {got.pk} [{got.start}:{got.end}] {snippet!r}")
            if len(failures) > max_failures:
                lines.append(f"... and {len(failures) - max_failures} more")
        return "\n".join(lines)


def load_gold(path: str | PathLike[str]) -> list[GoldItem]:
    """Read a JSON-lines gold file (blank lines are skipped).

    Raises:
        ConfigurationError: The file cannot be read, or a line is not a valid gold item.
    """
    try:
        text = Path(path).read_text("utf-8")
    except OSError as exc:
        raise ConfigurationError(f"cannot read gold file {path}: {exc}") from exc
    items = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigurationError(f"{path}:{number}: not JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise ConfigurationError(f"{path}:{number}: expected a JSON object")
        items.append(GoldItem.from_dict(raw))
    return items


def _check_gold(
    session: Session, model: type[Any], column: str | None, items: list[GoldItem]
) -> dict[str, str]:
    """The row key search results give each gold item's row (a gold ``pk`` of ``"1"`` names
    the row of integer key 1); warn of questions no ranking can get right: their row is not in
    the table (a gold set made for another database), or their span ends past its text."""
    mapper = inspect(model)
    attribute = pick_column(mapper, column).key
    ends: dict[str, int] = {}
    for item in items:
        ends[item.key] = max(ends.get(item.key, 0), item.span[1] if item.span else 0)
    canonical = {}
    for key in ends:
        values = typed_key_values(mapper, key)
        if values is not None:
            canonical[key] = row_key(values)
    rows: dict[str, Any] = {}
    wanted = sorted(set(canonical.values()))
    for start in range(0, len(wanted), _LOAD_BATCH):
        stmt, params = select_rows(model, mapper, wanted[start : start + _LOAD_BATCH])
        rows.update((instance_key(mapper, obj), obj) for obj in session.scalars(stmt, params))
    keys = {key: row for key, row in canonical.items() if row in rows}
    missing = [key for key in ends if key not in keys]
    outside = [
        key for key, row in keys.items() if ends[key] > len(getattr(rows[row], attribute) or "")
    ]
    for found, what in (
        (missing, f"rows {model.__name__} does not have"),
        (outside, "a span past the end of their row's text"),
    ):
        if found:
            log.warning(
                "semantic_orm: evaluate: the gold questions of %d row(s) name %s (e.g. pk %s); "
                "they count as misses",
                len(found),
                what,
                found[0],
            )
    return keys


def _hit_key(hit: SearchHit[Any]) -> str:
    return instance_key(inspect(type(hit.obj)), hit.obj)


def _covers(start: int, end: int, span: tuple[int, int], lenient: bool) -> bool:
    if lenient:
        return start <= span[1] and span[0] <= end  # overlapping or adjacent
    return start <= span[0] and span[1] <= end


def evaluate(
    session: Session,
    model: type[Any],
    gold: Iterable[GoldItem | Mapping[str, Any]] | str | PathLike[str],
    *,
    k: int = 5,
    lenient: bool = False,
    **options: Unpack[SearchOptions],
) -> EvalReport:
    """Search every gold question and score the rankings.

    Args:
        session: Session to search with (its installed index, unless ``index`` is given).
        model: The mapped class the gold ``pk`` values belong to.
        gold: :class:`GoldItem` values or ``{"question", "pk", "span"}`` mappings, or the
            path of a JSON-lines file of them (:func:`load_gold`). Questions naming a row the
            table does not have, or a span past the end of its text, count as misses, with a
            warning.
        k: Cut-off for Recall@k and MRR@k.
        lenient: Count a passage overlapping or adjacent to the span as a span hit.
        **options: Search options, as for :func:`~semantic_orm.search.semantic_search`
            (``mode``, ``column``, ``where``, ``index``...); ``limit``, ``offset``,
            ``group_by`` and ``query_vector`` are the evaluation's own.

    Returns:
        The metrics and per-question results.

    Raises:
        ConfigurationError: ``k`` is not positive, the gold set is empty or malformed, or an
            option is one the evaluation sets itself.
    """
    own = sorted({"limit", "offset", "group_by", "query_vector"} & set(options))
    if own:
        raise ConfigurationError(f"evaluate sets {', '.join(own)} itself")
    mode: SearchMode = options.get("mode") or DEFAULT_MODE
    index = options.get("index")
    column = options.get("column")
    if k <= 0:
        raise ConfigurationError(f"evaluate k must be > 0, got {k}")
    if isinstance(gold, (str, PathLike)):
        gold = load_gold(gold)
    items = [g if isinstance(g, GoldItem) else GoldItem.from_dict(g) for g in gold]
    if not items:
        raise ConfigurationError("evaluate needs at least one gold question")
    keys = _check_gold(
        session, model, column.get(model) if isinstance(column, Mapping) else column, items
    )
    depth = max(k, _NDCG_DEPTH)
    vectors: list[Any] = [None] * len(items)
    if mode != "keyword":
        # encode the questions in batches, not one at a time (two searches share each vector)
        idx = index or index_for(session)
        if idx is not None:
            col = pick_column(inspect(model), column if not isinstance(column, Mapping) else None)
            binding = idx.binding_for(col)
            embedder, read = binding.embedder, binding.normalizer
            for start in range(0, len(items), _ENCODE_BATCH):
                batch = items[start : start + _ENCODE_BATCH]
                vectors[start : start + len(batch)] = list(
                    encode_queries(embedder, [read(g.question) for g in batch])
                )
    results: list[QuestionResult] = []
    for item, vector in zip(items, vectors, strict=True):
        key = keys.get(item.key, item.key)
        search: SearchOptions = {**options, "limit": depth, "query_vector": vector}
        rows = semantic_search(session, model, item.question, **search)
        row_keys = [_hit_key(h) for h in rows]
        row_rank = row_keys.index(key) + 1 if key in row_keys else None
        retrieved = [
            Retrieved(hk, h.chunk.start_offset, h.chunk.end_offset, h.score, h.chunk.text)
            for hk, h in zip(row_keys, rows, strict=True)
        ]
        span_rank = None
        if item.span is not None:
            by_chunk: SearchOptions = {**search, "group_by": "chunk"}
            passages = semantic_search(session, model, item.question, **by_chunk)
            retrieved = []
            for position, hit in enumerate(passages, 1):
                hk = _hit_key(hit)
                c = hit.chunk
                retrieved.append(Retrieved(hk, c.start_offset, c.end_offset, hit.score, c.text))
                hit_span = _covers(c.start_offset, c.end_offset, item.span, lenient)
                if span_rank is None and hk == key and hit_span:
                    span_rank = position
        rank = span_rank if item.span is not None else row_rank
        results.append(
            QuestionResult(
                item.question,
                key,
                item.span,
                row_rank if row_rank is not None and row_rank <= k else None,
                span_rank if span_rank is not None and span_rank <= k else None,
                rank if rank is not None and rank <= k else None,
                rank if rank is not None and rank <= _NDCG_DEPTH else None,
                retrieved[:k],
            )
        )
    n = len(results)
    spans = [r for r in results if r.span is not None]
    return EvalReport(
        k=k,
        mode=mode,
        lenient=lenient,
        questions=n,
        recall_row=sum(r.row_rank is not None for r in results) / n,
        recall_span=sum(r.span_rank is not None for r in spans) / len(spans) if spans else None,
        span_questions=len(spans),
        mrr=sum(1 / r.rank for r in results if r.rank is not None) / n,
        ndcg_at_10=sum(1 / math.log2(1 + r.rank_at_10) for r in results if r.rank_at_10) / n,
        results=results,
    )
