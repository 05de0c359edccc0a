"""Ranking on its own: a total order, tie-complete fetches, and tiers that a deeper search
only extends (no store, no database)."""

from __future__ import annotations

from semantic_orm.ranking import ReciprocalRankFusion, complete, fuse_tier, order, pk_order
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
    assert rrf.bound(2) == 2 / 62
