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

Fusion (:class:`Fusion`) combines the lists of a tier; :class:`ReciprocalRankFusion` scores a
point ``sum(weight / (k + rank))`` over the lists it appears in (ranks from 0, counted over the
whole list). With one list (dense or keyword mode) the list's own score is kept.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .stores.base import PointPayload, StoreHit

__all__ = [
    "Candidate",
    "Fusion",
    "ReciprocalRankFusion",
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
    score: float
    scores: Mapping[str, float] = field(default_factory=dict)
    """Raw score per ranking it appeared in (``"dense"`` cosine, ``"keyword"`` BM25)."""
    tier: int = 0


class Fusion(Protocol):
    """Combines the ranked lists of one tier into scores (see :func:`fuse_tier`)."""

    @property
    def name(self) -> str:
        """The rule's name, recorded with the collection."""
        ...

    def score(self, ranks: Mapping[str, int], scores: Mapping[str, float]) -> float:
        """A point's fused score from its rank (from 0) and raw score in each list it is in."""
        ...

    def bound(self, rank: int) -> float:
        """The best fused score any point whose ranks are all at least ``rank`` can get."""
        ...


@dataclass(frozen=True, slots=True)
class ReciprocalRankFusion:
    """Reciprocal rank fusion: ``sum(weights[list] / (k + rank))``."""

    k: int = 60
    weights: Mapping[str, float] = field(default_factory=dict)
    name: str = "rrf"

    def score(self, ranks: Mapping[str, int], scores: Mapping[str, float]) -> float:
        """``sum(weight / (k + rank))`` over the lists the point is in."""
        return sum(self.weights.get(name, 1.0) / (self.k + r) for name, r in ranks.items())

    def bound(self, rank: int) -> float:
        """Every list contributing at ``rank``."""
        return sum(self.weights.get(n, 1.0) for n in ("dense", "keyword")) / (self.k + rank)


def fuse_tier(
    lists: Mapping[str, Sequence[StoreHit]],
    start: int,
    fusion: Fusion | None,
    seen: set[str],
    tier: int,
) -> list[Candidate]:
    """The candidates of one tier, best first.

    Args:
        lists: Each ranking's points of this tier, in the total order.
        start: The rank of each list's first point here (``tier * depth``).
        fusion: How to combine two or more lists (``None`` with a single list: its score).
        seen: Point ids emitted by earlier tiers (skipped; updated).
        tier: This tier's number.
    """
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
    out: list[Candidate] = []
    for pid, hit in hits.items():
        if fusion is None:
            score = hit.score
        else:
            score = fusion.score(ranks[pid], raw[pid])
        out.append(Candidate(hit, PointPayload.from_dict(hit.payload), score, dict(raw[pid]), tier))
    out.sort(key=lambda c: (-c.score, pk_order(c.payload.pk), c.payload.chunk_index, c.hit.id))
    seen.update(hits)
    return out
