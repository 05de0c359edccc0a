"""Ranking: one deterministic order of chunks from a store's ranked lists, tier by tier.

A search asks the store for one or two ranked lists (dense cosine, BM25 keyword). This module
turns them into a single order that does not depend on how deep the store was asked, so that
``offset=`` pages concatenate exactly to one longer search:

* **total order.** Every list is sorted by score, then by row key (numbers numerically), chunk
  index and point id: equal scores always come out in the same order (:func:`order`);
* **complete ties.** A list fetched to depth ``n`` counts only as far as its last *whole* tie
  group: the store is asked for one more point, and if it ties with the last one the fetch goes
  deeper (:func:`complete`), since which tied points a store returns at a cut is arbitrary;
* **tiers.** Lists are consumed in tiers of ``depth`` ranks: tier ``t`` fuses ranks
  ``[t * depth, (t + 1) * depth)`` of each list (points already emitted are skipped) and emits
  them best first, before tier ``t + 1`` is looked at. A deeper search only adds tiers; it never
  reorders earlier ones.

Fusion (:class:`Fusion`) combines the lists of a tier. The default, :class:`ScoreFusion`, adds
the dense cosine and the keyword score on fixed scales, weighting the dense half by how much of
the query the model can read; :class:`ReciprocalRankFusion` scores a point
``sum(weight / (k + rank))`` over the lists it appears in (ranks from 0, counted over the whole
list). With one list (dense or keyword mode) the list's own score is kept (keyword scores as
the matched share of the query).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Protocol

from .exc import ConfigurationError
from .stores.base import PointPayload, StoreHit

__all__ = [
    "DEFAULT_FUSION",
    "Candidate",
    "Fusion",
    "ReciprocalRankFusion",
    "ScoreFusion",
    "complete",
    "fuse_tier",
    "order",
    "pk_order",
]


def pk_order(pk: str) -> tuple[int, float, str]:
    """Sort key of a row key: numeric keys in numeric order, others in text order."""
    if pk.isascii() and pk.isdigit():  # the common case, without a JSON parse
        return (0, float(pk), pk)
    try:
        value = json.loads(pk)
    except ValueError:
        value = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, float(value), pk)
    return (1, 0.0, pk)


def _key(hit: StoreHit) -> tuple[float, tuple[int, float, str], int, str]:
    payload = hit.payload
    pk = str(payload.get(PointPayload.PK_KEY, ""))
    return (-hit.score, pk_order(pk), int(payload.get(PointPayload.CHUNK_INDEX_KEY, 0)), hit.id)


def order(hits: Sequence[StoreHit]) -> list[StoreHit]:
    """``hits`` in the total order: score, then row key, chunk index and point id."""
    if all(a.score > b.score for a, b in itertools.pairwise(hits)):
        return list(hits)  # no ties, best first (as stores return them): already in order
    return sorted(hits, key=_key)


def complete(hits: Sequence[StoreHit], depth: int) -> tuple[list[StoreHit], bool]:
    """The tie-complete prefix of a fetch of ``depth + 1`` points, in the total order.

    Returns:
        ``(prefix, exhausted)``: ``exhausted`` when the store had no more than ``depth`` points;
        otherwise ``prefix`` holds the first ``depth`` points, and is empty when the last of
        them ties with the point after it (fetch deeper).
    """
    ranked = order(hits)
    if len(ranked) <= depth:
        return ranked, True
    if math.isclose(ranked[depth].score, ranked[depth - 1].score, rel_tol=0.0, abs_tol=0.0):
        return [], False
    return ranked[:depth], False


@dataclass(frozen=True, slots=True)
class Candidate:
    """One chunk in the final order, with its score and the score of each ranking."""

    hit: StoreHit
    payload: PointPayload
    """The hit's payload, read without its chunk metadata (:meth:`PointPayload.meta_of` of
    ``hit.payload`` gives it: a search reads it of the candidates it returns)."""
    score: float
    scores: Mapping[str, float] = field(default_factory=dict)
    """Raw score per ranking it appeared in (``"dense"`` cosine, ``"keyword"`` BM25)."""
    tier: int = 0


def _payload(hit: StoreHit) -> PointPayload:
    """A candidate's payload: what ranks it and locates its chunk, not its metadata."""
    return PointPayload.from_dict(hit.payload, meta=False)


