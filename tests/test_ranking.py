"""Ranking on its own: a total order, tie-complete fetches, and tiers that a deeper search
only extends (no store, no database)."""

from __future__ import annotations

import math

import pytest

from semantic_orm.exc import ConfigurationError
from semantic_orm.ranking import (
    ReciprocalRankFusion,
    ScoreFusion,
    complete,
    fuse_tier,
    order,
    pk_order,
)
from semantic_orm.stores.base import StoreHit


def hit(pk: str, score: float, chunk: int = 0) -> StoreHit:
    return StoreHit(f"{pk}-{chunk}", score, {"pk": pk, "chunk_index": chunk})


def test_equal_scores_are_ordered_by_key_numerically_then_chunk() -> None:
    hits = [hit("10", 0.5), hit("9", 0.5), hit('"b"', 0.5), hit("9", 0.5, 1), hit("2", 0.7)]
    assert [(h.payload["pk"], h.payload["chunk_index"]) for h in order(hits)] == [
        ("2", 0), ("9", 0), ("9", 1), ("10", 0), ('"b"', 0),
    ]  # fmt: skip
    assert pk_order("9") < pk_order("10") < pk_order('"a"')


def test_a_cut_inside_a_tie_asks_for_more() -> None:
    tied = [hit(str(i), 0.5) for i in range(5)]
    assert complete(tied[:3], 2) == ([], False)  # the third ties with the second: go deeper
    prefix, exhausted = complete([hit("1", 0.9), hit("2", 0.5), hit("3", 0.4)], 2)
    assert [h.payload["pk"] for h in prefix] == ["1", "2"] and not exhausted
    assert complete(tied[:2], 2)[1]  # the store had no more


def test_tiers_fuse_ranks_over_the_whole_list_and_never_repeat_a_point() -> None:
    rrf = ReciprocalRankFusion()
    dense = [hit("a", 0.9), hit("b", 0.8)]
    keyword = [hit("b", 3.0), hit("c", 2.0)]
    seen: set[str] = set()
    first = fuse_tier({"dense": dense, "keyword": keyword}, 0, rrf, seen, 0)
    assert [c.payload.pk for c in first] == ["b", "a", "c"]
    (b,) = [c for c in first if c.payload.pk == "b"]
    assert b.score == 1 / 61 + 1 / 60 and b.scores == {"dense": 0.8, "keyword": 3.0}
    later = fuse_tier({"dense": [hit("a", 0.1), hit("d", 0.05)]}, 2, rrf, seen, 1)
    assert [c.payload.pk for c in later] == ["d"] and later[0].score == 1 / 63
    assert rrf.bound(2, {}) == 2 / 62


def test_score_fusion_is_a_fixed_scale_weighted_by_the_query_coverage() -> None:
    rule = ScoreFusion()
    read = rule.for_query(coverage=1.0, keyword_max=10.0)
    dense, keyword = read.weights
    assert math.isclose(dense, 0.4) and math.isclose(keyword, 0.6)
    # a point both lists found: the weighted sum of cosine and keyword share
    both = read.score({"dense": 0, "keyword": 0}, {"dense": 0.5, "keyword": 5.0}, {})
    assert math.isclose(both, 0.4 * 0.5 + 0.6 * 0.5)
    # one the dense list missed gets the tier's lowest cosine; keyword missing counts 0
    missed = read.score({"keyword": 3}, {"keyword": 5.0}, {"dense": 0.2})
    assert math.isclose(missed, 0.4 * 0.2 + 0.6 * 0.5)
    assert math.isclose(read.score({"dense": 1}, {"dense": 0.5}, {}), 0.4 * 0.5)
    # a query the model cannot read: keyword decides alone, on the same scale
    unread = rule.for_query(coverage=0.0, keyword_max=10.0)
    assert unread.weights == (0.0, 1.0)
    assert math.isclose(unread.score({}, {"dense": 0.99, "keyword": 2.0}, {}), 0.2)
    # the bound is what the lists' current scores could still give
    assert math.isclose(read.bound(5, {"dense": 0.3, "keyword": 1.0}), 0.4 * 0.3 + 0.6 * 0.1)
    assert read.bound(5, {}) == -0.4
    assert rule.describe() == {"rule": "score", "dense_weight": 0.4, "coverage_power": 2.0}


def test_score_fusion_ranks_a_noisy_dense_list_below_a_confident_keyword_list() -> None:
    # keyword finds "k" clearly; dense (a model that cannot read the query) ranks noise first
    dense = [hit("n1", 0.72), hit("n2", 0.71), hit("k", 0.70)]
    keyword = [hit("k", 8.0), hit("n1", 0.2)]
    rrf = fuse_tier({"dense": dense, "keyword": keyword}, 0, ReciprocalRankFusion(), set(), 0)
    assert rrf[0].payload.pk == "n1"  # rank agreement beats a confident keyword match
    rule = ScoreFusion().for_query(coverage=0.1, keyword_max=10.0)
    ranked = fuse_tier({"dense": dense, "keyword": keyword}, 0, rule, set(), 0)
    assert [c.payload.pk for c in ranked] == ["k", "n1", "n2"]
    assert ranked[0].score > 0.75 > 0.05 > ranked[1].score


def test_score_fusion_rejects_weights_out_of_range() -> None:
    with pytest.raises(ConfigurationError, match="dense_weight"):
        ScoreFusion(dense_weight=1.5)
    with pytest.raises(ConfigurationError, match="coverage_power"):
        ScoreFusion(coverage_power=-1)