class Fusion(Protocol):
    """Combines the ranked lists of one tier into scores (see :func:`fuse_tier`).

    A search calls :meth:`for_query` once with what it knows about the query, then scores
    every point of a tier with the result.
    """

    @property
    def name(self) -> str:
        """The rule's name, recorded with the collection."""
        ...

    def for_query(self, coverage: float, keyword_max: float) -> Fusion:
        """This rule for one query.

        Args:
            coverage: How much of the query the embedding model can read, 0 to 1 (see
                ``SentenceTransformerEmbedder.coverage``; 1 when the embedder cannot say).
            keyword_max: The BM25 score of a chunk holding every query term at saturation
                (``(k1 + 1) * sum(idf)`` over the query's distinct terms).
        """
        ...

    def score(
        self, ranks: Mapping[str, int], scores: Mapping[str, float], floors: Mapping[str, float]
    ) -> float:
        """A point's fused score from its rank (from 0) and raw score in each list it is in.

        ``floors`` holds each list's lowest score in the tier (for a point a list missed).
        """
        ...

    def bound(self, rank: int, tops: Mapping[str, float]) -> float:
        """The best fused score any point whose ranks are all at least ``rank`` can get;
        ``tops`` holds each list's score at ``rank`` (a list that ended is absent)."""
        ...

    def describe(self) -> dict[str, Any]:
        """The rule and its parameters, as recorded with a collection."""
        ...


@dataclass(frozen=True, slots=True)
class ScoreFusion:
    """The default: a weighted sum of the two scores, each on a fixed scale.

    ``fused = (w * cosine + (1 - a) * share) / (w + 1 - a)`` with ``w = a * coverage ** p``:

    * ``cosine`` is the dense score (a chunk the dense list missed gets the tier's lowest);
    * ``share`` is ``BM25 / keyword_max``, the part of the query's IDF-weighted keyword evidence
      the chunk holds, in ``[0, 1)`` (0 when the keyword list missed it);
    * ``coverage`` is the share of the query the embedding model's tokenizer reads as real word
      pieces: about 0.97 for English with all-MiniLM-L6-v2, under 0.1 for Chinese, Thai or
      Arabic, which that model cannot read. Squared, it switches the dense half off exactly where
      its ranking is noise, and keeps it where it helps.

    The score lies in ``[-1, 1)`` and means the same for every query, so it can be thresholded
    and compared across queries and collections. Measured on SQuAD, SciFact, XQuAD in 12
    languages and DRCD (README, "Hybrid ranking"): at or above the better of dense-only and
    keyword-only on every set, where reciprocal rank fusion fell below keyword-only on 13 of 15.

    Args:
        dense_weight: ``a``, the dense half's weight for a query the model reads fully.
        coverage_power: ``p``; 0 ignores coverage (a model that reads every script).
    """

    dense_weight: float = 0.4
    coverage_power: float = 2.0
    coverage: float = 1.0
    keyword_max: float = 1.0
    name: str = "score"

    def __post_init__(self) -> None:
        if not 0.0 <= self.dense_weight <= 1.0:
            raise ConfigurationError(
                f"ScoreFusion dense_weight must be between 0 and 1, got {self.dense_weight!r}"
            )
        if self.coverage_power < 0:
            raise ConfigurationError(
                f"ScoreFusion coverage_power must be >= 0, got {self.coverage_power!r}"
            )

    def for_query(self, coverage: float, keyword_max: float) -> ScoreFusion:
        """This rule with the query's coverage and keyword scale."""
        return replace(
            self,
            coverage=min(max(coverage, 0.0), 1.0),
            keyword_max=keyword_max if keyword_max > 0 else 1.0,
        )

    @property
    def weights(self) -> tuple[float, float]:
        """The dense and keyword weights for this query, summing to 1."""
        dense = self.dense_weight * self.coverage**self.coverage_power
        keyword = 1.0 - self.dense_weight
        total = dense + keyword
        if total <= 0:  # dense_weight 1 on a query the model cannot read: keyword decides
            return 0.0, 1.0
        return dense / total, keyword / total

    def combine(self, cosine: float, keyword: float) -> float:
        """The fused score of a raw cosine and a raw BM25 score."""
        dense, kw = self.weights
        return dense * cosine + kw * (keyword / self.keyword_max)

    def score(
        self, ranks: Mapping[str, int], scores: Mapping[str, float], floors: Mapping[str, float]
    ) -> float:
        """The weighted sum, with the tier's lowest cosine for a point dense search missed."""
        cosine = scores.get("dense", floors.get("dense", -1.0))
        return self.combine(cosine, scores.get("keyword", 0.0))

    def bound(self, rank: int, tops: Mapping[str, float]) -> float:
        """Both lists' scores at ``rank``: no point further down can do better."""
        return self.combine(tops.get("dense", -1.0), tops.get("keyword", 0.0))

    def describe(self) -> dict[str, Any]:
        """``{"rule": "score", "dense_weight": a, "coverage_power": p}``."""
        return {
            "rule": self.name,
            "dense_weight": self.dense_weight,
            "coverage_power": self.coverage_power,
        }


@dataclass(frozen=True, slots=True)
class ReciprocalRankFusion:
    """Reciprocal rank fusion: ``sum(weights[list] / (k + rank))``.

    Scores only ranks, so a list that is noise (a model reading a language it was not trained
    on) pulls a good list down as much as a good one lifts it; its scores (0.016 to 0.033 with
    ``k=60``) cannot be thresholded across queries. Kept for comparison and for users who
    want it: ``semantic_search(..., fusion=ReciprocalRankFusion())``.
    """

    k: int = 60
    weights: Mapping[str, float] = field(default_factory=dict)
    name: str = "rrf"

    def for_query(self, coverage: float, keyword_max: float) -> ReciprocalRankFusion:
        """The same rule (ranks need nothing about the query)."""
        return self

    def score(
        self, ranks: Mapping[str, int], scores: Mapping[str, float], floors: Mapping[str, float]
    ) -> float:
        """``sum(weight / (k + rank))`` over the lists the point is in."""
        return sum(self.weights.get(name, 1.0) / (self.k + r) for name, r in ranks.items())

    def bound(self, rank: int, tops: Mapping[str, float]) -> float:
        """Every list contributing at ``rank``."""
        return sum(self.weights.get(n, 1.0) for n in ("dense", "keyword")) / (self.k + rank)

    def describe(self) -> dict[str, Any]:
        """``{"rule": "rrf", "k": k}`` (and the weights, when set)."""
        out: dict[str, Any] = {"rule": self.name, "k": self.k}
        if self.weights:
            out["weights"] = dict(self.weights)
        return out


DEFAULT_FUSION: Final[Fusion] = ScoreFusion()
"""The hybrid rule a search uses unless told otherwise."""


def fuse_tier(
    lists: Mapping[str, Sequence[StoreHit]],
    start: int,
    fusion: Fusion | None,
    seen: set[str],
    tier: int,
    scale: float = 1.0,
) -> list[Candidate]:
    """The candidates of one tier, best first.

    Args:
        lists: Each ranking's points of this tier, in the total order.
        start: The rank of each list's first point here (``tier * depth``).
        fusion: How to combine two or more lists (``None`` with a single list: its score,
            divided by ``scale``).
        seen: Point ids emitted by earlier tiers (skipped; updated).
        tier: This tier's number.
        scale: What a single list's scores are divided by (keyword mode: the query's
            ``keyword_max``, so that ``hit.score`` is the matched share of the query).
    """
    if fusion is None and len(lists) == 1:  # one list, already in the total order
        ((name, points),) = lists.items()
        fresh = [hit for hit in points if hit.id not in seen]
        seen.update(hit.id for hit in fresh)
        return [
            Candidate(hit, _payload(hit), hit.score / scale, {name: hit.score}, tier)
            for hit in fresh
        ]
    ranks: dict[str, dict[str, int]] = {}
    raw: dict[str, dict[str, float]] = {}
    hits: dict[str, StoreHit] = {}
    for name, points in lists.items():
        for offset, hit in enumerate(points):
            if hit.id in seen:
                continue
            hits.setdefault(hit.id, hit)
            ranks.setdefault(hit.id, {})[name] = start + offset
            raw.setdefault(hit.id, {})[name] = hit.score
    floors = {name: points[-1].score for name, points in lists.items() if points}
    out: list[Candidate] = []
    for pid, hit in hits.items():
        if fusion is None:
            score = hit.score / scale
        else:
            score = fusion.score(ranks[pid], raw[pid], floors)
        out.append(Candidate(hit, _payload(hit), score, dict(raw[pid]), tier))
    out.sort(key=lambda c: (-c.score, pk_order(c.payload.pk), c.payload.chunk_index, c.hit.id))
    seen.update(hits)
    return out
